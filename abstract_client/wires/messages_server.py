"""The gateway's side of Anthropic's Messages wire (``POST /v1/messages``): a request body as
the library's call, and the answer as Anthropic's message or its stream of events.

Sans-io. The client side of the same wire is ``abstract_client/wires/messages.py``.

* request (:func:`messages_args`): ``system`` (a string or text blocks) → a system message;
  ``text`` / ``image`` blocks → content parts; an assistant turn's ``tool_use`` blocks → its
  ``tool_calls``; a user turn's ``tool_result`` blocks → ``tool`` messages (before the turn's
  other content, in order); ``thinking`` blocks of earlier turns are dropped (never sent back to
  a model); tools' ``input_schema`` → ``parameters``; ``tool_choice`` ``auto``/``any``/``none``/
  ``tool``; ``stop_sequences`` → ``stop``; ``thinking`` → ``reasoning``. ``max_tokens`` is
  required, as Anthropic's API requires it.
* answer (:func:`message_body`, :class:`MessageFrames`): ``message_start`` (with ``usage``: some
  clients fail without it), one content block per kind in the order they come (``thinking``,
  ``text``, each ``tool_use`` streamed as ``input_json_delta``), ``message_delta`` with
  ``stop_reason`` and the usage, ``message_stop``; a failure after the first event is an
  ``error`` event.
* errors (:func:`anthropic_error_body`): ``{"type": "error", "error": {"type", "message"}}``
  with Anthropic's types (``overloaded_error`` for a busy backend).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..types import GenerateResult, StreamChunk, Usage
from .chat_server import MAX_MESSAGES, BadRequest, _check_sizes, model_field, shaped_error

__all__ = [
    "MessageFrames",
    "anthropic_error_body",
    "anthropic_shape",
    "message_body",
    "messages_args",
    "stop_reason_of",
]

_MAX_INT = 2**31 - 1
MAX_STOP_SEQUENCES = 64  # Anthropic's own bound is not published; what an agent sends is a handful
MAX_STOP_SEQUENCE_CHARS = 1_000
_VISIBLE = re.compile(r"\S")  # the OpenAPI document's pattern for a stop sequence, read alike

_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",  # not Anthropic's (a stopped request): its client has usually left
    503: "overloaded_error",
}


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise BadRequest(f"{where}: only text blocks are taken here")
            texts.append(block["text"])
        return "\n\n".join(texts)
    raise BadRequest(f"{where} must be a string or a list of text blocks")


_BILLING = "x-anthropic-billing-header:"


def _without_billing(content: Any) -> Any:
    """A system prompt without Claude Code's attribution block (``x-anthropic-billing-header:
    cc_version=…``): metadata for Anthropic's billing, not an instruction, and a line that varies
    at the very top of the prompt would defeat every prefix cache behind the gateway."""
    if isinstance(content, list):
        return [b for b in content if not (isinstance(b, dict) and str(b.get("text", "")).startswith(_BILLING))]
    return content


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise BadRequest(f"{where}: an image block needs a source")
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        mime = source.get("media_type")
        if not isinstance(mime, str) or not mime.startswith("image/"):
            raise BadRequest(f"{where}: media_type must be an image type")
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{source['data']}"}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise BadRequest(f"{where}: an image source is base64 (media_type, data) or url")


def _turn(message: Any, i: int) -> list[dict[str, Any]]:
    """One Messages turn as the library's messages (a user turn's tool results come first)."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{where} must be an object")
    role, content = message.get("role"), message.get("content")
    if role == "system":  # a system turn in the conversation (Claude Code sends one after the first user turn)
        return [{"role": "system", "content": _text(_without_billing(content), f"{where}.content")}]
    if role not in ("user", "assistant"):
        raise BadRequest(f"{where}.role must be user, assistant or system")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of blocks")
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        here = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append(_image_part(block, here))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise BadRequest(f"{here}: a tool_use block needs an id and a name")
            given = block.get("input")
            if not isinstance(given, dict):
                raise BadRequest(f"{here}: a tool_use block's input must be an object")
            try:  # no lone surrogate anywhere inside: it cannot be sent as UTF-8
                arguments = json.dumps(given, ensure_ascii=False)
                arguments.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{here}: a tool_use block's input holds text that is not valid Unicode") from None
            function = {"name": block["name"], "arguments": json.dumps(given)}
            calls.append({"id": block["id"], "type": "function", "function": function})
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise BadRequest(f"{here}: a tool_result block needs its tool_use_id")
            answer = block.get("content", "")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": _text(answer, here)})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            needed = "thinking" if kind == "thinking" else "data"
            if not isinstance(block.get(needed), str) or not isinstance(block.get("signature", ""), str):
                raise BadRequest(f"{here}: a {kind} block needs its {needed} (a string)")
            continue  # an earlier turn's reasoning is not sent back to the model
        else:
            raise BadRequest(f"{here}: a {str(kind)[:40]!r} block is not taken in a {role} turn")
    out: list[dict[str, Any]] = list(results)
    if parts or calls or not results:
        turn: dict[str, Any] = {
            "role": role,
            "content": parts if len(parts) != 1 or parts[0]["type"] != "text" else parts[0]["text"],
        }
        if calls:
            turn["tool_calls"] = calls
            if not parts:
                turn["content"] = None
        out.append(turn)
    return out


