"""The llamacpp lane against a REAL llama-server and a real model (SmolLM2-135M-Instruct).

The stop is proven by the server's own evidence: its log's ``cancel task`` line, ``/slots``
going idle within 2 s, and the decoded-token count no longer growing. If the binary or the model
is missing, these tests FAIL with the reason (run ``scripts/get_llama_server.sh`` and
``scripts/get_model.py``; ``.ci/run`` does both).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator

import pytest

from abstract_client import (
    LLM,
    AbortController,
    GenerationCancelledError,
    NotSupportedError,
    create_llm,
)
from abstract_client.testing.processes import LlamaServer

from .helpers import launch_llama_server, press_when, wait_until
from .server_contract import *  # noqa: F403  (the shared suite: ServerLane and its tests)
from .server_contract import ServerLane

pytestmark = pytest.mark.llamacpp

# SmolLM2's template adds its own default system prompt when none is given, and with that one the
# 135M model rambles in French; any plain system prompt gets "The capital of France is Paris."
# Long generations must not end early by chance (an EOS after a short story would make a stop
# test pass or fail on luck): llama-server's ignore_eos keeps them going until max_tokens.
CAPITAL = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = launch_llama_server(tmp_path_factory, "llama")
    yield server
    server.stop()


@pytest.fixture
def lm(llama: LlamaServer) -> Iterator[LLM]:
    assert llama.wait_idle(10), "a previous test left the slot busy"
    client = create_llm("llamacpp", "smollm2", base_url=llama.url, max_retries=0)
    yield client
    client.close()


@pytest.fixture
def server_lane(llama: LlamaServer) -> ServerLane:
    """llama-server's part of the shared suite (tests/server_contract.py): its evidence is a new
    ``cancel task`` log line, the slot idle and its decoded-token count frozen."""

    def mid_prompt(err: GenerationCancelledError) -> None:
        assert "cancel task" in llama.log_text()

    return ServerLane(
        story="Write a very long story about a dragon.",
        max_tokens=2000,
        long_prompt=long_prompt(),
        mark=lambda: len(llama.cancelled_tasks()),
        decoding=lambda before: (llama.processing_decoded() or 0) >= 10,
        prefilling=lambda before: llama.processing_decoded() == 0,
        assert_stopped=lambda before: assert_server_stopped(llama, before),
        after_prefill_stop=mid_prompt,
    )


def long_prompt(words: int = 2000) -> str:
    return "Summarise this text. " + " ".join(f"word{i % 97}" for i in range(words))


def assert_server_stopped(llama: LlamaServer, cancels_before: int) -> None:
    """The server's own evidence: a new ``cancel task`` log line, the slot idle, and the
    decoded-token count frozen. The bounds are generous on purpose: with other work on both
    cores, ggml's threads can take seconds per token, and the server notices a closed stream at
    its next token write (or its 1 s poll); a 2,000-token answer that was NOT stopped would keep
    the slot busy for minutes."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(llama.cancelled_tasks()) <= cancels_before:
        time.sleep(0.02)
    assert len(llama.cancelled_tasks()) > cancels_before, "no 'cancel task' in llama-server's log:\n" + llama.log_tail()
    assert llama.wait_idle(15.0), f"slot still processing: {llama.slots()}"
    decoded = llama.n_decoded()
    time.sleep(0.5)
    assert llama.n_decoded() == decoded


def test_generate_real_answer_with_usage_and_timings(lm: LLM) -> None:
    result = lm.generate(messages=CAPITAL, max_tokens=30, temperature=0)
    assert "Paris" in result.content
    assert result.usage is not None and result.usage.prompt_tokens == lm.count_tokens(messages=CAPITAL)
    assert result.usage.completion_tokens is not None and 0 < result.usage.completion_tokens <= 30
    assert result.timings.predicted_ms is not None and result.timings.tokens_per_s is not None
    assert result.timings.tokens_per_s > 0 and result.timings.total_ms is not None
    assert result.timings.total_ms > result.timings.predicted_ms  # the client's clock holds the server's


def test_stream_real_answer(lm: LLM) -> None:
    with lm.stream(messages=CAPITAL, max_tokens=30, temperature=0) as stream:
        text = "".join(chunk.delta for chunk in stream)
    assert "Paris" in text
    result = stream.result()
    assert result.finish_reason in ("stop", "length")
    assert result.usage is not None and result.usage.completion_tokens


def test_raw_completion_native_endpoint(lm: LLM) -> None:
    result = lm.generate("The capital of France is", raw=True, max_tokens=8, temperature=0)
    assert result.content and result.usage is not None and result.usage.completion_tokens == 8
    assert result.finish_reason == "length"
    chunks = list(lm.stream("The capital of France is", raw=True, max_tokens=8, temperature=0))
    assert "".join(c.delta for c in chunks) == result.content


def test_stop_is_never_retried(llama: LlamaServer) -> None:
    lm = create_llm("llamacpp", "smollm2", base_url=llama.url, max_retries=5)
    with lm:
        before_log = llama.log_text()
        controller = AbortController()
        press = press_when(lambda: (llama.processing_decoded() or 0) >= 10, controller.abort)
        with pytest.raises(GenerationCancelledError):
            lm.generate("Tell me a long story.", max_tokens=2000, ignore_eos=True, signal=controller.signal)
        press.wait()
        time.sleep(1.5)
        new_log = llama.log_text()[len(before_log) :]
    assert new_log.count("processing task") == 1, new_log[-2000:]  # one task: never retried
    assert len(LlamaServer.CANCEL.findall(new_log)) == 1


def test_unload_single_model_is_typed_not_supported(lm: LLM) -> None:
    with pytest.raises(NotSupportedError):
        lm.unload_model(drain_timeout=5)
    assert "Paris" in lm.generate(messages=CAPITAL, max_tokens=30, temperature=0).content  # still usable


