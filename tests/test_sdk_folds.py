"""A plain call carried over its dialect's stream and folded back (``wires/folds.py``): the body
an SDK gets is the one the server would have sent plainly.

Fuzzed against the SDKs' own accumulators — openai-python's ``ChatCompletionStreamState`` and the
anthropic SDK's ``accumulate_event``, the reference parsers of those streams — and end to end on
the fake servers: the same scripted answer (text, reasoning, tool calls) asked plainly and
carried gives the same parsed object.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from pydantic import TypeAdapter

from abstract_client import sdk
from abstract_client.testing import FakeOpenAIServer
from abstract_client.wires.folds import ChatFold, MessagesFold, chat_streamed, messages_streamed

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)


# -- chat completions: against openai-python's accumulator ---------------------------------------


@st.composite
def chat_chunks(draw: st.DrawFn) -> list[dict[str, Any]]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks: list[dict[str, Any]] = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    calls = draw(st.integers(0, 3))
    started: set[int] = set()
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["content", "reasoning_content"] + ["tool"] * bool(calls)))
        if kind == "tool":  # a server opens its calls in order: the next one, or one already open
            index = draw(st.integers(0, min(len(started), calls - 1)))
            piece: dict[str, Any] = {"index": index, "function": {"arguments": draw(TEXT)}}
            if index not in started:
                started.add(index)
                piece.update(id=f"call_{index}", type="function", function={"name": f"f{index}", "arguments": ""})
            delta: dict[str, Any] = {"tool_calls": [piece]}
        else:
            delta = {kind: draw(TEXT)}
        chunks.append({**head, "choices": [{"index": 0, "delta": delta}]})
    finish = "tool_calls" if started else draw(st.sampled_from(["stop", "length"]))
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append({**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})
    return chunks


@settings(max_examples=200, deadline=None)
@given(chat_chunks())
def test_the_chat_fold_is_what_openai_pythons_own_accumulator_makes(chunks: list[dict[str, Any]]) -> None:
    fold = ChatFold()
    reference = ChatCompletionStreamState()
    for chunk in chunks:
        fold.add("message", json.loads(json.dumps(chunk)))
        reference.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    fold.add("message", "[DONE]")
    assert fold.complete
    status, body = fold.result()
    assert status == 200
    ours = openai.types.chat.ChatCompletion.model_validate(body)
    theirs = reference.current_completion_snapshot  # (before the SDK's own parse of the content)
    assert ours.usage == theirs.usage and ours.id == theirs.id and ours.model == theirs.model
    (mine,), (ref,) = ours.choices, theirs.choices
    assert mine.finish_reason == ref.finish_reason
    assert mine.message.content == ref.message.content
    assert getattr(mine.message, "reasoning_content", None) == getattr(ref.message, "reasoning_content", None)
    assert [(c.id, c.function.name, c.function.arguments) for c in mine.message.tool_calls or []] == [
        (c.id, c.function.name, c.function.arguments)  # type: ignore[union-attr]
        for c in ref.message.tool_calls or []
    ]


# -- Messages: against the anthropic SDK's accumulator -------------------------------------------

EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)


@st.composite
def message_events(draw: st.DrawFn) -> list[dict[str, Any]]:
    usage = {"input_tokens": 4, "output_tokens": 1}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": []}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "stop_reason": None, "stop_sequence": None, "usage": usage}}
    ]
    tools = False
    for index in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["text", "thinking", "tool_use"]))
        if kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": draw(TEXT)} for _ in range(draw(st.integers(0, 5)))]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": draw(TEXT)} for _ in range(draw(st.integers(0, 5)))]
            deltas.append({"type": "signature_delta", "signature": "sig"})
        else:
            tools = True
            start = {"type": "tool_use", "id": f"toolu_{index}", "name": f"f{index}", "input": {}}
            args = json.dumps(
                draw(st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=5), max_size=3))
            )
            cuts = sorted(draw(st.lists(st.integers(0, len(args)), max_size=4)))
            parts = [args[a:b] for a, b in zip([0, *cuts], [*cuts, len(args)], strict=True)]
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in parts]
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    stop = "tool_use" if tools else draw(st.sampled_from(["end_turn", "max_tokens"]))
    events.append(
        {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 9}}
    )
    events.append({"type": "message_stop"})
    return events


@settings(max_examples=200, deadline=None)
@given(message_events())
def test_the_messages_fold_is_what_the_anthropic_sdks_own_accumulator_makes(events: list[dict[str, Any]]) -> None:
    fold = MessagesFold()
    snapshot: Any = None
    bufs: dict[int, bytes] = {}
    for event in events:
        fold.add(event["type"], json.loads(json.dumps(event)))
        snapshot = accumulate_event(event=EVENTS.validate_python(event), current_snapshot=snapshot, json_bufs=bufs)
    assert fold.complete
    status, body = fold.result()
    assert status == 200
    ours = anthropic.types.Message.model_validate(body)
    assert ours.model_dump() == anthropic.types.Message.model_validate(snapshot.model_dump()).model_dump()


def test_a_call_that_cannot_be_rebuilt_from_its_stream_is_sent_as_it_is() -> None:
    assert chat_streamed({"model": "m", "n": 2}) is None
    assert chat_streamed({"model": "m", "logprobs": True}) is None
    assert chat_streamed({"model": "m", "stream": True}) is None
    assert chat_streamed({"model": "m", "modalities": ["text", "audio"]}) is None
    carried = chat_streamed({"model": "m", "stream_options": {"x": 1}})
    assert carried == {"model": "m", "stream": True, "stream_options": {"x": 1, "include_usage": True}}
    assert messages_streamed({"model": "m", "stream": True}) is None
    fold = ChatFold()
    fold.add("message", {"error": {"code": 400, "message": "context too long"}})
    assert fold.result() == (400, {"error": {"code": 400, "message": "context too long"}})
    messages = MessagesFold()
    messages.add("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    assert messages.result()[0] == 529 and not messages.complete


# -- end to end: the same answer, plainly and carried --------------------------------------------

SCRIPT = [
    {"reasoning": "think "},
    {"reasoning": "hard"},
    {"content": "Hello "},
    {"content": "world"},
    {"tool": 0, "id": "call_a", "name": "get_weather", "arguments": '{"city": '},
    {"tool": 0, "arguments": '"Paris"}'},
]
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.0) as s:
        s.behavior.script = SCRIPT
        yield s


def test_a_carried_openai_call_parses_as_the_plain_one(server: FakeOpenAIServer) -> None:
    answers = []
    for carry in (False, True):
        client = openai.OpenAI(
            base_url=server.base_url, api_key="k", http_client=sdk.http_client(carry_plain_calls=carry)
        )
        with sdk.stop_on(threading.Event()):
            answers.append(client.chat.completions.create(model="fake-model", messages=CHAT))  # type: ignore[arg-type]
        assert server.last.body.get("stream", False) is carry
        client.close()
    plain, carried = (a.model_dump(exclude={"id", "created", "system_fingerprint"}) for a in answers)
    assert carried == plain
    assert answers[1].choices[0].message.tool_calls[0].function.arguments == '{"city": "Paris"}'  # type: ignore[index]


def test_a_carried_anthropic_call_parses_as_the_plain_one(server: FakeOpenAIServer) -> None:
    # (the fake's Messages stream sends no signature_delta for a thinking block, while its plain
    # answer has a signature: the answer here has none)
    server.behavior.script = [p for p in SCRIPT if "reasoning" not in p]
    answers = []
    for carry in (False, True):
        client = anthropic.Anthropic(
            base_url=server.url, api_key="k", http_client=sdk.http_client(carry_plain_calls=carry)
        )
        answers.append(client.messages.create(model="fake-model", max_tokens=50, messages=CHAT))  # type: ignore[arg-type]
        assert server.last.body.get("stream", False) is carry
        client.close()
    plain, carried = (a.model_dump(exclude={"id"}) for a in answers)
    assert carried == plain


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_async_carried_call_and_an_error_on_its_stream(server: FakeOpenAIServer, anyio_backend: str) -> None:
    """Async too; a server that fails before the stream is the SDK's own typed status error (a 400
    stays a 400); a stream the server cuts mid-answer is a dropped connection the SDK retries."""
    client = openai.AsyncOpenAI(
        base_url=server.base_url, api_key="k", http_client=sdk.async_http_client(), max_retries=1
    )
    answer = await client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "Hello world" and server.last.body["stream"] is True
    server.inject("status_400")
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    server.behavior.script = None
    server.inject("close_without_done", 2)
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=5)  # type: ignore[arg-type]
    assert len(server.requests()) == 4  # the cut stream was tried again, as a dropped connection is
    await client.close()
