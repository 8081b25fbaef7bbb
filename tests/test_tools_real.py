"""Tools, structured output and the stop on REAL engines: llama-server (``--jinja``) and mlx-lm
with SmolLM2-135M-Instruct. (vLLM's are in ``test_vllm_real.py``, on its module server.)

SmolLM2's chat template has no tool calling (llama-server's ``/props`` says so), so a forced
call is carried as schema-constrained output: the server's grammar (llama-server) or
llguidance's mask (MLX) guarantees it parses. The stop is proven by the engine's own evidence:
llama-server's ``cancel task`` log line and idle slot, MLX's per-request token counter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from abstract_client import (
    LLM,
    GenerationCancelledError,
    NotSupportedError,
    OutputValidationError,
    create_llm,
)
from abstract_client.testing.processes import LlamaServer

from .helpers import WEATHER_TOOL, launch_llama_server, needs_mlx, press_when
from .test_llamacpp_real import assert_server_stopped

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
# A long structured answer: the grammar keeps it going until 300 items exist.
MANY = {
    "type": "object",
    "properties": {"words": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 300}},
    "required": ["words"],
}
WEATHER = WEATHER_TOOL


def ask(text: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": text}]  # type: ignore[list-item]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = launch_llama_server(tmp_path_factory, "llama-tools", extra=["--jinja"])
    yield server
    server.stop()


@pytest.fixture
def lm(llama: LlamaServer) -> Iterator[LLM]:
    assert llama.wait_idle(15), "a previous test left the slot busy"
    client = create_llm("llamacpp", "smollm2", base_url=llama.url, max_retries=0)
    yield client
    client.close()


@pytest.mark.llamacpp
def test_llama_server_response_format_gives_schema_valid_json(lm: LLM) -> None:
    result = lm.generate(
        messages=ask("Name a big city and its population."), response_format=CITY, max_tokens=80, temperature=0
    )
    assert isinstance(result.parsed, dict) and set(result.parsed) == {"city", "population"}
    assert isinstance(result.parsed["population"], int)
    with lm.stream(
        messages=ask("Name a big city and its population."), response_format=CITY, max_tokens=80, temperature=0
    ) as s:
        text = "".join(c.delta for c in s)
    assert s.result().parsed == result.parsed and text == result.content  # greedy: same answer


@pytest.mark.llamacpp
def test_llama_server_forced_tool_call_on_a_model_without_tool_calling(lm: LLM, llama: LlamaServer) -> None:
    caps = llama.get_json("/props")["chat_template_caps"]
    assert caps["supports_tool_calls"] is False  # the reason for the fallback
    n_chat = llama.log_text().count("POST /v1/chat/completions")
    with pytest.raises(NotSupportedError, match="no native tool calling"):
        lm.generate(messages=ask("What is the weather in Paris?"), tools=[WEATHER])
    assert llama.log_text().count("POST /v1/chat/completions") == n_chat  # refused before sending
    result = lm.generate(
        messages=ask("What is the weather in Paris?"),
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    assert result.finish_reason == "tool_calls" and result.content == ""
    (call,) = result.tool_calls
    assert call.name == "get_weather" and isinstance(call.arguments.get("city"), str)
    assert set(call.arguments) == {"city"}


@pytest.mark.llamacpp
def test_llama_server_stop_mid_structured_answer_cancels_the_task(lm: LLM, llama: LlamaServer) -> None:
    cancels = len(llama.cancelled_tasks())
    stop = threading.Event()
    received = 0
    with pytest.raises(GenerationCancelledError) as info:
        for chunk in lm.stream(
            messages=ask("List many words."), response_format=MANY, max_tokens=2000, cancel_event=stop
        ):
            received += len(chunk.delta)
            if received > 60:
                stop.set()
    assert not isinstance(info.value, OutputValidationError)
    assert info.value.partial_text.startswith("{") and len(info.value.partial_text) < 2000
    assert_server_stopped(llama, cancels)
    # non-streaming, over the streaming wire: the same
    cancels = len(llama.cancelled_tasks())
    stop = threading.Event()
    press = press_when(lambda: (llama.processing_decoded() or 0) >= 10, stop.set)  # the server's own count
    with pytest.raises(GenerationCancelledError):
        lm.generate(messages=ask("List many words."), response_format=MANY, max_tokens=2000, cancel_event=stop)
    press.wait()
    assert_server_stopped(llama, cancels)


# -- mlx-lm in-process -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlx_llm() -> Iterator[LLM]:
    from abstract_client.app.assets import smollm2_mlx

    with create_llm("mlx", str(smollm2_mlx())) as llm:
        yield llm


@needs_mlx
def test_mlx_constrained_decoding_gives_schema_valid_json(mlx_llm: LLM) -> None:
    result = mlx_llm.generate(messages=ask("Name a big city and its population."), response_format=CITY, max_tokens=80)
    assert isinstance(result.parsed, dict) and set(result.parsed) == {"city", "population"}
    assert isinstance(result.parsed["population"], int) and result.finish_reason == "stop"


@needs_mlx
def test_mlx_forced_tool_call(mlx_llm: LLM) -> None:
    with pytest.raises(NotSupportedError):
        mlx_llm.generate(messages=ask("Weather in Paris?"), tools=[WEATHER])  # no tool template
    with mlx_llm.stream(
        messages=ask("What is the weather in Paris?"), tools=[WEATHER], tool_choice="required", max_tokens=60
    ) as s:
        chunks = list(s)
    result = s.result()
    (call,) = result.tool_calls
    assert call.name == "get_weather" and set(call.arguments) == {"city"}
    assert "".join(c.tool_call.arguments_fragment for c in chunks if c.tool_call) == call.arguments_json
    assert all(c.delta == "" for c in chunks)


@needs_mlx
def test_mlx_stop_mid_json_samples_nothing_after_the_flag(mlx_llm: LLM) -> None:
    from abstract_client.providers.mlx import MLXProvider

    provider = mlx_llm.provider
    assert isinstance(provider, MLXProvider)
    stop = threading.Event()
    request_id = "mlx-json-stop"
    at_flag = -1
    with pytest.raises(GenerationCancelledError) as info:
        for i, _ in enumerate(
            mlx_llm.stream(
                messages=ask("List many words."),
                response_format=MANY,
                max_tokens=2000,
                cancel_event=stop,
                request_id=request_id,
            )
        ):
            if i == 15:
                at_flag = provider.stats(request_id).tokens  # type: ignore[union-attr]
                stop.set()
    assert provider.thread.wait_idle(10)
    stats = provider.stats(request_id)
    assert stats is not None and stats.stopped_in == "decode" and not stats.finished
    # nothing counted once the worker saw the flag, and it saw it within a token or two of the
    # test reading the counter and setting the flag (two statements apart on a loaded machine)
    assert stats.tokens_at_stop == stats.tokens
    assert stats.tokens_at_stop is not None and stats.tokens_at_stop - at_flag <= 2
    assert info.value.partial_text.startswith("{") and not isinstance(info.value, OutputValidationError)
    # the engine is idle and answers the next call
    assert mlx_llm.generate(messages=ask("Name a big city."), response_format=CITY, max_tokens=80).parsed


@needs_mlx
def test_mlx_preset_stop_with_a_schema_builds_nothing(tmp_path: Path) -> None:
    from abstract_client.app.assets import smollm2_mlx

    with create_llm("mlx", str(smollm2_mlx())) as llm:
        stop = threading.Event()
        stop.set()
        t0 = time.perf_counter()
        with pytest.raises(GenerationCancelledError):
            llm.generate("x", response_format=CITY, tools=[WEATHER], tool_choice="required", cancel_event=stop)
        assert time.perf_counter() - t0 < 5 and not llm.provider.loaded  # type: ignore[attr-defined]
