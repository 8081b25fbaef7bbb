"""A dialect added without touching a lane (#60): the legacy ``/v1/completions`` wire — the one
value ``abstract_client/wires/completions.py`` defines, which the ``vllm`` lane takes for
``raw=True`` — given to the unchanged ``llamacpp`` lane as a value (no registry touched), spoken
to a REAL llama-server: an answer, and a stop the server proves (its ``cancel task`` line, the
slot idle, the decoded count frozen)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.testing.processes import LlamaServer
from abstract_client.wires.completions import COMPLETIONS
from abstract_client.wires.wire import WIRES

from .helpers import press_when
from .test_llamacpp_real import assert_server_stopped, llama  # noqa: F401  (its server and its evidence)

pytestmark = pytest.mark.llamacpp


def test_a_wire_given_as_a_value_is_spoken_by_an_unchanged_lane_and_stops(llama: LlamaServer) -> None:  # noqa: F811
    assert "completions" not in WIRES  # nothing registered it
    assert llama.wait_idle(10)
    with create_llm("llamacpp", "smollm2", base_url=llama.url, wire=COMPLETIONS, max_retries=0) as lm:
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


def test_a_lane_refuses_a_wire_its_server_does_not_serve() -> None:
    with pytest.raises(ValueError, match=r"wire must be one of .*'messages'.*not 'completions'"):
        create_llm("llamacpp", "m", base_url="http://127.0.0.1:9", wire="completions")  # not by name
    with pytest.raises(ValueError, match=r"wire must be one of .*not 'ollama'"):
        create_llm("llamacpp", "m", base_url="http://127.0.0.1:9", wire="ollama")
    elsewhere = dataclasses.replace(COMPLETIONS, families=frozenset({"elsewhere"}))
    with pytest.raises(ValueError, match=r"the 'completions' wire is not one llamacpp serves \(its servers: v1\)"):
        create_llm("llamacpp", "m", base_url="http://127.0.0.1:9", wire=elsewhere)
    with pytest.raises(TypeError, match="wire= is not taken"):
        create_llm("anthropic", "m", base_url="http://127.0.0.1:9", wire=COMPLETIONS)
