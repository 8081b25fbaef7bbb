"""Assembling streamed tool calls, sans-io: pieces in, complete calls out.

Servers stream a call as pieces (``index``, an ``id`` and ``name`` once, then raw JSON text of
the arguments). A call is complete when its arguments parse as a JSON object (an object cannot
grow after its closing brace), or, for a call with no arguments text, when a later call started
or the answer finished. After a stop only complete calls are handed out; the one being written
is kept aside as raw text, never as a call.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..types import ToolCall, ToolCallDelta

__all__ = ["ToolCallAssembler"]


@dataclass(slots=True)
class _Pending:
    index: int
    id: str | None = None
    name: str | None = None
    fragments: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.fragments)

    def parse(self, finished: bool) -> ToolCall | None:
        """The call, if it is complete; ``finished``: nothing more will come for it."""
        if not self.name:
            return None
        text = self.text
        if not text.strip():
            if not finished:
                return None
            args: Any = {}
        else:
            try:
                args = json.loads(text)
            except ValueError:
                return None
            if not isinstance(args, dict):
                return None
        return ToolCall(
            id=self.id or f"call_{uuid.uuid4().hex[:24]}",
            name=self.name,
            arguments=args,
            arguments_json=text if text.strip() else "{}",
        )


class ToolCallAssembler:
    """Feed it every ``ToolCallDelta`` of one answer (or the complete calls of a backend that
    sends whole calls); ask it for complete calls and for the incomplete one."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: dict[int, _Pending] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def clear(self) -> None:
        self._calls.clear()

    def feed(self, delta: ToolCallDelta) -> None:
        pending = self._calls.get(delta.index)
        if pending is None:
            pending = self._calls[delta.index] = _Pending(delta.index)
        if delta.id:
            pending.id = delta.id
        if delta.name:
            pending.name = delta.name
        if delta.arguments_fragment:
            pending.fragments.append(delta.arguments_fragment)

    def add_whole(self, calls: list[ToolCall]) -> None:
        """Whole calls from a backend that sends them at once (Ollama, a plain completion)."""
        for call in calls:
            index = len(self._calls)
            self._calls[index] = _Pending(index, call.id, call.name, [call.arguments_json])

    def _ordered(self) -> list[_Pending]:
        return [self._calls[i] for i in sorted(self._calls)]

    def complete(self, *, finished: bool) -> list[ToolCall]:
        """The complete calls, in order. ``finished``: the answer ended normally (every call is
        then final, and the caller checks that each parsed: see :meth:`unparsed`)."""
        out = []
        ordered = self._ordered()
        for position, pending in enumerate(ordered):
            later_started = position < len(ordered) - 1
            call = pending.parse(finished or later_started)
            if call is not None:
                out.append(call)
        return out

    def incomplete(self) -> ToolCallDelta | None:
        """The call that was still being written (its raw text so far), if any."""
        ordered = self._ordered()
        for position, pending in enumerate(ordered):
            if pending.parse(position < len(ordered) - 1) is None:
                return ToolCallDelta(
                    index=pending.index, id=pending.id, name=pending.name, arguments_fragment=pending.text
                )
        return None

    def unparsed(self) -> list[ToolCallDelta]:
        """Calls of a finished answer whose arguments are not a JSON object."""
        return [
            ToolCallDelta(index=p.index, id=p.id, name=p.name, arguments_fragment=p.text)
            for p in self._ordered()
            if p.parse(True) is None
        ]
