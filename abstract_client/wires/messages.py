"""Anthropic's Messages wire (``POST /v1/messages``), as Anthropic, llama-server, vLLM, Ollama
and LM Studio serve it.

Sans-io, onto the same ``StreamChunk`` / ``Completion`` as the other wires:

* request (:func:`messages_body`): system messages → the top-level ``system``; content parts →
  ``text`` / ``image`` blocks (base64 ``source``, or ``url``); an assistant turn's tool calls →
  ``tool_use`` blocks (``input`` an object); tool answers → ``tool_result`` blocks in a user
  turn (consecutive turns of one role merged: the wire alternates); tools →
  ``{name, description, input_schema}``; ``tool_choice`` → ``auto``/``any``/``none``/``tool``;
  ``stop`` → ``stop_sequences``; ``reasoning`` → ``thinking`` with a token budget;
  ``max_tokens`` is required by the wire (:data:`DEFAULT_MAX_TOKENS` when the call gives none);
* stream (:class:`MessageEvents`): ``message_start`` (model, prompt usage),
  ``content_block_start`` / ``content_block_delta`` (``text_delta``, ``thinking_delta``,
  ``input_json_delta`` for a ``tool_use`` block), ``message_delta`` (``stop_reason``, output
  usage), ``message_stop`` (the end), ``ping``, ``error`` (a typed error);
* whole (:func:`completion_from_message`): the ``message`` object's blocks.

Usage: Anthropic counts ``input_tokens`` beside ``cache_read_input_tokens`` and
``cache_creation_input_tokens``; ``Usage.prompt_tokens`` is their sum, ``cached_tokens`` the
cache reads. Malformed input is a ``ProviderProtocolError`` (fuzzed: ``tests/test_wires.py``).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ProviderProtocolError
from ..http.chunk_decoder import SSEChunks
from ..http.mapping import error_from_response
from ..http.sse import SSEEvent
from ..http.wire import load_frame
from ..images import base64_payload
from ..provider import Completion
from ..types import GenerationRequest, Message, StreamChunk, ToolCall, ToolCallDelta, Usage
from .folds import MESSAGES_CARRY
from .wire import V1, Wire, register

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FINISH",
    "MESSAGES",
    "MessageEvents",
    "MessagesChunks",
    "completion_from_message",
    "count_tokens_body",
    "messages_body",
    "messages_input",
    "usage_of",
]

DEFAULT_MAX_TOKENS = 4096  # the wire requires max_tokens; a call that gives none gets this
THINKING_BUDGET = {"low": 1024, "medium": 4096, "high": 16384, True: 4096}
# stop_reason -> the library's finish_reason (OpenAI's words, as every other wire)
FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


# -- the request -----------------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Chat content (a string or parts) as Messages content blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            image = part.get("image_url")
            url = str(image.get("url") if isinstance(image, dict) else image)
            if url.startswith("data:"):
                mime, payload = base64_payload(part, "messages")
                blocks.append({"type": "image", "source": {"type": "base64", "media_type": mime, "data": payload}})
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
        else:
            blocks.append(part)
    return blocks


def _tool_use(call: Any) -> dict[str, Any]:
    if isinstance(call, ToolCall):
        return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
    fn = call.get("function") or {}
    arguments = fn.get("arguments")
    try:
        given = json.loads(arguments) if isinstance(arguments, str) and arguments else (arguments or {})
    except ValueError:
        given = {}
    return {"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": given}


def messages_input(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """``(system, messages)`` in the Messages wire's form (see the module docstring)."""
    system = [_text_of(m.get("content")) for m in messages if m.get("role") in ("system", "developer")]
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            continue
        if role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
                "content": _text_of(message.get("content")),
            }
            role, blocks = "user", [block]
        else:
            blocks = _blocks(message.get("content"))
            if role == "assistant":
                blocks += [_tool_use(c) for c in message.get("tool_calls") or []]
            role = "assistant" if role == "assistant" else "user"
        if out and out[-1]["role"] == role:  # the wire alternates: a second turn of one role joins the first
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return ("\n\n".join(s for s in system if s) or None), out


