"""Splitting a tagged span out of an in-process model's text, sans-io: ``<think>…</think>``
(reasoning), and the same machine with other tags for tool calls (``<tool_call>…</tool_call>``).

Text is fed piece by piece (a tag may be split across pieces); each ``feed`` returns
``(outside, inside)`` ready to hand out. Text that could still be the start of a tag is held
back until the next piece decides it; ``flush`` releases it at the end.
"""

from __future__ import annotations

__all__ = ["TagSplitter"]


class TagSplitter:
    """Splits streamed text into what is inside and outside a pair of tags (``<think>`` ...
    ``</think>``), tags split across pieces included."""

    __slots__ = ("_held", "_inside", "end", "start")

    def __init__(self, start: str = "<think>", end: str = "</think>", *, inside: bool = False) -> None:
        self.start, self.end = start, end
        self._inside = inside  # templates that open the think block in the prompt start inside
        self._held = ""

    @property
    def inside(self) -> bool:
        return self._inside

    def feed(self, text: str) -> tuple[str, str]:
        content: list[str] = []
        reasoning: list[str] = []
        buf = self._held + text
        self._held = ""
        while buf:
            tag = self.end if self._inside else self.start
            out = reasoning if self._inside else content
            at = buf.find(tag)
            if at >= 0:
                out.append(buf[:at])
                buf = buf[at + len(tag) :]
                self._inside = not self._inside
                continue
            keep = _partial_suffix(buf, tag)
            out.append(buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            break
        return "".join(content), "".join(reasoning)

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return ("", held) if self._inside else (held, "")


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
