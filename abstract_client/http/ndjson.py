"""A pure newline-delimited JSON decoder (Ollama's native stream): bytes in, objects out.

Lines end with LF (a trailing CR is stripped); blank lines are skipped. A line that is not JSON,
not UTF-8, or longer than ``max_line_bytes`` raises ``ProviderProtocolError``; nothing else can
be raised (fuzzed with Hypothesis).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ProviderProtocolError
from .holdback import HoldsBackErrors

__all__ = ["DEFAULT_MAX_LINE_BYTES", "NDJSONDecoder"]

DEFAULT_MAX_LINE_BYTES = 4 * 1024 * 1024


class NDJSONDecoder(HoldsBackErrors[Any]):
    """``feed(chunk)`` returns the objects ``chunk`` completes; a bad line raises after the objects
    before it (:class:`~.holdback.HoldsBackErrors`), at the next ``feed`` or at ``close``."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()

    def _feed(self, chunk: bytes, out: list[Any]) -> None:
        self._buf += chunk
        start = 0
        buf = self._buf
        while True:
            end = buf.find(b"\n", start)
            if end == -1:
                break
            obj = self._parse(bytes(buf[start:end]))
            start = end + 1
            if obj is not _BLANK:
                out.append(obj)
        del buf[:start]
        if len(buf) > self.max_line_bytes:
            raise ProviderProtocolError(f"NDJSON line longer than {self.max_line_bytes} bytes")

    def close(self) -> list[Any]:
        """End of input: a last line without its newline is still parsed (or rejected)."""
        self._raise_held()
        rest, self._buf = bytes(self._buf), bytearray()
        obj = self._parse(rest)
        return [] if obj is _BLANK else [obj]

    def _parse(self, raw: bytes) -> Any:
        if len(raw) > self.max_line_bytes:
            raise ProviderProtocolError(f"NDJSON line longer than {self.max_line_bytes} bytes")
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProviderProtocolError(f"NDJSON stream is not valid UTF-8: {exc.reason}") from None
        if not text.strip():
            return _BLANK
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ProviderProtocolError(f"malformed NDJSON line: {text[:200]!r}") from exc


_BLANK = object()