def _tool(spec: dict[str, Any]) -> dict[str, Any]:
    fn = spec.get("function", spec)
    tool = {"name": fn.get("name"), "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}}
    if fn.get("description"):
        tool["description"] = fn["description"]
    return tool


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        return {"type": "tool", "name": name}
    return {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}.get(choice)


def messages_body(
    request: GenerationRequest, *, stream: bool, default_max_tokens: int = DEFAULT_MAX_TOKENS
) -> dict[str, Any]:
    """The ``/v1/messages`` body of ``request`` (its sampling fields and ``extra`` included)."""
    system, messages = messages_input(request.messages)
    max_tokens = request.max_tokens or default_max_tokens
    # a lane without a model name (a single-model llama-server) still sends a string, as chat does
    model = request.model or "default"
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    if system:
        body["system"] = system
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    extra = dict(request.extra)
    for key in ("top_p", "top_k"):
        if key in extra:
            body[key] = extra.pop(key)
    for key in ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "seed"):
        extra.pop(key, None)  # not the wire's: never sent as a stranger field
    if request.tools:
        body["tools"] = [_tool(t) for t in request.tools]
        choice = _tool_choice(request.tool_choice)
        if choice is not None:
            body["tool_choice"] = choice
    if request.reasoning:
        budget = min(THINKING_BUDGET.get(request.reasoning, 4096), max(1024, max_tokens - 1))
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    elif request.reasoning is False:
        body["thinking"] = {"type": "disabled"}
    if request.response_format is not None and request.response_format.schema is not None:
        body["output_format"] = {"type": "json_schema", "schema": request.response_format.schema}
    body.update(extra)
    return body


def count_tokens_body(request: GenerationRequest) -> dict[str, Any]:
    """The ``/v1/messages/count_tokens`` body (a raw prompt counts as one user turn)."""
    messages = request.messages or [{"role": "user", "content": request.prompt or ""}]
    system, turns = messages_input(messages)
    body: dict[str, Any] = {"model": request.model or "default", "messages": turns}
    if system:
        body["system"] = system
    return body


