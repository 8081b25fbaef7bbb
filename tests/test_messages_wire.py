"""Anthropic's Messages wire (#51), client side: ``wire="messages"`` on the HTTP lanes and the
``anthropic`` lane, against the bundled fake's ``/v1/messages`` on a real socket (the real
llama-server runs the stop suite on it: tests/test_llamacpp_messages_real.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from abstract_client import (
    GenerationCancelledError,
    ProviderProtocolError,
    ServerUnavailableError,
    create_llm,
)
from abstract_client.testing import FakeLMStudioServer, FakeOllamaServer, FakeOpenAIServer

from .helpers import WEATHER_TOOL, press_when

SERVER_SEES_EOF_S = 2.0  # generous: a shared 2-core machine


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.0) as server:
        yield server


def test_the_request_in_the_wires_form(fake: FakeOpenAIServer) -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    with create_llm("llamacpp", base_url=fake.base_url, wire="messages") as llm:
        llm.generate(messages=history, stop=["\n\n"], temperature=0.0, tools=[WEATHER_TOOL], tool_choice="auto")
    body = fake.last.body
    assert fake.last.path == "/v1/messages"
    assert body["system"] == "Be brief."
    assert body["model"] == "default"  # a lane without a model name sends a string, as the chat wire does
    assert body["max_tokens"] == 4096  # the wire requires it: the documented default when none is given
    assert body["stop_sequences"] == ["\n\n"] and body["temperature"] == 0.0
    assert body["tools"][0]["name"] == "get_weather" and "input_schema" in body["tools"][0]
    assert body["tool_choice"] == {"type": "auto"}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]  # the tool answer and the
    # next question are one user turn: the wire alternates
    assert body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
    ]
    assert body["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}
    assert body["messages"][2]["content"][1] == {"type": "text", "text": "And tomorrow?"}


def test_the_anthropic_lane_sends_its_key_as_anthropic_does(fake: FakeOpenAIServer) -> None:
    root = fake.base_url.removesuffix("/v1")
    with create_llm("anthropic", "claude-x", base_url=root, api_key="sk-ant-1") as llm:
        answer = llm.generate("hello there", max_tokens=3)
        assert answer.content == "tok0 tok1 tok2 " and answer.finish_reason == "length"
        assert answer.usage is not None and answer.usage.prompt_tokens == 2 and answer.usage.completion_tokens == 3
        headers = fake.last.headers
        assert headers["x-api-key"] == "sk-ant-1" and headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in headers  # the key goes in x-api-key only
        assert llm.count_tokens(messages=[{"role": "system", "content": "a b"}, {"role": "user", "content": "c"}]) == 3
        assert fake.last.path == "/v1/messages/count_tokens"


def test_a_tool_call_streams_as_input_json_and_is_assembled(fake: FakeOpenAIServer) -> None:
    fake.behavior.script = [
        {"reasoning": "The user wants weather."},
        {"tool": 0, "id": "toolu_1", "name": "get_weather", "arguments": '{"city": '},
        {"tool": 0, "arguments": '"Paris"}'},
    ]
    with create_llm("openai-compatible", "m", base_url=fake.base_url, wire="messages") as llm:
        result = llm.generate("Weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required")
        assert fake.last.body["tool_choice"] == {"type": "any"}
        assert result.finish_reason == "tool_calls" and result.reasoning == "The user wants weather."
        assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
            ("toolu_1", "get_weather", {"city": "Paris"})
        ]
        plain = llm.generate("Weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required", plain_route=True)
        assert [(c.name, c.arguments) for c in plain.tool_calls] == [("get_weather", {"city": "Paris"})]


def test_a_stop_mid_tool_call_hands_out_no_truncated_call(fake: FakeOpenAIServer) -> None:
    fake.behavior.token_delay = 0.02
    fake.behavior.script = [
        {"tool": 0, "id": "toolu_1", "name": "get_weather", "arguments": '{"ci'},
        *[{"tool": 0, "arguments": "x"} for _ in range(500)],
    ]
    stop = threading.Event()
    with create_llm("llamacpp", base_url=fake.base_url, wire="messages") as llm:
        press = press_when(lambda: fake.records and fake.last.tokens_sent >= 3, stop.set)
        with pytest.raises(GenerationCancelledError) as info:
            for _ in llm.stream("Weather?", tools=[WEATHER_TOOL], tool_choice="required", cancel_event=stop):
                pass
        press.wait()
    assert info.value.tool_calls == []  # never a truncated call
    assert info.value.partial_tool_call is not None and info.value.partial_tool_call.name == "get_weather"


@pytest.mark.parametrize("lane", ["vllm", "ollama", "lmstudio"])
@pytest.mark.parametrize("method", ["stream", "generate"])
def test_a_stop_severs_and_keeps_the_partial_text(method: str, lane: str) -> None:
    """Every server that serves ``/v1/messages`` (vLLM, Ollama 0.14+, LM Studio: their fakes,
    each with its own quirks elsewhere) sees the stop as its client's disconnect."""
    fake = {"vllm": FakeOpenAIServer, "ollama": FakeOllamaServer, "lmstudio": FakeLMStudioServer}[lane]
    with fake(token_delay=0.01) as server:
        with create_llm(lane, "fake-model", base_url=server.base_url, wire="messages") as llm:
            stop = threading.Event()
            press = press_when(lambda: server.records and server.last.tokens_sent >= 3, stop.set)
            with pytest.raises(GenerationCancelledError) as info:
                if method == "stream":
                    for _ in llm.stream("a long story", max_tokens=10_000, cancel_event=stop):
                        pass
                else:
                    llm.generate("a long story", max_tokens=10_000, cancel_event=stop)
            pressed = press.wait()
        record = server.last
        seen = server.wait_for_disconnect(record)
        assert seen - pressed < SERVER_SEES_EOF_S  # the server's own record of the disconnect
        assert record.path == "/v1/messages" and record.body["stream"] is True and record.tokens_sent < 10_000
        assert info.value.partial_text.startswith("tok0")


def test_errors_are_typed_and_keep_what_came(fake: FakeOpenAIServer) -> None:
    with create_llm("anthropic", "m", base_url=fake.base_url, max_retries=0) as llm:
        fake.inject("error_on_200")  # mid-stream: an overloaded_error event
        fake.behavior.fail_after_tokens = 2
        with pytest.raises(ServerUnavailableError) as overloaded:
            for _ in llm.stream("hi", max_tokens=10):
                pass
        assert overloaded.value.partial_text == "tok0 tok1 "
        fake.inject("close_without_done")
        with pytest.raises(ProviderProtocolError) as cut:
            for _ in llm.stream("hi", max_tokens=10):
                pass
        assert "before message_stop" in str(cut.value) and cut.value.partial_text.startswith("tok0")


@pytest.mark.parametrize("wire", ["chat", "responses", "messages"])
def test_the_anthropic_lane_refuses_a_wire_keyword(wire: str) -> None:
    """The lane speaks one wire: ``wire=`` was dropped silently, against the rule that a keyword
    a lane cannot honour is refused."""
    with pytest.raises(TypeError, match="wire= is not taken"):
        create_llm("anthropic", "m", base_url="http://127.0.0.1:9", wire=wire)
