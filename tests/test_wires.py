"""The wires (abstract_client/wires/): each protocol's decoders turn anything a server may send
into the library's types or a ``ProviderProtocolError`` — never a ``KeyError``, an
``AttributeError`` or a ``TypeError`` from deep inside (the fuzzing found LM Studio's native
result decoder raising those on a ``stats`` or ``output`` of the wrong type). And a wire is
its own module: it imports no lane, no contract, no gateway."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abstract_client.errors import AbstractClientError, ProviderProtocolError
from abstract_client.wires import (
    chat,
    chat_server,
    lmstudio,
    messages,
    messages_server,
    ollama,
    responses,
    responses_server,
)

ROOT = Path(__file__).resolve().parent.parent

# the field names and event types the decoders look at, so that generated objects reach deep
KEYS = [
    "choices", "delta", "message", "content", "role", "tool_calls", "function", "arguments", "name", "id",
    "index", "reasoning", "reasoning_content", "finish_reason", "usage", "prompt_tokens", "completion_tokens",
    "prompt_tokens_details", "cached_tokens", "timings", "model", "data", "embedding", "predicted_ms",
    "type", "item", "item_id", "output_index", "response", "status", "output", "input_tokens", "output_tokens",
    "input_tokens_details", "text", "call_id", "error", "code", "sequence_number", "incomplete_details",
    "reason", "done", "done_reason", "prompt_eval_count", "eval_count", "eval_duration", "prompt_eval_duration",
    "thinking", "stats", "tokens_per_second", "time_to_first_token_seconds", "total_output_tokens",
    "model_instance_id", "content_block", "partial_json", "input", "stop_reason", "cache_read_input_tokens",
    "cache_creation_input_tokens", "tool_use_id",
]  # fmt: skip
EVENTS = [
    "response.created", "response.output_text.delta", "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta", "response.output_item.added", "response.output_item.done",
    "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.completed",
    "response.incomplete", "response.failed", "error", "function_call", "message", "reasoning",
    "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
    "message_stop", "ping", "text_delta", "input_json_delta", "thinking_delta", "tool_use", "text", "thinking",
    "end_turn", "max_tokens", "overloaded_error",
]  # fmt: skip
LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4),
    st.sampled_from(EVENTS),
)
JSON = st.recursive(
    LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=6)),
)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


def _events_into_chunks_or_a_typed_error(decoder: Any, events: list[Any]) -> None:
    """Feed ``events`` to a stream decoder until it raises one of our errors (anything else fails)."""
    for event in events:
        try:
            decoder.chunks(event)
        except AbstractClientError:
            return


def _typed_or_nothing(decode: Any, *args: Any) -> None:
    try:
        decode(*args)
    except AbstractClientError:
        pass


@FUZZ
@given(JSON)
def test_the_chat_wire_decodes_anything_into_chunks_or_a_typed_error(obj: Any) -> None:
    for decode in (chat.chat_chunks, chat.completion_from, chat.embeddings_from, chat.usage_from):
        _typed_or_nothing(decode, obj)


@FUZZ
@given(st.lists(JSON, max_size=6))
def test_the_responses_wire_decodes_any_event_sequence_into_chunks_or_a_typed_error(events: list[Any]) -> None:
    _events_into_chunks_or_a_typed_error(responses.ResponseEvents(), events)
    for event in events:
        _typed_or_nothing(responses.completion_from_response, event)


@FUZZ
@given(st.lists(JSON, max_size=8))
def test_the_messages_wire_decodes_any_event_sequence_into_chunks_or_a_typed_error(events: list[Any]) -> None:
    _events_into_chunks_or_a_typed_error(messages.MessageEvents(), events)
    for event in events:
        _typed_or_nothing(messages.completion_from_message, event)
        _typed_or_nothing(messages.usage_of, event)


@FUZZ
@given(JSON, st.integers(0, 3))
def test_the_ollama_wire_decodes_any_object_into_a_chunk_or_a_typed_error(obj: Any, first: int) -> None:
    _typed_or_nothing(ollama.chunk_from, obj)
    if isinstance(obj, dict):
        _typed_or_nothing(ollama.tool_calls_from, obj, first)


@FUZZ
@given(JSON, st.sampled_from(["", None]))
def test_the_lmstudio_wire_decodes_any_result_into_a_chunk_or_a_typed_error(obj: Any, delta: str | None) -> None:
    _typed_or_nothing(lmstudio.chunk_from_result, obj, delta)


def test_a_malformed_lmstudio_result_is_a_protocol_error() -> None:
    """Found by the fuzzing: ``stats: true`` was an ``AttributeError``, ``output: 5`` a ``TypeError``."""
    for result in ({"stats": True}, {"output": 5}, {"stats": "x", "output": []}):
        try:
            lmstudio.chunk_from_result(result, "")
        except ProviderProtocolError:
            continue
        raise AssertionError(f"{result} was taken")
    chunk = lmstudio.chunk_from_result({"stats": {"tokens_per_second": "fast"}, "model_instance_id": 5}, None)
    assert chunk.timings is not None and chunk.timings.tokens_per_s is None and chunk.model is None


def test_a_wire_imports_no_lane_no_contract_no_gateway() -> None:
    forbidden = ("abstract_client.providers", "abstract_client.contract", "abstract_client.gateway", "providers")
    found = []
    for path in (ROOT / "abstract_client" / "wires").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                name = ("abstract_client." + (node.module or "")) if node.level else (node.module or "")
                if node.level == 1:
                    name = "abstract_client.wires." + (node.module or "")
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    found.append(f"{path.name}: {name}")
    assert found == []


# -- the server sides (the gateway's): any body is taken or refused with a BadRequest ----------------

SERVER_KEYS = [
    "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "stream",
    "stream_options", "include_usage", "tools", "tool_choice", "response_format", "json_schema", "schema",
    "seed", "n", "prompt", "input", "instructions", "background", "max_output_tokens", "text", "format",
    "system", "role", "content", "type", "text", "image_url", "url", "source", "media_type", "data",
    "tool_use_id", "tool_call_id", "tool_calls", "function", "name", "arguments", "parameters", "input_schema",
    "id", "call_id", "output", "detail", "reasoning", "effort", "metadata", "stop_sequences", "top_k",
    "thinking", "budget_tokens", "user", "store", "logprobs", "frequency_penalty", "presence_penalty",
]  # fmt: skip
SERVER_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5000),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(["user", "assistant", "system", "tool", "developer", "text", "image_url", "input_text",
                     "input_image", "function", "function_call", "function_call_output", "message", "tool_use",
                     "tool_result", "image", "json_schema", "json_object", "auto", "none", "required", "any",
                     "base64", "image/png", "data:image/png;base64,iVBORw0KGgo="]),
)  # fmt: skip
BODY = st.recursive(
    SERVER_LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(SERVER_KEYS), inner, max_size=7)
    ),
    max_leaves=30,
)


def _taken_or_refused(decode: Any, body: Any, **kw: Any) -> None:
    try:
        decode(body, **kw)
    except chat_server.BadRequest:
        pass


@FUZZ
@given(st.dictionaries(st.sampled_from(SERVER_KEYS), BODY, max_size=8))
def test_the_server_sides_take_any_body_or_refuse_it_with_a_bad_request(body: dict[str, Any]) -> None:
    """What a client sends the gateway is read by the server side of its wire: a body it cannot
    take is a ``BadRequest`` (a 400), never a ``KeyError`` or ``TypeError`` (a 500)."""
    _taken_or_refused(chat_server.generation_args, body, chat=True)
    _taken_or_refused(chat_server.generation_args, body, chat=False)
    _taken_or_refused(responses_server.chat_body_of, body)
    _taken_or_refused(messages_server.messages_args, body)
    _taken_or_refused(messages_server.messages_args, body, count_only=True)


# -- a wire is a pair: what the server side encodes, the client side decodes to the same answer -----

PIECES = st.lists(
    st.tuples(st.sampled_from(["delta", "reasoning"]), st.text(min_size=1, max_size=8)), min_size=1, max_size=12
)


def _sse_data(stream: bytes) -> list[Any]:
    import json

    from abstract_client.http.sse import SSEDecoder

    decoder = SSEDecoder()
    events = decoder.feed(stream)
    decoder.end()
    return [json.loads(e.data) for e in events if e.data != "[DONE]"]


def _answer(chunks: list[Any]) -> tuple[str, str]:
    return "".join(c.delta for c in chunks), "".join(c.reasoning for c in chunks)


@FUZZ
@given(PIECES)
def test_each_wire_decodes_what_its_server_side_encodes(pieces: list[tuple[str, str]]) -> None:
    from abstract_client.types import GenerateResult, StreamChunk, Usage

    sent = [StreamChunk(**{kind: text}) for kind, text in pieces]
    expected = _answer(sent)
    usage = Usage(prompt_tokens=3, completion_tokens=5)
    result = GenerateResult(
        content=expected[0], finish_reason="stop", usage=usage, timings=None, model="m", provider="p", request_id="r1"
    )

    encoder = chat_server.FrameEncoder("r1", "m", 0, chat=True)
    frames = _sse_data(b"".join(encoder.encode(c) for c in sent))
    assert _answer([c for f in frames for c in chat.chat_chunks(f)]) == expected

    builder = responses_server.ResponseBuilder("resp_" + "0" * 32, "m", {}, background=False)
    events = builder.started() + [e for c in sent for e in builder.chunk(c)] + builder.finished(result)
    decoder = responses.ResponseEvents()
    assert _answer([c for e in events for c in decoder.chunks(e)]) == expected

    message = messages_server.MessageFrames("r1", "m")
    stream = b"".join(message.chunk(c) for c in sent) + message.end(result)
    decoded = messages.MessageEvents()
    assert _answer([c for e in _sse_data(stream) for c in decoded.chunks(e)]) == expected