# -- the answer ------------------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_of(obj: Any) -> Usage | None:
    """A ``Usage`` from a Messages ``usage`` object (prompt = input + cache reads + cache writes)."""
    if not isinstance(obj, dict):
        return None
    parts = [_int(obj.get(k)) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
    prompt = None if parts[0] is None else sum(p or 0 for p in parts)
    return Usage(prompt_tokens=prompt, completion_tokens=_int(obj.get("output_tokens")), cached_tokens=parts[1])


def _error(event: dict[str, Any]) -> Exception:
    error = event.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    status = {"overloaded_error": 529, "rate_limit_error": 429, "not_found_error": 404}.get(str(kind), 200)
    return error_from_response(status, {"error": error if isinstance(error, dict) else {"message": str(error)}})


class MessageEvents:
    """Messages stream events → chunks, for one message (it numbers the ``tool_use`` blocks and
    keeps the prompt usage ``message_start`` announced)."""

    def __init__(self) -> None:
        self.finished = False
        self.model: str | None = None
        self._usage: dict[str, Any] = {}
        self._stop_reason: str | None = None
        self._tools: dict[int, int] = {}  # content block index -> tool-call index
        self._kinds: dict[int, str] = {}  # content block index -> its type

    def chunks(self, event: Any) -> list[StreamChunk]:
        if not isinstance(event, dict):
            raise ProviderProtocolError(f"messages stream: expected a JSON object, got {str(event)[:200]}")
        kind = event.get("type")
        if kind == "content_block_delta":
            return self._delta(event)
        if kind == "content_block_start":
            return self._start(event)
        if kind == "message_start":
            message = event.get("message")
            if not isinstance(message, dict):
                raise ProviderProtocolError(f"message_start without its message: {str(event)[:200]}")
            self.model = message.get("model") if isinstance(message.get("model"), str) else None
            if isinstance(message.get("usage"), dict):
                self._usage.update(message["usage"])
            return []
        if kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self._stop_reason = delta["stop_reason"]
            if isinstance(event.get("usage"), dict):
                self._usage.update({k: v for k, v in event["usage"].items() if v is not None})
            return []
        if kind == "message_stop":
            self.finished = True
            reason = self._stop_reason or "end_turn"
            finish = FINISH.get(reason, "stop")
            if finish == "stop" and self._tools:
                finish = "tool_calls"
            return [StreamChunk(finish_reason=finish, usage=usage_of(self._usage), model=self.model, raw=event)]
        if kind == "error":
            raise _error(event)
        return []  # ping, content_block_stop, and events a newer server adds

    def _start(self, event: dict[str, Any]) -> list[StreamChunk]:
        index, block = event.get("index"), event.get("content_block")
        if not isinstance(index, int) or not isinstance(block, dict):
            raise ProviderProtocolError(f"malformed content_block_start: {str(event)[:200]}")
        self._kinds[index] = str(block.get("type"))
        if block.get("type") == "tool_use":
            self._tools[index] = len(self._tools)
            name, call_id = block.get("name"), block.get("id")
            given = block.get("input")
            arguments = json.dumps(given) if isinstance(given, dict) and given else ""
            piece = ToolCallDelta(
                index=self._tools[index],
                id=call_id if isinstance(call_id, str) else None,
                name=name if isinstance(name, str) else None,
                arguments_fragment=arguments,
            )
            return [StreamChunk(tool_call=piece, raw=event)]
        if block.get("type") == "text" and block.get("text"):
            return [StreamChunk(delta=str(block["text"]), raw=event)]
        if block.get("type") == "thinking" and block.get("thinking"):
            return [StreamChunk(reasoning=str(block["thinking"]), raw=event)]
        return []

    def _delta(self, event: dict[str, Any]) -> list[StreamChunk]:
        index, delta = event.get("index"), event.get("delta")
        if not isinstance(delta, dict):
            raise ProviderProtocolError(f"malformed content_block_delta: {str(event)[:200]}")
        kind = delta.get("type")
        if kind == "text_delta":
            return [StreamChunk(delta=_str(delta.get("text")), raw=event)]
        if kind == "thinking_delta":
            return [StreamChunk(reasoning=_str(delta.get("thinking")), raw=event)]
        if kind == "input_json_delta":
            call = self._tools.get(index) if isinstance(index, int) else None
            if call is None:
                raise ProviderProtocolError(f"input for a block that is no tool_use: {str(event)[:200]}")
            piece = ToolCallDelta(index=call, arguments_fragment=_str(delta.get("partial_json")))
            return [StreamChunk(tool_call=piece, raw=event)]
        return []  # signature_delta, citations


def _str(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ProviderProtocolError(f"expected text, got {str(value)[:200]}")
    return value


def completion_from_message(obj: Any) -> Completion:
    """A ``Completion`` from a whole Messages ``message`` (``stream: false``)."""
    if not isinstance(obj, dict):
        raise ProviderProtocolError(f"unexpected /v1/messages body: {str(obj)[:200]}")
    if obj.get("type") == "error":
        raise _error(obj)
    content = obj.get("content")
    if not isinstance(content, list):
        raise ProviderProtocolError(f"a message without its content blocks: {str(obj)[:200]}")
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCallDelta] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(_str(block.get("text")))
        elif kind == "thinking":
            reasoning.append(_str(block.get("thinking")))
        elif kind == "tool_use":
            given = block.get("input")
            name, call_id = block.get("name"), block.get("id")
            calls.append(
                ToolCallDelta(
                    index=len(calls),
                    id=call_id if isinstance(call_id, str) else None,
                    name=name if isinstance(name, str) else None,
                    arguments_fragment=json.dumps(given if isinstance(given, dict) else {}),
                )
            )
    reason = obj.get("stop_reason")
    finish = FINISH.get(reason, "stop") if isinstance(reason, str) else "stop"
    model = obj.get("model")
    return Completion(
        content="".join(text),
        finish_reason="tool_calls" if calls and finish == "stop" else finish,
        usage=usage_of(obj.get("usage")),
        model=model if isinstance(model, str) else None,
        raw=obj,
        reasoning="".join(reasoning) or None,
        tool_calls=calls,
    )


# -- reading a stream ------------------------------------------------------------------------------


class MessagesChunks(SSEChunks):
    """A ``/v1/messages`` stream, up to ``message_stop``."""

    cut = "the messages stream ended before message_stop"

    def __init__(self) -> None:
        super().__init__()
        self._events = MessageEvents()

    def event(self, event: SSEEvent) -> list[StreamChunk]:
        chunks = self._events.chunks(load_frame(event.data))
        self.finished = self.done = self._events.finished
        return chunks


def _body(request: GenerationRequest, stream: bool) -> dict[str, Any]:
    return messages_body(request, stream=stream)


MESSAGES = register(
    Wire(
        "messages",
        "/messages",
        _body,
        MessagesChunks,
        completion_from_message,
        V1 | {"anthropic"},
        count_tokens=count_tokens_body,
        carry=MESSAGES_CARRY,
        schema_field=lambda body, schema: body.update(output_format={"type": "json_schema", "schema": schema}),
    )
)
