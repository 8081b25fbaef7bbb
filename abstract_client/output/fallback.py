"""A forced tool call on a model without native tool calling, carried as schema-constrained
text and turned back into tool-call pieces as it streams (sans-io: chunks in, chunks out).
``contract/answer.py`` decides when a call needs it."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

from ..types import StreamChunk, ToolCall, ToolCallDelta
from .tool_calls import ToolCallAssembler

__all__ = ["ToolFallback"]


class ToolFallback:
    """A forced call carried as constrained text: one tool → the text IS its arguments (handed
    out as tool-call pieces as it streams); several → ``{"name", "arguments"}``, parsed at the
    end (nothing of it is handed out before)."""

    def __init__(self, tools: list[dict[str, object]], wrapped: bool) -> None:
        self.wrapped = wrapped
        self.name = None if wrapped else str(tools[0]["function"]["name"])  # type: ignore[index]
        self.id = f"call_{uuid.uuid4().hex[:24]}"
        self._text: list[str] = []
        self._started = False

    def reset(self) -> None:
        self._text.clear()
        self._started = False

    def map(self, chunk: StreamChunk, tools: ToolCallAssembler) -> StreamChunk:
        delta = None
        if chunk.delta:
            self._text.append(chunk.delta)
            if not self.wrapped:
                first = not self._started
                self._started = True
                delta = ToolCallDelta(
                    0, self.id if first else None, self.name if first else None, arguments_fragment=chunk.delta
                )
        finish = chunk.finish_reason
        if finish is not None and self.wrapped:
            whole = self._parse_wrapped()
            if whole is not None:
                tools.add_whole([whole])
        if finish is not None and not self.wrapped and not self._started:
            tools.feed(ToolCallDelta(0, self.id, self.name))  # a call without arguments text
        return replace(chunk, delta="", tool_call=delta)

    def _parse_wrapped(self) -> ToolCall | None:
        try:
            value = json.loads("".join(self._text))
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        args = value.get("arguments")
        if not isinstance(args, dict):
            return None
        return ToolCall(id=self.id, name=value["name"], arguments=args, arguments_json=json.dumps(args))

    def partial(self) -> ToolCallDelta | None:
        text = "".join(self._text)
        return ToolCallDelta(0, self.id, None, arguments_fragment=text) if text else None

    def raw_text(self) -> str:
        return "".join(self._text)