def test_list_models_and_wait_ready(lm: LLM) -> None:
    lm.wait_ready(10)
    models = lm.list_models()
    assert len(models) == 1 and models[0].id


def test_context_overflow_is_typed(llama: LlamaServer) -> None:
    from abstract_client import ContextOverflowError

    with (
        create_llm("llamacpp", "smollm2", base_url=llama.url, max_retries=0) as lm,
        pytest.raises(ContextOverflowError) as info,
    ):
        lm.generate(long_prompt(12000), max_tokens=10)
    assert info.value.n_ctx and info.value.n_prompt_tokens and info.value.n_prompt_tokens > info.value.n_ctx


def test_never_sends_conversation_id(llama: LlamaServer) -> None:
    with pytest.raises(ValueError):
        create_llm("llamacpp", base_url=llama.url, headers={"X-Conversation-Id": "c1"})


def test_non_streaming_stop_reaches_the_server_within_a_token(lm: LLM, llama: LlamaServer) -> None:
    """Over the streaming wire llama-server notices the stop at its next token write, not at
    its once-a-second poll of a plain request. The proof does not depend on the machine's
    speed: the server's own log says how many tokens its slot held when it released the
    cancelled task (prompt + decoded), and it decoded at most a token or two beyond what the
    client had received."""
    prompt = [{"role": "user", "content": "Write a very long story about a dragon."}]
    prompt_tokens = lm.count_tokens(messages=prompt)
    before = len(llama.cancelled_tasks())
    event = threading.Event()

    def stop_once_decoding() -> None:
        # by the server's own count, not a timer: a loaded machine may take seconds to prefill
        wait_until(lambda: llama.n_decoded() >= 5, timeout=120, interval=0.02)
        time.sleep(0.5)  # the tokens the server wrote reach the client's record
        event.set()

    stopper = threading.Thread(target=stop_once_decoding, daemon=True)
    stopper.start()
    with pytest.raises(GenerationCancelledError) as info:
        lm.generate(messages=prompt, max_tokens=2000, ignore_eos=True, cancel_event=event)
    stopper.join(5)
    received = info.value.generated_tokens
    assert info.value.partial_text and received > 0  # the partial answer is kept
    assert_server_stopped(llama, before)
    task = llama.cancelled_tasks()[-1]
    released = re.search(rf"task {task} \| stop processing: n_tokens = (\d+)", llama.log_text())
    assert released is not None, llama.log_tail()
    decoded_by_server = int(released.group(1)) - prompt_tokens
    assert decoded_by_server <= received + 3, (decoded_by_server, received)


def test_back_to_back_calls_never_reuse_a_connection_llama_server_is_closing(
    lm: LLM, caplog: pytest.LogCaptureFixture
) -> None:
    """llama-server closes its side right after a streamed answer, whatever its Keep-Alive header
    says; a pooled connection reused in that instant failed with "Server disconnected without
    sending a response" (about every other call). Every call now asks for its own connection, so
    the transport never has to send a request again on a new one (that would be a request
    written into a closing socket, and a round trip lost)."""
    caplog.set_level(logging.DEBUG, logger="abstract_client.http.transport")
    assert lm.provider.clients is not None

    def pooled() -> int:  # connections the lane keeps for a next call (none: each call has its own)
        transports = list(lm.provider.clients._private.values())  # type: ignore[union-attr]
        return sum(len(conns) for transport in transports for conns in transport._idle.values())

    for _ in range(30):
        with lm.stream(messages=CAPITAL, max_tokens=3) as stream:
            assert [c for c in stream]
        assert pooled() == 0  # whether or not the race would have struck this time
        assert lm.generate(messages=CAPITAL, max_tokens=3).content  # type: ignore[arg-type]
        assert pooled() == 0
    assert not [r for r in caplog.records if "sending again" in r.getMessage()]


# -- the Responses API (#42): llama-server's /v1/responses, foreground only ----------------------


def test_the_responses_wire_answers_as_the_chat_wire_does(lm: LLM, llama: LlamaServer) -> None:
    """Greedy text, usage and timings as on chat; structured output honoured (llama-server drops
    ``text.format``: the lane sends its chat field too)."""
    with create_llm("llamacpp", "smollm2", base_url=llama.url, wire="responses") as rlm:
        chat = lm.generate(messages=CAPITAL, max_tokens=30, temperature=0)
        for plain in (False, True):
            answer = rlm.generate(messages=CAPITAL, max_tokens=30, temperature=0, plain_route=plain)
            assert answer.content == chat.content and "Paris" in answer.content
            assert answer.usage is not None and answer.usage.prompt_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]
            if not plain:  # the streamed answer's last event carries llama-server's timings
                assert answer.timings.tokens_per_s is not None and answer.timings.tokens_per_s > 0
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
        structured = rlm.generate(messages=CAPITAL, response_format=schema, max_tokens=60, temperature=0)
        assert isinstance(structured.parsed, dict) and isinstance(structured.parsed["city"], str)


def test_a_stop_on_the_responses_wire_cancels_the_task(llama: LlamaServer) -> None:
    assert llama.wait_idle(10)
    before = len(llama.cancelled_tasks())
    stop = threading.Event()
    with create_llm("llamacpp", "smollm2", base_url=llama.url, max_retries=0, wire="responses") as rlm:
        with pytest.raises(GenerationCancelledError) as info:
            for n, _ in enumerate(
                rlm.stream("Tell me a long story.", max_tokens=2000, ignore_eos=True, cancel_event=stop)
            ):
                if n == 10:
                    stop.set()
        assert info.value.partial_text
    assert_server_stopped(llama, before)
