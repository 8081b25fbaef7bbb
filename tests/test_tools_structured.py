"""Tools, structured output and reasoning through the one stop contract (fakes on real sockets,
and the pure pieces: assembler, think splitter, schemas, validation, ``continue_after``)."""

from __future__ import annotations

import dataclasses
import json
import threading
from enum import Enum
from typing import Any, Literal, TypedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from abstract_client import (
    AbortController,
    GenerationCancelledError,
    NotSupportedError,
    OutputValidationError,
    ToolCall,
    ToolCallDelta,
    continue_after,
    create_llm,
    function_tool,
)
from abstract_client.http.mapping import error_from_response
from abstract_client.output.tags import TagSplitter
from abstract_client.output.tool_calls import ToolCallAssembler
from abstract_client.testing import FakeLMStudioServer, FakeOllamaServer, FakeOpenAIServer

from .helpers import wait_until

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
}


def tool_script(*calls: tuple[str, str, list[str]], text: str = "") -> list[dict[str, Any]]:
    """Scripted wire pieces: optional text, then each call streamed in argument fragments."""
    pieces: list[dict[str, Any]] = [{"content": t} for t in text.split("|") if t]
    for index, (call_id, name, fragments) in enumerate(calls):
        pieces.append({"tool": index, "id": call_id, "name": name, "arguments": fragments[0]})
        pieces.extend({"tool": index, "arguments": f} for f in fragments[1:])
    return pieces


TWO_CALLS = tool_script(
    ("call_1", "get_weather", ['{"ci', 'ty": "Par', 'is"}']),
    ("call_2", "get_time", ['{"tz": "Eu', "rope/Par", 'is"}']),
)


# -- pure pieces ------------------------------------------------------------------------------------


def test_assembler_hands_out_only_complete_calls() -> None:
    a = ToolCallAssembler()
    a.feed(ToolCallDelta(0, "c1", "get_weather", '{"city": '))
    assert a.complete(finished=False) == []
    assert a.incomplete() == ToolCallDelta(0, "c1", "get_weather", '{"city": ')
    a.feed(ToolCallDelta(0, arguments_fragment='"Paris"}'))
    a.feed(ToolCallDelta(1, "c2", "get_time", ""))
    done = a.complete(finished=False)
    assert [c.name for c in done] == ["get_weather"] and done[0].arguments == {"city": "Paris"}
    assert a.incomplete() is not None and a.incomplete().name == "get_time"  # type: ignore[union-attr]
    # at the end of a finished answer a call without arguments text is complete ({})
    assert [c.name for c in a.complete(finished=True)] == ["get_weather", "get_time"]
    a.feed(ToolCallDelta(2, "c3", "get_weather", '{"city": "Ro'))
    assert [u.index for u in a.unparsed()] == [2]


@given(st.text(alphabet="ab<>/thinkc", max_size=40), st.lists(st.integers(0, 60), max_size=6))
def test_think_splitter_is_independent_of_how_text_is_cut(text: str, cuts: list[int]) -> None:
    whole = TagSplitter()
    c1, r1 = whole.feed(text)
    c1b, r1b = whole.flush()
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[i:j] for i, j in zip([0, *points], [*points, len(text)], strict=True)]
    split = TagSplitter()
    content, reasoning = "", ""
    for piece in pieces:
        c, r = split.feed(piece)
        content, reasoning = content + c, reasoning + r
    c, r = split.flush()
    assert (content + c, reasoning + r) == (c1 + c1b, r1 + r1b)


def test_think_splitter_separates_reasoning() -> None:
    s = TagSplitter()
    out = [s.feed(p) for p in ["<thi", "nk>let me", " see</th", "ink>The answer", " is 4"]]
    assert "".join(c for c, _ in out) == "The answer is 4"
    assert "".join(r for _, r in out) == "let me see"
    inside = TagSplitter(inside=True)  # the template opened the block in the prompt
    assert inside.feed("hmm</think>ok") == ("ok", "hmm")


class Unit(Enum):
    C = "celsius"
    F = "fahrenheit"


def forecast(city: str, days: int, unit: Unit = Unit.C, hourly: bool | None = None, tags: list[str] = []) -> str:  # noqa: B006
    """Forecast for a city.

    Longer text that is not the description."""
    return ""