def _check_tool_pairs(messages: list[dict[str, Any]]) -> None:
    """Every ``tool_use`` answered by a ``tool_result`` in the next turn, and every result
    answering one, each id once — as Anthropic's API requires. A history that breaks the pairing
    would reach the model as a conversation no template renders faithfully. An assistant turn
    that ends the conversation may leave its calls unanswered (they are being answered now)."""
    seen: set[str] = set()
    waiting: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            call_id = message["tool_call_id"]
            if call_id not in waiting:
                raise BadRequest(f"a tool_result answers {call_id[:80]!r}, which no tool_use of the turn before made")
            waiting.discard(call_id)
            continue
        if message["role"] == "system":
            continue
        if waiting:
            raise BadRequest(f"the tool_use {sorted(waiting)[0][:80]!r} has no tool_result in the turn after it")
        for call in message.get("tool_calls") or ():
            if call["id"] in seen:
                raise BadRequest(f"the tool_use id {call['id'][:80]!r} is used more than once")
            seen.add(call["id"])
            waiting.add(call["id"])


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise BadRequest(f"tools[{i}] needs a name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise BadRequest(f"tools[{i}].input_schema must be a JSON schema object")
        function: dict[str, Any] = {"name": tool["name"], "parameters": schema}
        if tool.get("description") is not None:
            if not isinstance(tool["description"], str):
                raise BadRequest(f"tools[{i}].description must be a string")
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        raise BadRequest("tool_choice must be an object")
    kind = choice.get("type")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise BadRequest("tool_choice of type tool needs a name")
        return {"type": "function", "function": {"name": choice["name"]}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind if isinstance(kind, str) else "")
    if mapped is None:
        raise BadRequest("tool_choice.type must be auto, any, tool or none")
    return mapped


def messages_args(body: Any, *, count_only: bool = False) -> tuple[dict[str, Any], bool]:
    """``(kwargs for agenerate/astream, stream?)`` of a ``/v1/messages`` body (``count_only``:
    a ``count_tokens`` body, which has no ``max_tokens``)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model_field(body)
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise BadRequest("messages must be a non-empty list")
    if len(turns) > MAX_MESSAGES:
        raise BadRequest(f"a request holds at most {MAX_MESSAGES} messages, not {len(turns)}")
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        system = _text(_without_billing(body["system"]), "system")
        if system:
            messages.append({"role": "system", "content": system})
    for i, turn in enumerate(turns):
        messages += _turn(turn, i)
    _check_tool_pairs(messages)
    kwargs: dict[str, Any] = {"messages": messages}
    if body.get("tools") is not None:
        kwargs["tools"] = _tools(body["tools"]) or None
        _check_sizes(kwargs["tools"], None)
    if body.get("tool_choice") is not None:
        choice = _tool_choice(body["tool_choice"])
        if kwargs.get("tools") or choice == "none":
            kwargs["tool_choice"] = choice
    if count_only:
        return kwargs, False
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, float) and max_tokens.is_integer():
        max_tokens = int(max_tokens)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise BadRequest("max_tokens is required: an integer")
    kwargs["max_tokens"] = max_tokens
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            kwargs[key] = body[key]
    if isinstance(kwargs.get("top_k"), float) and kwargs["top_k"].is_integer():
        kwargs["top_k"] = int(kwargs["top_k"])  # JSON Schema's integer (the document's) takes 5.0 as 5
    if "top_k" in kwargs:
        top_k = kwargs["top_k"]
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 0 <= top_k <= _MAX_INT:
            raise BadRequest(f"top_k must be an integer from 0 to {_MAX_INT}")
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise BadRequest("stop_sequences must be a list of strings")
        if len(stops) > MAX_STOP_SEQUENCES:
            raise BadRequest(f"stop_sequences holds at most {MAX_STOP_SEQUENCES} entries, not {len(stops)}")
        if not all(0 < len(s) <= MAX_STOP_SEQUENCE_CHARS and _VISIBLE.search(s) for s in stops):
            raise BadRequest(f"each stop sequence is 1 to {MAX_STOP_SEQUENCE_CHARS} characters, not only white space")
        if stops:
            kwargs["stop"] = stops
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise BadRequest("thinking.type must be enabled, disabled or adaptive")
        # a budget is the enabled kind's: a disabled thinking's is ignored, as Anthropic does
        budget = thinking.get("budget_tokens") if kind != "disabled" else None
        if isinstance(budget, float) and budget.is_integer():  # JSON's 1024.0 is an integer (as max_tokens)
            budget = int(budget)
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)):
            raise BadRequest("thinking.budget_tokens must be an integer")
        if budget is not None and not 1 <= budget < max_tokens:
            raise BadRequest(f"thinking.budget_tokens must be at least 1 and below max_tokens ({max_tokens})")
        kwargs["reasoning"] = kind != "disabled"
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise BadRequest("metadata must be an object")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false")
    return kwargs, stream


# -- the answer ------------------------------------------------------------------------------------


def stop_reason_of(finish: str | None) -> str:
    return _STOP_REASON.get(finish or "stop", "end_turn")


def _usage(usage: Usage | None) -> dict[str, int]:
    """Anthropic counts prompt tokens read from a cache apart from ``input_tokens``."""
    prompt = (usage.prompt_tokens if usage else None) or 0
    cached = (usage.cached_tokens if usage else None) or 0
    output = (usage.completion_tokens if usage else None) or 0
    return {"input_tokens": max(0, prompt - cached), "output_tokens": output, "cache_read_input_tokens": cached}


def message_body(result: GenerateResult, request_id: str, model: str) -> dict[str, Any]:
    """A whole answer as Anthropic's ``message``."""
    content: list[dict[str, Any]] = []
    if result.reasoning:
        content.append({"type": "thinking", "thinking": result.reasoning, "signature": ""})
    if result.content or not result.tool_calls:
        content.append({"type": "text", "text": result.content})
    for call in result.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
    return {
        "id": f"msg_{request_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason_of(result.finish_reason),
        "stop_sequence": None,
        "usage": _usage(result.usage),
    }


def _event(obj: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), json.dumps(obj).encode())


