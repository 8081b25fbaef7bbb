"""A plain (non-streamed) call carried over its dialect's stream, and folded back into the body
the server would have sent: what lets a stop end it at the server's next token, with the text so
far (a server checks a plain request's socket rarely: llama-server ~0.5 s late).

A :class:`Carry` is a dialect's property (``Wire.carry``): ``streamed(body)`` is a plain
request's streamed twin, or None where the plain answer could not be rebuilt faithfully (``n``
> 1, log-probabilities, audio); ``fold()`` a fresh sans-io :class:`Fold` fed each event's JSON
and asked for the body at the end. The chat fold merges ``chat.completion.chunk`` deltas
(strings joined, tool calls by index, any other field as last sent); the Messages fold replays
``message_start`` … ``message_stop``. An ``error`` event becomes the error body and status the
plain call would have had.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["CHAT_CARRY", "MESSAGES_CARRY", "Carry", "ChatFold", "Fold", "MessagesFold"]


class Fold(Protocol):
    def add(self, event: str, data: Any) -> None:
        """One event of the stream: its SSE event name and its JSON (``"[DONE]"`` as it is)."""

    @property
    def complete(self) -> bool:
        """The stream said it ended (else the server went away mid-answer)."""

    def result(self) -> tuple[int, dict[str, Any]]:
        """The status and body the plain call would have had."""


@dataclass(frozen=True, slots=True)
class Carry:
    streamed: Callable[[dict[str, Any]], dict[str, Any] | None]
    fold: Callable[[], Fold]


def _error_status(error: Any) -> int:
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) and 400 <= code <= 599 else 500


# -- chat completions ----------------------------------------------------------------------------


def chat_streamed(body: dict[str, Any]) -> dict[str, Any] | None:
    if body.get("stream") or body.get("n", 1) not in (1, None) or body.get("logprobs"):
        return None
    if "audio" in (body.get("modalities") or ()):
        return None
    options = body.get("stream_options")
    return {
        **body,
        "stream": True,
        "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True},
    }


class ChatFold:
    _HEAD = ("id", "created", "model", "system_fingerprint", "service_tier")

    def __init__(self) -> None:
        self._done = False
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: Any = None
        self._error: Any = None

    def add(self, event: str, data: Any) -> None:
        if data == "[DONE]":
            self._done = True
            return
        if not isinstance(data, dict):
            return
        if "error" in data:
            self._error = self._error or data["error"]
            return
        for key in self._HEAD:
            if key in data and key not in self._head:
                self._head[key] = data[key]
        if data.get("usage"):
            self._usage = data["usage"]
        for choice in data.get("choices") or ():
            if isinstance(choice, dict):
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        folded = self._choices.setdefault(
            index,
            {
                "index": index,
                "message": {"role": "assistant", "content": None},
                "logprobs": None,
                "finish_reason": None,
            },
        )
        message = folded["message"]
        for key, value in (choice.get("delta") or {}).items():
            if key == "tool_calls" and isinstance(value, list):
                _merge_tool_calls(message.setdefault("tool_calls", []), value)
            elif isinstance(value, str) and key != "role":
                message[key] = (message.get(key) or "") + value
            elif value is not None:
                message[key] = value
        if choice.get("finish_reason") is not None:
            folded["finish_reason"] = choice["finish_reason"]

    @property
    def complete(self) -> bool:
        return self._done or any(c["finish_reason"] is not None for c in self._choices.values())

    def result(self) -> tuple[int, dict[str, Any]]:
        if self._error is not None:
            return _error_status(self._error), {"error": self._error}
        choices = [_plain_choice(self._choices[i]) for i in sorted(self._choices)]
        return 200, {**self._head, "object": "chat.completion", "choices": choices, "usage": self._usage}


def _plain_choice(choice: dict[str, Any]) -> dict[str, Any]:
    """A folded choice as a plain answer has it: its tool calls carry no stream ``index``."""
    calls = choice["message"].get("tool_calls")
    if not calls:
        return choice
    plain = [{k: v for k, v in call.items() if k != "index"} for call in calls]
    return {**choice, "message": {**choice["message"], "tool_calls": plain}}


def _merge_tool_calls(calls: list[dict[str, Any]], pieces: list[Any]) -> None:
    for piece in pieces:
        if not isinstance(piece, dict):
            continue
        index = piece.get("index", len(calls))
        found = next((c for c in calls if c.get("index") == index), None)
        if found is None:
            found = {"index": index, "function": {"arguments": ""}}
            calls.append(found)
        for key, value in piece.items():
            if key == "function" and isinstance(value, dict):
                function = found["function"]
                for name, part in value.items():
                    function[name] = (function.get(name) or "") + part if isinstance(part, str) else part
            elif key != "index" and value is not None:
                found[key] = value
    for call in calls:
        call.setdefault("type", "function")


# -- Anthropic's Messages ------------------------------------------------------------------------


def messages_streamed(body: dict[str, Any]) -> dict[str, Any] | None:
    return None if body.get("stream") else {**body, "stream": True}


_ANTHROPIC_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "overloaded_error": 529,
}


class MessagesFold:
    def __init__(self) -> None:
        self._stopped = False
        self._message: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}
        self._error: Any = None

    def add(self, event: str, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type", event)
        if kind == "error":
            self._error = self._error or data.get("error", data)
        elif kind == "message_start" and isinstance(data.get("message"), dict):
            self._message = dict(data["message"])
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            self._blocks[data.get("index", len(self._blocks))] = dict(data["content_block"])
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            self._delta(data.get("index", 0), data["delta"])
        elif kind == "content_block_stop":
            index = data.get("index", 0)
            if index in self._json and index in self._blocks:
                try:
                    self._blocks[index]["input"] = json.loads(self._json.pop(index) or "{}")
                except ValueError:
                    pass  # kept as the server sent it: the SDK reports it as it would
        elif kind == "message_stop":
            self._stopped = True
        elif kind == "message_delta":
            self._message.update(data.get("delta") or {})
            if isinstance(data.get("usage"), dict):
                self._message["usage"] = {**(self._message.get("usage") or {}), **data["usage"]}

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + str(delta.get("partial_json", ""))
            return
        for key, value in delta.items():
            if key == "type":
                continue
            if key == "signature":
                block[key] = value
            elif isinstance(value, str):
                block[key] = (block.get(key) or "") + value

    @property
    def complete(self) -> bool:
        return self._stopped

    def result(self) -> tuple[int, dict[str, Any]]:
        if self._error is not None:
            kind = self._error.get("type") if isinstance(self._error, dict) else None
            return _ANTHROPIC_STATUS.get(str(kind), 500), {"type": "error", "error": self._error}
        body = {**self._message, "content": [self._blocks[i] for i in sorted(self._blocks)]}
        return 200, body


CHAT_CARRY = Carry(chat_streamed, ChatFold)
MESSAGES_CARRY = Carry(messages_streamed, MessagesFold)
