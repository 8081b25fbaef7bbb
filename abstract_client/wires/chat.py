"""The OpenAI chat-completions wire (``POST /v1/chat/completions``; also ``/v1/embeddings``).

Sans-io: the request's pieces in the wire's form (:func:`sampling_fields`,
:func:`wire_messages`, :func:`response_format_field`) and the answer's frames as the library's
types (:func:`chat_chunks` for a ``chat.completion.chunk``, :func:`completion_from` for a whole
``chat.completion``, :func:`embeddings_from`). Every malformed frame is a
``ProviderProtocolError`` (fuzzed: ``tests/test_wires.py``). :data:`CHAT` is the wire as a value
(``wire.py``): its body (:func:`chat_body`) and its stream decoder (:class:`ChatChunks`, driven
by ``http.wire.read_chunks``); a lane adds its server's quirks (``adjust``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from ..errors import ProviderProtocolError
from ..http.chunk_decoder import SSEChunks
from ..http.wire import load_frame
from ..provider import Completion, EmbeddingBatch
from ..types import GenerationRequest, Message, ResponseFormat, StreamChunk, ToolCall, ToolCallDelta, Usage
from .folds import CHAT_CARRY
from .timings import timings_from, usage_of_timings
from .wire import Wire, register

__all__ = [
    "CHAT",
    "ChatChunks",
    "chat_body",
    "chat_chunks",
    "completion_from",
    "embeddings_from",
    "reasoning_fields",
    "reasoning_of",
    "response_format_field",
    "sampling_fields",
    "tool_pieces",
    "usage_from",
    "wire_messages",
]


def usage_from(obj: Any) -> Usage | None:
    """A ``Usage`` from an OpenAI ``usage`` object (with llama-server's and vLLM's cached-token
    fields)."""
    if not isinstance(obj, dict):
        return None
    prompt, completion = obj.get("prompt_tokens"), obj.get("completion_tokens")
    details = obj.get("prompt_tokens_details")  # OpenAI's (and vLLM's, our gateway's) cache hits
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=prompt if isinstance(prompt, int) else None,
        completion_tokens=completion if isinstance(completion, int) else None,
        cached_tokens=cached if isinstance(cached, int) and not isinstance(cached, bool) else None,
    )


def sampling_fields(request: GenerationRequest, max_tokens_key: str = "max_tokens") -> dict[str, Any]:
    """The common sampling fields that were set, under the names most servers use."""
    fields: dict[str, Any] = {}
    for key, value in (
        (max_tokens_key, request.max_tokens),
        ("temperature", request.temperature),
        ("seed", request.seed),
        ("stop", request.stop or None),
    ):
        if value is not None:
            fields[key] = value
    return fields


def _expect_dict(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ProviderProtocolError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _first_choice(obj: dict[str, Any]) -> dict[str, Any] | None:
    choices = obj.get("choices")
    if not choices and (choices is None or choices == []):
        return None
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise ProviderProtocolError(f"malformed choices: {str(choices)[:200]}")
    return choices[0]


def _text_field(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise ProviderProtocolError(f"malformed {key}: {str(value)[:200]}")
    return value or ""


_PLAIN_DELTA = frozenset(("content", "role"))


def reasoning_of(obj: dict[str, Any]) -> str:
    """Reasoning text of a delta or message, under any of the names servers use for it."""
    return _text_field(obj, "reasoning_content") or _text_field(obj, "reasoning")


def tool_pieces(items: Any) -> list[ToolCallDelta]:
    """``tool_calls`` of a delta or message as pieces (a message's are whole calls)."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise ProviderProtocolError(f"malformed tool_calls: {str(items)[:200]}")
    pieces = []
    for position, item in enumerate(items):
        fn = item.get("function") if isinstance(item, dict) else None
        if not isinstance(fn, dict):
            raise ProviderProtocolError(f"malformed tool call: {str(item)[:200]}")
        index = item.get("index", position)
        arguments = fn.get("arguments")
        if isinstance(arguments, dict):  # some servers send an object, not its JSON text
            arguments = json.dumps(arguments)
        name, call_id = fn.get("name"), item.get("id")
        pieces.append(
            ToolCallDelta(
                index=index if isinstance(index, int) else position,
                id=call_id if isinstance(call_id, str) and call_id else None,
                name=name if isinstance(name, str) and name else None,
                arguments_fragment=arguments if isinstance(arguments, str) else "",
            )
        )
    return pieces


def chat_chunks(obj: Any) -> list[StreamChunk]:
    """Map one ``chat.completion.chunk``: one chunk, or one per tool-call piece it carries."""
    obj = _expect_dict(obj, "stream chunk")
    choice = _first_choice(obj)
    delta_text = reasoning = ""
    finish = None
    pieces: list[ToolCallDelta] = []
    if choice is not None:
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise ProviderProtocolError(f"malformed delta: {str(delta)[:200]}")
        delta_text = _text_field(delta, "content")
        if not _PLAIN_DELTA.issuperset(delta):  # the hot path is {"content": ...} (+ "role")
            reasoning = reasoning_of(delta)
            pieces = tool_pieces(delta.get("tool_calls"))
        finish = choice.get("finish_reason")
    usage, timings, model = obj.get("usage"), obj.get("timings"), obj.get("model")
    chunk = StreamChunk(
        delta=delta_text,
        reasoning=reasoning,
        tool_call=pieces[0] if pieces else None,
        finish_reason=finish if isinstance(finish, str) else None,
        # most chunks carry neither; llama-server's may carry its count so far in timings
        usage=usage_from(usage) if usage is not None else None if timings is None else usage_of_timings(timings),
        timings=None if timings is None else timings_from(timings),
        model=model if isinstance(model, str) else None,
        raw=obj,
    )
    if len(pieces) <= 1:
        return [chunk]
    extra = [StreamChunk(tool_call=piece, raw=obj) for piece in pieces[1:-1]]
    last = replace(chunk, delta="", reasoning="", tool_call=pieces[-1])
    first = replace(chunk, finish_reason=None, usage=None, timings=None)
    return [first, *extra, last]


def completion_from(obj: Any) -> Completion:
    """A ``Completion`` from an OpenAI chat or text completion body."""
    obj = _expect_dict(obj, "completion")
    choice = _first_choice(obj)
    if choice is None:
        raise ProviderProtocolError("completion without choices")
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        raise ProviderProtocolError(f"malformed message: {str(message)[:200]}")
    return Completion(
        content=_text_field(message, "content"),
        finish_reason=choice.get("finish_reason"),
        usage=usage_from(obj.get("usage")),
        timings=timings_from(obj.get("timings")),
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
        raw=obj,
        reasoning=reasoning_of(message) or None,
        tool_calls=tool_pieces(message.get("tool_calls")),
    )


def embeddings_from(obj: Any) -> EmbeddingBatch:
    """Map an OpenAI-style ``/embeddings`` answer (``data[i].embedding``, by ``index``)."""
    obj = _expect_dict(obj, "embeddings")
    data = obj.get("data")
    if not isinstance(data, list):
        raise ProviderProtocolError(f"embeddings without data: {str(obj)[:200]}")
    indexed: list[tuple[int, list[float]]] = []
    for position, item in enumerate(data):
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(vector, list) or not all(isinstance(x, (int, float)) for x in vector):
            raise ProviderProtocolError(f"malformed embedding #{position}: {str(item)[:200]}")
        index = item.get("index", position)
        indexed.append((index if isinstance(index, int) else position, [float(x) for x in vector]))
    indexed.sort(key=lambda pair: pair[0])
    return EmbeddingBatch(
        vectors=[vector for _, vector in indexed],
        usage=usage_from(obj.get("usage")),
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
    )


class ChatChunks(SSEChunks):
    """A chat-completions stream (or another ``mapping`` of its frames, such as ``/v1/completions``
    text chunks), ending at ``[DONE]``; one that ends without it is whole only if a
    ``finish_reason`` came."""

    cut = "the stream ended before its final frame ([DONE] or a finish_reason)"

    def __init__(self, mapping: Callable[[Any], StreamChunk] | None = None) -> None:
        super().__init__()
        self._mapping = mapping

    def feed(self, data: bytes) -> Iterator[StreamChunk]:
        # one loop, no call per event: the gateway pays this path for every upstream chunk
        mapping = self._mapping
        for event in self._sse.feed(data):
            if event.data.strip() == "[DONE]":
                self.done = True
                return
            frame = load_frame(event.data)
            for chunk in chat_chunks(frame) if mapping is None else (mapping(frame),):
                if chunk.finish_reason is not None:
                    self.finished = True
                yield chunk


def reasoning_fields(reasoning: bool | str) -> dict[str, Any]:
    """The chat template's ``enable_thinking`` switch (Qwen3-style templates on llama-server and
    vLLM), and ``reasoning_effort`` for a level."""
    fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": reasoning is not False}}
    if isinstance(reasoning, str):
        fields["reasoning_effort"] = reasoning
    return fields


def chat_body(request: GenerationRequest, stream: bool) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body of ``request``: sampling, ``tools``/``tool_choice``,
    ``response_format``, the reasoning switch, and the request's ``extra`` fields."""
    body: dict[str, Any] = {"model": request.model or "default", "messages": wire_messages(request.messages)}
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(sampling_fields(request))
    if request.tools:
        body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
    if request.response_format is not None:
        body["response_format"] = response_format_field(request.response_format)
    if request.reasoning is not None:
        body.update(reasoning_fields(request.reasoning))
    body.update(request.extra)
    return body


def response_format_field(fmt: ResponseFormat) -> dict[str, Any]:
    """The ``response_format`` body field for a request's structured output, in the server's dialect."""
    if fmt.schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema, "strict": True}}


def wire_messages(messages: list[Message]) -> list[Any]:
    """Messages as the /v1 wire takes them: ``ToolCall`` objects in an assistant turn become
    their wire form (everything else is already in it)."""
    out: list[Any] = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls and any(isinstance(c, ToolCall) for c in calls):
            message = {**message, "tool_calls": [c.to_message() if isinstance(c, ToolCall) else c for c in calls]}
        out.append(message)
    return out


CHAT = register(Wire("chat", "/chat/completions", chat_body, ChatChunks, completion_from, carry=CHAT_CARRY))