class MessageFrames:
    """A stream's events (``generation.StreamFrames``): content blocks opened as their kind of
    piece arrives, closed when another kind begins."""

    def __init__(self, request_id: str, model: str) -> None:
        self.request_id, self.model = request_id, model
        self.started = False
        self.index = -1  # the open block's index
        self.open: str | None = None  # "text", "thinking", or "tool<n>"

    def _start(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        message: dict[str, Any] = {
            "id": f"msg_{self.request_id}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},  # the real counts come in message_delta
        }
        # then a ping, as Anthropic's API sends one: clients take it as the stream being alive
        return _event({"type": "message_start", "message": message}) + _event({"type": "ping"})

    def _block(self, key: str, block: dict[str, Any]) -> bytes:
        if self.open == key:
            return b""
        out = self._close()
        self.index += 1
        self.open = key
        return out + _event({"type": "content_block_start", "index": self.index, "content_block": block})

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return _event({"type": "content_block_stop", "index": self.index})

    def _piece(self, key: str, block: dict[str, Any], delta: dict[str, Any] | None) -> bytes:
        """A piece of the answer: the message and its block opened where needed, then its delta."""
        out = self._start() + self._block(key, block)
        if delta is None:
            return out
        return out + _event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def chunk(self, chunk: StreamChunk) -> bytes:
        out = b""
        if chunk.reasoning:
            thinking = {"type": "thinking", "thinking": "", "signature": ""}
            out += self._piece("thinking", thinking, {"type": "thinking_delta", "thinking": chunk.reasoning})
        if chunk.delta:
            out += self._piece("text", {"type": "text", "text": ""}, {"type": "text_delta", "text": chunk.delta})
        piece = chunk.tool_call
        if piece is not None:
            call_id = piece.id or f"toolu_{self.request_id}_{piece.index}"
            block = {"type": "tool_use", "id": call_id, "name": piece.name or "", "input": {}}
            fragment = piece.arguments_fragment
            delta = {"type": "input_json_delta", "partial_json": fragment} if fragment else None
            out += self._piece(f"tool{piece.index}", block, delta)
        return out

    def end(self, result: GenerateResult) -> bytes:
        out = self._start() + self._close()
        delta = {"stop_reason": stop_reason_of(result.finish_reason), "stop_sequence": None}
        out += _event({"type": "message_delta", "delta": delta, "usage": _usage(result.usage)})
        return out + _event({"type": "message_stop"})

    def failure(self, err: Exception) -> bytes:
        return _event(anthropic_error_body(err)[1])


def anthropic_error_body(err: BaseException) -> tuple[int, dict[str, Any]]:
    """``(status, Anthropic error body)`` for an error (a stopped call's partial text kept)."""
    return shaped_error(err, anthropic_shape)


def anthropic_shape(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped error body (the gateway's own refusals: a duplicate request id, a full
    queue, a stop before the start) in Anthropic's shape."""
    error = body.get("error", {})
    shaped: dict[str, Any] = {"type": _ERROR_TYPES.get(status, "api_error"), "message": error.get("message", "")}
    if error.get("partial_text"):
        shaped["partial_text"] = error["partial_text"]
    return {"type": "error", "error": shaped}
