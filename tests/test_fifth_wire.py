"""A dialect added without touching a lane (#60): the legacy ``/v1/completions`` wire, written here
in a few lines (its body, its sans-io decoder, its whole-body mapping) and registered, is then
spoken by the unchanged ``llamacpp`` lane to a REAL llama-server: an answer, and a stop the
server proves (its ``cancel task`` line, the slot idle, the decoded count frozen)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.http.chunk_decoder import SSEChunks
from abstract_client.http.sse import SSEEvent
from abstract_client.http.wire import load_frame
from abstract_client.provider import Completion
from abstract_client.testing.processes import LlamaServer
from abstract_client.types import GenerationRequest, StreamChunk
from abstract_client.wires.wire import WIRES, Wire, register

from .helpers import press_when
from .test_llamacpp_real import assert_server_stopped, llama  # noqa: F401  (its server and its evidence)

pytestmark = pytest.mark.llamacpp


def _body(request: GenerationRequest, stream: bool) -> dict[str, Any]:
    last = request.messages[-1]["content"] if request.messages else ""
    body: dict[str, Any] = {"model": request.model or "default", "prompt": request.prompt or last, "stream": stream}
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    return {**body, **request.extra}


def _chunk(frame: Any) -> StreamChunk:
    choice = frame["choices"][0] if frame.get("choices") else {}
    return StreamChunk(delta=choice.get("text") or "", finish_reason=choice.get("finish_reason"), raw=frame)


class _Chunks(SSEChunks):
    def event(self, event: SSEEvent) -> list[StreamChunk]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        chunk = _chunk(load_frame(event.data))
        self.finished = self.finished or chunk.finish_reason is not None
        return [chunk]


COMPLETIONS = Wire(
    name="completions",
    path="/completions",
    families=frozenset({"v1"}),
    encode=_body,
    decoder=_Chunks,
    completion=lambda body: Completion.from_chunk(_chunk(body), raw=body),
)


@pytest.fixture
def completions_wire() -> Iterator[Wire]:
    register(COMPLETIONS)
    try:
        yield COMPLETIONS
    finally:
        del WIRES["completions"]


def test_a_registered_wire_is_spoken_by_an_unchanged_lane_and_stops(
    llama: LlamaServer,  # noqa: F811
    completions_wire: Wire,
) -> None:
    assert llama.wait_idle(10)
    with create_llm("llamacpp", "smollm2", base_url=llama.url, wire="completions", max_retries=0) as lm:
        result = lm.generate("The capital of France is", max_tokens=8, temperature=0)
        assert result.content and result.raw["object"] == "text_completion"  # the route the wire named

        before = len(llama.cancelled_tasks())
        stop = threading.Event()
        seen: list[str] = []
        press = press_when(lambda: len(seen) >= 5, stop.set)
        with pytest.raises(GenerationCancelledError) as info:
            for chunk in lm.stream("Write a very long story.", max_tokens=2000, cancel_event=stop, ignore_eos=True):
                seen.append(chunk.delta)
        press.wait()
        assert info.value.partial_text.startswith("".join(seen[:5]))
        assert_server_stopped(llama, before)


def test_a_lane_refuses_a_wire_its_server_does_not_serve(completions_wire: Wire) -> None:
    with pytest.raises(ValueError, match=r"wire must be one of .*'completions'.*not 'ollama'"):
        create_llm("llamacpp", "m", base_url="http://127.0.0.1:9", wire="ollama")
    with pytest.raises(TypeError, match="wire= is not taken"):
        create_llm("anthropic", "m", base_url="http://127.0.0.1:9", wire="completions")
