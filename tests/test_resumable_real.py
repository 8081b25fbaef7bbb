"""Resumable generations (#42) against a REAL llama-server and a real model (SmolLM2-135M).

``resumable=True`` sends ``X-Conversation-Id``: llama-server then keeps the stream's bytes, and
keeps decoding, past a disconnect. Through :class:`~tests.cutting_proxy.CuttingProxy` (a flaky
network: connections reset at random bytes) the answer must come out as one stream, equal to an
uninterrupted greedy run, chunk for chunk. A stop must be explicit — ``DELETE /v1/stream`` — and
is proven by the engine: its log's ``cancel task``, ``/slots`` idle; also when the stop is pressed
while the network is down, and when the resume deadline gives up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from abstract_client import (
    LLM,
    GenerationCancelledError,
    NotSupportedError,
    StreamChunk,
    TransportError,
    create_llm,
)
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.processes import LlamaServer

from .cutting_proxy import CuttingProxy
from .helpers import launch_llama_server, wait_until

pytestmark = pytest.mark.llamacpp

STORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a long story about a dragon."},
]
GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 7, "max_tokens": 200, "ignore_eos": True}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = launch_llama_server(tmp_path_factory, "resumable")
    yield server
    server.stop()


def lane(url: str) -> LLM:
    return create_llm("llamacpp", "smollm2", base_url=url, max_retries=0)


def text_of(chunks: list[StreamChunk]) -> str:
    return "".join(c.delta for c in chunks)


def stream_all(llm: LLM, **options: Any) -> list[StreamChunk]:
    with llm.stream(messages=STORY, **{**GREEDY, **options}) as stream:
        return list(stream)


def test_a_stream_cut_five_times_comes_out_whole(llama: LlamaServer) -> None:
    """No token lost or repeated: the text and the chunks of an uninterrupted greedy run."""
    assert llama.wait_idle(10)
    with lane(llama.url) as direct:
        reference = stream_all(direct)
    proxy = CuttingProxy(llama.port, seed=42, cuts=5)
    try:
        with lane(proxy.url) as flaky:
            chunks = stream_all(flaky, resumable=True)
    finally:
        proxy.close()
    assert len(proxy.cut_at) == 5, proxy.cut_at  # the network really failed, five times
    assert text_of(chunks) == text_of(reference) and len(text_of(chunks)) > 200
    deltas = [c.delta for c in chunks if c.delta]
    assert deltas == [c.delta for c in reference if c.delta]  # chunk for chunk
    assert chunks[-1].finish_reason == reference[-1].finish_reason


def test_a_stop_on_a_resumable_stream_cancels_the_engine(llama: LlamaServer) -> None:
    """A severed connection no longer stops it (the server keeps decoding for a resume): the
    stop's DELETE does, as fast as a sever stops a plain stream."""
    assert llama.wait_idle(10)
    before = len(llama.cancelled_tasks())
    event = threading.Event()
    with lane(llama.url) as llm:
        stream = llm.stream(messages=STORY, max_tokens=2000, ignore_eos=True, resumable=True, cancel_event=event)
        with pytest.raises(GenerationCancelledError) as info:
            for i, _ in enumerate(stream):
                if i == 5:
                    event.set()
                    stopped_at = time.monotonic()
        assert info.value.partial_text
        assert llama.wait_idle(5), "the slot kept decoding after the stop"
        idle_after = time.monotonic() - stopped_at
    assert len(llama.cancelled_tasks()) > before  # the engine's own word: cancel task
    assert idle_after < 5


def test_stops_after_a_resume_close_in_order_on_a_loaded_machine(
    llama: LlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    """#58: a stream resumed once (the proxy resets it after ~1,500 bytes), then, on the same
    client, streams stopped after 5 chunks with the ``with`` block closing at once — beside a
    process that keeps a core busy. The close raced the loop's pull of the resumed stream:
    ``aclose(): asynchronous generator is already running`` (a task's exception nobody
    retrieved), and once the slot kept decoding 3 s after the stop. Each stop: the slot idle,
    llama-server's own ``cancel task``, no such error."""
    import subprocess
    import sys

    caplog.set_level("DEBUG")
    assert llama.wait_idle(10)
    burner = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 120\nwhile time.time() < end: pass"]
    )
    proxy = CuttingProxy(llama.port, seed=3, cuts=1, cut_after=(1_500, 1_500))
    try:
        with lane(proxy.url) as llm:
            assert text_of(stream_all(llm, resumable=True))
            assert proxy.cut_at == [1_500]  # it was resumed once
            for _ in range(3):
                before = len(llama.cancelled_tasks())
                event = threading.Event()
                with pytest.raises(GenerationCancelledError):
                    with llm.stream(
                        messages=STORY, max_tokens=2000, ignore_eos=True, resumable=True, cancel_event=event
                    ) as stream:
                        for i, _ in enumerate(stream):
                            if i == 5:
                                event.set()
                assert llama.wait_idle(10), "the slot kept decoding after the stop"
                assert wait_until(lambda b=before: len(llama.cancelled_tasks()) > b, 10)
    finally:
        proxy.close()
        burner.kill()
        burner.wait(5)
    raced = [r.getMessage() for r in caplog.records if "already running" in r.getMessage() + str(r.exc_info)]
    unretrieved = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert not raced and not unretrieved, (raced, unretrieved)


