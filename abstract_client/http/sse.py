"""A pure Server-Sent Events decoder: bytes in, events out (sans-io, after h11's style).

Follows the WHATWG event-stream rules: lines end with CRLF, LF or CR (also split across chunks);
``:`` starts a comment (llama-server's keep-alive pings); ``data:`` lines join with ``\\n``; a
blank line dispatches; a block with no data dispatches nothing; an unfinished block at end of
input is dropped. Three deliberate strictnesses, because a token stream is never legitimately like
this: invalid UTF-8, a line longer than ``max_line_bytes`` and an event whose data lines add up
to more than ``max_event_bytes`` (300 ``data:`` lines of 1 MiB with no blank line held 300 MiB)
raise ``ProviderProtocolError``. Nothing else can be raised, whatever the bytes (fuzzed with
Hypothesis).
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import ProviderProtocolError
from .holdback import HoldsBackErrors

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "DEFAULT_MAX_LINE_BYTES", "SSEDecoder", "SSEEvent"]

DEFAULT_MAX_LINE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024
_BOM = b"\xef\xbb\xbf"


class SSEEvent(NamedTuple):
    """One server-sent event: its type, data (lines joined), id and retry."""

    # a NamedTuple, not a frozen dataclass: built once per token, and a frozen dataclass's
    # __init__ costs twice as much (object.__setattr__ per field)
    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None


class SSEDecoder(HoldsBackErrors[SSEEvent]):
    """``feed(chunk)`` returns the events ``chunk`` completes; bad bytes raise after the events
    before them (:class:`~.holdback.HoldsBackErrors`), at the next ``feed`` or at :meth:`end`."""

    def __init__(
        self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    ) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self._data_chars = 0  # the characters of the block's data lines so far
        self._buf = bytearray()
        self._skip_lf = False  # the previous chunk ended with CR; a leading LF belongs to it
        self._bom_checked = False
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self._retry: int | None = None
        self.comments = 0  # keep-alive pings seen (useful for idle diagnostics)

    def end(self) -> None:
        """End of input: raise what ``feed`` held back, or the cut if it ended inside a frame."""
        self._raise_held()
        if self.has_partial:
            raise ProviderProtocolError("the stream ended in the middle of an SSE frame")

    def _feed(self, chunk: bytes, events: list[SSEEvent]) -> None:
        if not chunk:
            return
        if not self._skip_lf and self._bom_checked and b"\n" in chunk:
            # a line cut by the previous read is completed here, so the fast path stays taken
            # when reads do not fall on line ends (they almost never do)
            joined = bytes(self._buf) + chunk if self._buf else chunk
            if self._feed_lf_only(joined, events):
                return
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        self._buf += chunk
        if not self._bom_checked:
            # A UTF-8 BOM is skipped only at the very start of the stream.
            if len(self._buf) < 3 and _BOM.startswith(bytes(self._buf)):
                return  # could still be a BOM: wait for more bytes
            if self._buf.startswith(_BOM):
                del self._buf[:3]
            self._bom_checked = True
        start = 0
        buf = self._buf
        n = len(buf)
        while True:
            lf = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, lf if lf != -1 else n)
            end = cr if cr != -1 else lf
            if end == -1:
                break
            line = bytes(buf[start:end])
            if cr != -1:
                if end + 1 < n:
                    start = end + 2 if buf[end + 1] == 0x0A else end + 1
                else:
                    start = end + 1
                    self._skip_lf = True
            else:
                start = end + 1
            event = self._line(self._decode(line))
            if event is not None:
                events.append(event)
        del buf[:start]
        if len(buf) > self.max_line_bytes:
            raise ProviderProtocolError(f"SSE line longer than {self.max_line_bytes} bytes")

    def _feed_lf_only(self, chunk: bytes, events: list[SSEEvent]) -> bool:
        """The common case, in one pass: nothing buffered, LF line endings, complete UTF-8 lines.
        Returns False (having consumed nothing) when the general path must handle ``chunk``."""
        last = chunk.rfind(b"\n")
        if last == -1 or b"\r" in chunk or len(chunk) > self.max_line_bytes:
            return False
        try:
            text = chunk[: last + 1].decode("utf-8")
        except UnicodeDecodeError:
            return False  # the general path reports it, line by line
        lines = text.split("\n")
        lines.pop()  # the empty string after the last LF
        data = self._data
        for line in lines:
            if line[:6] == "data: ":  # the line of a token stream, inlined
                data.append(line[6:])
                self._data_chars += len(line) - 6
                if self._data_chars > self.max_event_bytes:
                    self._too_large()
            elif line:
                self._line(line)  # returns an event only for a blank line
            elif data:
                events.append(self._dispatch())  # type: ignore[arg-type]  # data: not None
            else:
                self._event = ""
        self._buf[:] = chunk[last + 1 :]
        return True

    def close(self) -> list[SSEEvent]:
        """End of input. A block without its blank line is incomplete and dropped (per spec)."""
        self._buf.clear()
        self._data.clear()
        self._data_chars = 0
        self._event = ""
        return []

    @property
    def has_partial(self) -> bool:
        """True when input ended in the middle of a line or an event block."""
        return bool(self._buf) or bool(self._data) or self._error is not None

    def _decode(self, raw: bytes) -> str:
        if len(raw) > self.max_line_bytes:
            raise ProviderProtocolError(f"SSE line longer than {self.max_line_bytes} bytes")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProviderProtocolError(f"SSE stream is not valid UTF-8: {exc.reason}") from None

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":
            self.comments += 1
            return None
        name, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._data_chars += len(value)
            if self._data_chars > self.max_event_bytes:
                self._too_large()
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)
        return None

    def _too_large(self) -> None:
        self._data.clear()  # what it held is let go now, not when the caller gives up
        self._data_chars = 0
        raise ProviderProtocolError(f"SSE event larger than {self.max_event_bytes} bytes")

    def _dispatch(self) -> SSEEvent | None:
        self._data_chars = 0
        if not self._data:
            self._event = ""
            return None
        data = self._data
        event = SSEEvent(
            self._event or "message", data[0] if len(data) == 1 else "\n".join(data), self._last_id, self._retry
        )
        data.clear()
        self._event = ""
        return event