@pytest.fixture(params=["pydantic", "plain"])
def derive(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Schemas derived by pydantic (installed here), and by the fallback used without it."""
    if request.param == "plain":
        import abstract_client.output.structured as structured

        monkeypatch.setattr(structured, "_pydantic_parameters", lambda name, fields: None)
    return str(request.param)


def accepts(schema: dict[str, Any], value: Any) -> bool:
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema).is_valid(value)


def test_function_tool_schema_from_type_hints(derive: str) -> None:
    spec = function_tool(forecast)["function"]
    assert spec["name"] == "forecast" and spec["description"] == "Forecast for a city."
    params = spec["parameters"]
    assert sorted(params["required"]) == ["city", "days"] and params["additionalProperties"] is False
    assert accepts(params, {"city": "Paris", "days": 3, "unit": "fahrenheit", "hourly": None, "tags": ["a"]})
    for bad in (
        {"city": "Paris"},  # days is required
        {"city": "Paris", "days": "3"},
        {"city": "Paris", "days": 3, "unit": "kelvin"},
        {"city": "Paris", "days": 3, "hourly": "yes"},
        {"city": "Paris", "days": 3, "tags": [1]},
        {"city": "Paris", "days": 3, "extra": 1},  # strict: no invented arguments
    ):
        assert not accepts(params, bad), bad


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Box:
    label: str
    size: float = 1.0


class Owner(BaseModel):
    name: str
    boxes: list[Box]


def test_function_tool_schemas_for_tuples_typeddicts_dataclasses_and_models(derive: str) -> None:
    def place(
        at: tuple[int, str],
        corners: tuple[Point, ...],
        box: Box,
        mode: Literal["fast", "slow"],
        owner: Owner | None = None,
    ) -> None:
        """Place a box."""

    params = function_tool(place)["function"]["parameters"]
    good = {"at": [1, "a"], "corners": [{"x": 1, "y": 2}], "box": {"label": "b"}, "mode": "fast"}
    assert accepts(params, good)
    assert accepts(params, {**good, "owner": {"name": "o", "boxes": [{"label": "c", "size": 2.5}]}})
    assert accepts(params, {**good, "owner": None})
    for bad in (
        {**good, "at": [1, 2]},  # a tuple's second item is a string
        {**good, "at": [1, "a", 3]},  # and it has exactly two
        {**good, "corners": [{"x": 1}]},  # a Point needs y
        {**good, "box": {"size": 2.0}},  # a Box needs its label
        {**good, "mode": "medium"},
        {**good, "owner": {"name": "o", "boxes": [{"size": 1}]}},
    ):
        assert not accepts(params, bad), bad


class Opaque:
    """No JSON schema can say what this is."""


def test_function_tool_refuses_a_parameter_without_a_schema() -> None:
    def use(thing: Opaque) -> None:
        """Use it."""

    with pytest.raises(TypeError, match="no JSON schema"):
        function_tool(use)


def test_bad_arguments_are_typed_before_anything_is_sent() -> None:
    with FakeOpenAIServer() as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url)
        with pytest.raises(ValueError, match="tool_choice"):
            llm.generate("x", tools=[WEATHER], tool_choice="sometimes")
        with pytest.raises(ValueError, match="not in tools"):
            llm.generate("x", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
        with pytest.raises(ValueError, match="JSON schema"):
            llm.generate("x", response_format={"type": "bogus-type"})
        with pytest.raises(ValueError, match="reasoning"):
            llm.generate("x", reasoning="extreme")
        assert server.requests("/v1/chat/completions") == []
        llm.close()


# -- tool calls over the OpenAI wire --------------------------------------------------------------


def test_streamed_tool_calls_assemble_into_complete_calls() -> None:
    with FakeOpenAIServer() as server:
        server.behavior.script = [{"content": "Let me check."}, {"content": " "}, *TWO_CALLS]
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url)
        with llm.stream("weather?", tools=[WEATHER, TIME]) as s:
            chunks = list(s)
        result = s.result()
        body = server.last.body
        assert body["tools"] == [WEATHER, TIME] and "tool_choice" not in body
        assert result.content == "Let me check. "
        assert result.finish_reason == "tool_calls"
        assert result.tool_calls == [
            ToolCall("call_1", "get_weather", {"city": "Paris"}, '{"city": "Paris"}'),
            ToolCall("call_2", "get_time", {"tz": "Europe/Paris"}, '{"tz": "Europe/Paris"}'),
        ]
        pieces = [c.tool_call for c in chunks if c.tool_call is not None]
        assert [p.index for p in pieces] == [0, 0, 0, 1, 1, 1] and pieces[0].name == "get_weather"
        final = [c for c in chunks if c.tool_calls]
        assert len(final) == 1 and final[0].tool_calls == result.tool_calls
        # non-streaming: the same calls, assembled by the contract from the streaming wire
        again = llm.generate("weather?", tools=[WEATHER, TIME], tool_choice="required")
        assert again.tool_calls == result.tool_calls and server.last.body["tool_choice"] == "required"
        plain = llm.generate("weather?", tools=[WEATHER, TIME], plain_route=True)
        assert plain.tool_calls == result.tool_calls and plain.finish_reason == "tool_calls"
        llm.close()


@pytest.mark.parametrize("mode", ["stream", "generate"])
def test_stop_mid_tool_call_keeps_complete_calls_and_never_hands_out_the_partial_one(mode: str) -> None:
    with FakeOpenAIServer() as server:
        server.behavior.script = TWO_CALLS
        server.behavior.token_delay = 0.05
        # vLLM's lane carries a non-streaming call over the streaming wire: the pieces arrive
        llm = create_llm("vllm", "fake-model", base_url=server.base_url, max_retries=0)
        stop = threading.Event()
        seen: list[Any] = []
        with pytest.raises(GenerationCancelledError) as info:
            if mode == "stream":
                with llm.stream("weather?", tools=[WEATHER, TIME], cancel_event=stop) as s:
                    for chunk in s:
                        seen.append(chunk)
                        if chunk.tool_call is not None and chunk.tool_call.index == 1:
                            stop.set()  # the second call has started, it is not complete
            else:
                # stop once the server has written the second call's first piece (piece #4)
                def stop_at_second_call() -> None:
                    record = server.wait_for_request(path="/v1/chat/completions")
                    wait_until(lambda: record.tokens_sent >= 5, timeout=10)
                    stop.set()

                threading.Thread(target=stop_at_second_call, daemon=True).start()
                llm.generate("weather?", tools=[WEATHER, TIME], cancel_event=stop)
        err = info.value
        partial = err.partial_tool_call
        if mode == "stream":  # the stop came right after the second call's first piece
            assert [c.name for c in err.tool_calls] == ["get_weather"]
            assert partial is not None and partial.name == "get_time" and partial.index == 1
            assert partial.arguments_fragment.startswith('{"tz": "Eu')
        else:  # the non-streaming caller cannot see which pieces had arrived: check invariants
            assert [c.name for c in err.tool_calls] in ([], ["get_weather"])
            if partial is not None:
                assert partial.name == ("get_time" if err.tool_calls else "get_weather")
                assert partial.name not in [c.name for c in err.tool_calls]
        for call in err.tool_calls:
            assert call == ToolCall("call_1", "get_weather", {"city": "Paris"}, '{"city": "Paris"}')
        assert not any(c.tool_calls for c in seen)  # the complete-calls chunk never came
        record = server.last
        assert server.wait_for_disconnect(record) > 0 and not record.completed
        # the next turn goes through: complete calls kept, the partial one dropped
        history = continue_after([{"role": "user", "content": "weather?"}], err, unrun_tool_answer="not run: stopped")
        if err.tool_calls:
            assert history[1]["tool_calls"] == [err.tool_calls[0].to_message()]
            assert history[2] == {"role": "tool", "tool_call_id": "call_1", "content": "not run: stopped"}
        server.behavior.script = None
        assert llm.generate(messages=[*history, {"role": "user", "content": "ok?"}]).content
        # the truncated call in the history is what servers reject
        truncated = {"name": "get_time", "arguments": '{"tz": "Eu'}
        bad = {"role": "assistant", "tool_calls": [{"id": "x", "type": "function", "function": truncated}]}
        with pytest.raises(Exception, match="invalid tool call arguments"):
            llm.generate(messages=[{"role": "user", "content": "weather?"}, bad, {"role": "user", "content": "ok?"}])
        llm.close()


def test_continue_after_a_complete_answer_and_after_nothing() -> None:
    with FakeOpenAIServer() as server:
        server.behavior.script = TWO_CALLS
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url)
        first = [{"role": "user", "content": "weather?"}]
        result = llm.generate(messages=first, tools=[WEATHER, TIME])
        history = continue_after(first, result)
        history += [
            {"role": "tool", "tool_call_id": c.id, "content": "sunny" if c.name == "get_weather" else "12:00"}
            for c in result.tool_calls
        ]
        server.behavior.script = None
        assert llm.generate(messages=history, tools=[WEATHER, TIME]).content
        assert server.last.body["messages"][1]["tool_calls"][1]["function"]["arguments"] == '{"tz": "Europe/Paris"}'
        assert continue_after(first, GenerationCancelledError()) == first  # nothing produced: nothing added
        llm.close()


def test_invalid_tool_arguments_of_a_complete_answer_are_a_validation_error_never_retried() -> None:
    with FakeOpenAIServer() as server:
        server.behavior.script = tool_script(("call_1", "get_weather", ['{"town": "Paris"}']))
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=3)
        with pytest.raises(OutputValidationError) as info:
            llm.generate("weather?", tools=[WEATHER])
        assert "city" in " ".join(info.value.errors) and info.value.raw_text == '{"town": "Paris"}'
        assert len(server.requests("/v1/chat/completions")) == 1
        llm.close()


# -- structured output ------------------------------------------------------------------------------


class City(BaseModel):
    name: str
    population: int


def test_response_format_schema_and_pydantic_model() -> None:
    with FakeOpenAIServer() as server:
        server.behavior.answer = '{"name": "Paris", "population": 2100000}'
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url)
        result = llm.generate("Paris?", response_format=City)
        assert result.parsed == City(name="Paris", population=2100000)
        fmt = server.last.body["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "City"
        assert fmt["json_schema"]["schema"]["required"] == ["name", "population"]
        schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        assert llm.generate("Paris?", response_format=schema).parsed["name"] == "Paris"
        with llm.stream("Paris?", response_format=schema) as s:
            text = "".join(c.delta for c in s)
        assert json.loads(text) == s.result().parsed
        assert llm.generate("Paris?", response_format={"type": "json_object"}).parsed["population"] == 2100000
        llm.close()


@pytest.mark.parametrize("answer", ['{"name": "Paris", "population": "many"}', '{"name": "Par'])
def test_an_answer_that_does_not_match_is_an_output_validation_error(answer: str) -> None:
    with FakeOpenAIServer() as server:
        server.behavior.answer = answer
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=3)
        with pytest.raises(OutputValidationError) as info:
            llm.generate("Paris?", response_format=City)
        assert info.value.raw_text == answer and info.value.partial_text == answer and info.value.errors
        with pytest.raises(OutputValidationError), llm.stream("Paris?", response_format=City) as s:
            for _ in s:
                pass
        assert len(server.requests("/v1/chat/completions")) == 2  # never retried
        llm.close()


def test_a_stop_mid_json_is_a_stop_never_a_validation_error() -> None:
    answer = '{"name": "Paris", "population": 2100000, "more": "' + "x " * 200 + '"}'
    with FakeOpenAIServer() as server:
        server.behavior.answer = answer
        server.behavior.token_delay = 0.01
        llm = create_llm("vllm", "fake-model", base_url=server.base_url, max_retries=3)
        controller = AbortController()

        def abort_mid_answer() -> None:
            record = server.wait_for_request(path="/v1/chat/completions", timeout=30)
            wait_until(lambda: record.tokens_sent >= 10, timeout=30)
            controller.abort()

        threading.Thread(target=abort_mid_answer, daemon=True).start()
        with pytest.raises(GenerationCancelledError) as info:
            llm.generate("Paris?", response_format=City, signal=controller.signal, max_tokens=1000)
        assert not isinstance(info.value, OutputValidationError)
        assert answer.startswith(info.value.partial_text) and len(info.value.partial_text) < len(answer)
        assert len(server.requests("/v1/chat/completions")) == 1  # never retried
        llm.close()


@pytest.mark.parametrize(
    "features",
    [
        {"tools": [WEATHER], "tool_choice": "required"},
        {"response_format": City},
        {"reasoning": "high"},
    ],
)
@pytest.mark.parametrize("lane", ["openai-compatible", "ollama", "lmstudio", "llamacpp"])
def test_a_stop_already_set_sends_nothing_with_any_feature(lane: str, features: dict[str, Any]) -> None:
    fake = {"ollama": FakeOllamaServer, "lmstudio": FakeLMStudioServer}.get(lane, FakeOpenAIServer)
    with fake() as server:
        url = server.url if lane == "llamacpp" else server.base_url
        llm = create_llm(lane, "fake-model", base_url=url)
        stop = threading.Event()
        stop.set()
        with pytest.raises(GenerationCancelledError):
            llm.generate("x", cancel_event=stop, **features)
        with pytest.raises(GenerationCancelledError), llm.stream("x", cancel_event=stop, **features) as s:
            list(s)
        assert server.requests() == []  # not even /props
        llm.close()


# -- the fallback for models without tool calling -----------------------------------------------------


def test_llamacpp_without_template_tools_carries_a_forced_call_as_json_schema() -> None:
    with FakeOpenAIServer() as server:
        server.behavior.template_tools = False
        server.behavior.answer = '{"city": "Paris"}'
        llm = create_llm("llamacpp", "fake-model", base_url=server.url)
        with pytest.raises(NotSupportedError, match="no native tool calling"):
            llm.generate("weather?", tools=[WEATHER])  # "auto" is never silently ignored
        assert server.requests("/v1/chat/completions") == []
        result = llm.generate("weather?", tools=[WEATHER], tool_choice="required")
        body = server.last.body
        assert (
            "tools" not in body
            and body["response_format"]["json_schema"]["schema"] == WEATHER["function"]["parameters"]
        )
        assert result.finish_reason == "tool_calls" and result.content == ""
        assert [(c.name, c.arguments) for c in result.tool_calls] == [("get_weather", {"city": "Paris"})]
        with llm.stream(
            "weather?", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
        ) as s:
            chunks = list(s)
        assert "".join(c.tool_call.arguments_fragment for c in chunks if c.tool_call) == '{"city": "Paris"}'
        assert (all(c.delta == "" for c in chunks) and chunks[-1].tool_calls) or any(c.tool_calls for c in chunks)
        # several tools: one of {"name", "arguments"}
        server.behavior.answer = '{"name": "get_time", "arguments": {"tz": "UTC"}}'
        result = llm.generate("time?", tools=[WEATHER, TIME], tool_choice="required")
        assert [(c.name, c.arguments) for c in result.tool_calls] == [("get_time", {"tz": "UTC"})]
        assert "anyOf" in server.last.body["response_format"]["json_schema"]["schema"]
        # tool_choice="none" just drops the tools
        server.behavior.answer = "plain"
        assert llm.generate("hi", tools=[WEATHER], tool_choice="none").content == "plain"
        assert "tools" not in server.last.body
        llm.close()


def test_vllm_tool_choice_refused_by_the_server_is_not_supported() -> None:
    for message in (
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
        'tool_choice="required" requires --tool-call-parser to be set',
    ):
        assert isinstance(error_from_response(400, {"error": {"message": message}}), NotSupportedError)


# -- reasoning --------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_never_leaks_into_content(field: str) -> None:
    with FakeOpenAIServer() as server:
        server.behavior.reasoning_field = field
        server.behavior.script = [
            {"reasoning": "Let me "},
            {"reasoning": "think."},
            {"content": "Four"},
            {"content": "."},
        ]
        llm = create_llm("vllm", "fake-model", base_url=server.base_url)
        with llm.stream("2+2?", reasoning="low") as s:
            chunks = list(s)
        assert "".join(c.reasoning for c in chunks) == "Let me think." and "".join(c.delta for c in chunks) == "Four."
        result = s.result()
        assert result.reasoning == "Let me think." and result.content == "Four."
        body = server.last.body
        assert body["reasoning_effort"] == "low" and body["chat_template_kwargs"] == {"enable_thinking": True}
        plain = llm.generate("2+2?", reasoning=False, plain_route=True)
        assert (plain.reasoning, plain.content) == ("Let me think.", "Four.")
        assert server.last.body["chat_template_kwargs"] == {"enable_thinking": False}
        llm.close()


def test_a_stop_during_reasoning_keeps_the_partial_reasoning() -> None:
    with FakeOpenAIServer() as server:
        server.behavior.script = [{"reasoning": f"step {i}. "} for i in range(200)]
        server.behavior.token_delay = 0.01
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url)
        stop = threading.Event()
        with pytest.raises(GenerationCancelledError) as info:
            for chunk in llm.stream("think", cancel_event=stop):
                if chunk.reasoning == "step 3. ":
                    stop.set()
        assert info.value.partial_reasoning.startswith("step 0. step 1. step 2. step 3.")
        assert info.value.partial_text == ""
        llm.close()


# -- Ollama: whole calls, format, think --------------------------------------------------------------


def test_ollama_native_tools_thinking_and_format() -> None:
    with FakeOllamaServer() as server:
        server.behavior.script = [{"reasoning": "Hmm. "}, *TWO_CALLS]
        llm = create_llm("ollama", "fake-model", base_url=server.url)
        result = llm.generate("weather?", tools=[WEATHER, TIME], reasoning=True)
        body = server.last.body
        assert body["tools"] == [WEATHER, TIME] and body["think"] is True
        assert result.reasoning == "Hmm. " and result.finish_reason == "tool_calls"
        assert [(c.name, c.arguments) for c in result.tool_calls] == [
            ("get_weather", {"city": "Paris"}),
            ("get_time", {"tz": "Europe/Paris"}),
        ]
        streamed = llm.generate("weather?", tools=[WEATHER, TIME], plain_route=True)
        assert [c.arguments for c in streamed.tool_calls] == [c.arguments for c in result.tool_calls]
        # a forced call: Ollama has no tool_choice, so the call is carried by format
        server.behavior.script = None
        server.behavior.answer = '{"city": "Rome"}'
        forced = llm.generate("weather?", tools=[WEATHER], tool_choice="required")
        assert server.last.body["format"] == WEATHER["function"]["parameters"] and "tools" not in server.last.body
        assert [(c.name, c.arguments) for c in forced.tool_calls] == [("get_weather", {"city": "Rome"})]
        # the history goes back with arguments as objects and the tool answer named
        history = [
            *continue_after([{"role": "user", "content": "weather?"}], result),
            {"role": "tool", "tool_call_id": result.tool_calls[0].id, "content": "sunny"},
        ]
        server.behavior.answer = "ok"
        llm.generate(messages=history)
        sent = server.last.body["messages"]
        assert sent[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
        assert sent[2]["tool_name"] == "get_weather"
        llm.close()


def test_ollama_stop_mid_call_yields_no_call() -> None:
    with FakeOllamaServer() as server:
        server.behavior.script = TWO_CALLS
        server.behavior.token_delay = 0.05
        llm = create_llm("ollama", "fake-model", base_url=server.url)
        stop = threading.Event()
        with pytest.raises(GenerationCancelledError) as info:
            for chunk in llm.stream("weather?", tools=[WEATHER, TIME], cancel_event=stop):
                if chunk.tool_call is not None:
                    stop.set()  # Ollama sends calls whole: the first one is complete
        assert [c.name for c in info.value.tool_calls] == ["get_weather"]
        assert info.value.partial_tool_call is None  # the second was never sent in part
        llm.close()


def test_lmstudio_reasoning_goes_native_and_tools_stay_on_v1() -> None:
    with FakeLMStudioServer() as server:
        llm = create_llm("lmstudio", "fake-model", base_url=server.url)
        with llm.stream("2+2?", reasoning=True) as s:
            chunks = list(s)
        assert server.last.path == "/api/v1/chat" and server.last.body["reasoning"] == "on"
        assert "".join(c.reasoning for c in chunks) == "Let me think. "
        assert "think" not in "".join(c.delta for c in chunks)
        server.behavior.script = TWO_CALLS
        result = llm.generate("weather?", tools=[WEATHER, TIME], reasoning="low")
        assert server.last.path == "/v1/chat/completions" and len(result.tool_calls) == 2
        server.behavior.script = None
        server.behavior.answer = '{"city": "Oslo"}'
        named = llm.generate(
            "weather?", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
        )
        assert named.tool_calls[0].arguments == {"city": "Oslo"} and "tools" not in server.last.body
        llm.close()


def test_content_parts_and_images() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    message = {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
    with FakeOllamaServer() as server:
        llm = create_llm("ollama", "fake-model", base_url=server.url)
        llm.generate(messages=[message])
        sent = server.last.body["messages"][0]
        assert sent["content"] == "What is this?" and sent["images"] == ["iVBORw0KGgo="]
        llm.close()
    with FakeOpenAIServer() as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url)
        llm.generate(messages=[message])
        assert server.last.body["messages"][0]["content"][1] == image  # /v1 takes parts as they are
        llm.close()


def test_tool_literal_type_and_typed_result_fields() -> None:
    def pick(color: Literal["red", "blue"]) -> None:
        """Pick a color."""

    color = function_tool(pick)["function"]["parameters"]["properties"]["color"]
    assert color["enum"] == ["red", "blue"] and accepts(color, "red") and not accepts(color, "green")