def test_a_resumable_stream_left_by_a_break_cancels_the_engine(llama: LlamaServer) -> None:
    """Leaving early is no resume either: the ``with`` block's close sends the DELETE."""
    assert llama.wait_idle(10)
    before = len(llama.cancelled_tasks())
    with lane(llama.url) as llm:
        with llm.stream(messages=STORY, max_tokens=2000, ignore_eos=True, resumable=True) as stream:
            for i, _ in enumerate(stream):
                if i == 5:
                    break
        assert llama.wait_idle(5), "the slot kept decoding after the break"
    assert len(llama.cancelled_tasks()) > before


def test_a_stop_pressed_while_the_network_is_down_lands_when_it_is_back(llama: LlamaServer) -> None:
    assert llama.wait_idle(10)
    before = len(llama.cancelled_tasks())
    proxy = CuttingProxy(llama.port, seed=3, cuts=1, cut_after=(2_000, 3_000), refuse_after_cut=True)
    event = threading.Event()
    out: dict[str, Any] = {}
    try:
        with lane(proxy.url) as llm:

            def run() -> None:
                try:
                    stream_all(llm, resumable=True, cancel_event=event, max_tokens=2000)
                except BaseException as exc:
                    out["error"] = exc

            thread = threading.Thread(target=run)
            thread.start()
            assert wait_until(lambda: proxy.refused >= 2, 15)  # cut, and the resume is knocking
            cancels = llm.provider._cancels  # type: ignore[attr-defined]
            tried = cancels.attempts
            event.set()
            thread.join(10)
            assert isinstance(out.get("error"), GenerationCancelledError), out
            # the stop's DELETE was tried, and refused, before the network comes back: a second
            # try is what lands it (a single try still connecting when the network comes back,
            # from a cold loop thread on a loaded machine, could land and pass for the retry:
            # attempts counts tries that ended)
            assert wait_until(lambda: cancels.attempts > tried, 15), "the stop's DELETE was never tried"
            assert any(s.get("is_processing") for s in llama.slots())  # nobody could tell it yet
            proxy.reopen()
            assert llama.wait_idle(10), "the stop never reached the server once the network was back"
    finally:
        proxy.close()
    assert len(llama.cancelled_tasks()) > before


def test_a_drop_past_the_resume_deadline_is_a_typed_error_with_the_partial_text(llama: LlamaServer) -> None:
    assert llama.wait_idle(10)
    proxy = CuttingProxy(llama.port, seed=5, cuts=1, cut_after=(3_000, 4_000), refuse_after_cut=True)
    try:
        with lane(proxy.url) as llm:
            t0 = time.monotonic()
            with pytest.raises(TransportError, match="could not be resumed within 1 s") as info:
                stream_all(llm, resumable=True, resume_timeout=1.0, max_tokens=2000)
            assert time.monotonic() - t0 < 30
            assert info.value.partial_text
            proxy.reopen()  # the give-up is a stop too: its DELETE lands once the server is reachable
            assert llama.wait_idle(10)
    finally:
        proxy.close()


def test_resumable_is_refused_where_it_cannot_be_kept() -> None:
    with FakeOpenAIServer() as server:
        with create_llm("openai-compatible", "fake-model", base_url=server.base_url) as llm:
            with pytest.raises(NotSupportedError, match="no resumable streams"):
                llm.generate("hi", resumable=True)
        with create_llm("llamacpp", "fake-model", base_url=server.url) as llm:
            with pytest.raises(ValueError, match="plain_route"):
                llm.generate("hi", resumable=True, plain_route=True)
            with pytest.raises(ValueError, match="resume_timeout"):
                llm.generate("hi", resumable=True, resume_timeout=0)
            with pytest.raises(TypeError, match="resumable"):
                llm.generate("hi", resumable="yes")  # type: ignore[typeddict-item]
        assert server.requests("/v1/chat/completions") == []
