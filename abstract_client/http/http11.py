"""An HTTP/1.1 response, read from bytes: a pure function of what the connection delivered (sans-io).

Why not h11: h11 turns every HTTP chunk into an event, and a streamed answer is one chunk per
token, so a loaded gateway paid an event, a state-machine step and an async-generator hop per
token. This reader hands back, per socket read, every body byte that read completed — dozens of
chunks at once when the upstream is ahead — and the SSE decoder takes them in one call.

What it reads: a status line and headers (1xx interim responses skipped), then the body framed by
``Transfer-Encoding: chunked`` (extensions and trailers skipped), ``Content-Length``, or the
connection's end; none for HEAD, 204 and 304. It decides whether the connection may carry the
next request (``reusable``). Anything malformed raises :class:`HTTPProtocolError`; it never
raises anything else, whatever the bytes (``tests/test_decoders.py`` fuzzes it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["HTTPProtocolError", "ResponseHead", "ResponseReader", "MAX_HEAD_BYTES"]

MAX_HEAD_BYTES = 64 * 1024  # status line + headers (and each chunk-size or trailer section)
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(rb"[0-9]{1,18}")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

# states
_HEAD, _LENGTH, _SIZE, _DATA, _DATA_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class HTTPProtocolError(Exception):
    """The bytes are not an HTTP/1.1 response, or the connection ended inside one."""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """A response's status line and headers, as read off the wire."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    version: bytes  # b"HTTP/1.1" or b"HTTP/1.0"


class ResponseReader:
    """Feed it what the connection reads; it returns the body bytes each read completes."""

    __slots__ = ("_buf", "_method", "_remaining", "_state", "complete", "head", "keep_alive", "surplus")

    def __init__(self, method: bytes = b"POST") -> None:
        self._method = method.upper()
        self._buf = b""
        self._state = _HEAD
        self._remaining = 0
        self.head: ResponseHead | None = None
        self.complete = False  # the whole response was read
        self.keep_alive = False  # the server lets the connection carry another request
        self.surplus = False  # bytes came after the response's end: the connection is not clean

    @property
    def reusable(self) -> bool:
        """The response ended cleanly and the connection may carry the next request."""
        return self.complete and self.keep_alive and not self.surplus

    def feed(self, data: bytes) -> bytes:
        """Take the next bytes read; return the body bytes they complete (often ``b""``)."""
        if self._buf:
            data, self._buf = self._buf + data, b""
        if self._state == _HEAD:
            rest = self._read_head(data)
            if rest is None:
                return b""
            data = rest
        state = self._state
        if state == _SIZE or state == _DATA or state == _DATA_END or state == _TRAILERS:
            return self._read_chunks(data)
        if state == _LENGTH:
            if len(data) < self._remaining:
                self._remaining -= len(data)
                return data
            body, extra = data[: self._remaining], data[self._remaining :]
            self._finish(extra)
            return body
        if state == _UNTIL_CLOSE:
            return data
        if data:  # _DONE
            self.surplus = True
        return b""

    def feed_eof(self) -> None:
        """The peer closed the connection. Fine only where the body runs to the close."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            self.complete = True
        elif self._state == _HEAD:
            if self._buf:
                raise HTTPProtocolError("the connection closed in the middle of the response's headers")
            raise HTTPProtocolError("Server disconnected without sending a response.")
        elif self._state != _DONE:
            raise HTTPProtocolError("peer closed connection without sending complete message body")

    # -- the head ----------------------------------------------------------------------------

    def _read_head(self, data: bytes) -> bytes | None:
        while True:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > MAX_HEAD_BYTES:
                    raise HTTPProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
                self._buf = data
                return None
            if end > MAX_HEAD_BYTES:
                raise HTTPProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
            head = _parse_head(data[:end])
            data = data[end + 4 :]
            if 100 <= head.status < 200:
                if head.status == 101:
                    raise HTTPProtocolError("unexpected 101 Switching Protocols")
                continue  # an interim response (100 Continue, 103 Early Hints): the real one follows
            self.head = head
            self._frame(head)
            return data

    def _frame(self, head: ResponseHead) -> None:
        # RFC 9112 section 6.3, in its order
        connection = b""
        encoding: bytes | None = None
        lengths: list[bytes] = []
        for name, value in head.headers:
            lowered = name.lower()
            if lowered == b"transfer-encoding":
                encoding = value if encoding is None else encoding + b"," + value
            elif lowered == b"content-length":
                lengths.extend(v.strip() for v in value.split(b","))
            elif lowered == b"connection":
                connection += b"," + value.lower()
        tokens = {t.strip() for t in connection.split(b",")}
        if head.version == b"HTTP/1.1":
            self.keep_alive = b"close" not in tokens
        else:
            self.keep_alive = b"keep-alive" in tokens and b"close" not in tokens
        if self._method == b"HEAD" or head.status in (204, 304):
            self._finish(b"")
        elif encoding is not None:
            last = encoding.split(b",")[-1].strip().lower()
            if last == b"chunked":
                self._state = _SIZE
            else:  # another coding last: the body runs to the close (RFC 9112 6.3, item 4)
                self._state = _UNTIL_CLOSE
                self.keep_alive = False
        elif lengths:
            if any(not _DIGITS.fullmatch(v) for v in lengths) or len(set(lengths)) != 1:
                raise HTTPProtocolError(f"invalid Content-Length: {b','.join(lengths)[:100]!r}")
            self._remaining = int(lengths[0])
            self._state = _LENGTH
            if self._remaining == 0:
                self._finish(b"")
        else:
            self._state = _UNTIL_CLOSE
            self.keep_alive = False

    def _finish(self, extra: bytes) -> None:
        self._state = _DONE
        self.complete = True
        if extra:
            self.surplus = True

    # -- a chunked body ----------------------------------------------------------------------

    def _read_chunks(self, data: bytes) -> bytes:
        out: list[bytes] = []
        pos, end = 0, len(data)
        state = self._state
        while pos < end:
            if state == _DATA:
                take = min(self._remaining, end - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    state = _DATA_END
            elif state == _SIZE:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > MAX_HEAD_BYTES:
                        raise HTTPProtocolError("chunk-size line too long")
                    break
                size = data[pos:eol].split(b";", 1)[0].strip(b" \t")
                if not _HEX.fullmatch(size):
                    raise HTTPProtocolError(f"invalid chunk size: {data[pos:eol][:40]!r}")
                pos = eol + 2
                self._remaining = int(size, 16)
                state = _DATA if self._remaining else _TRAILERS
            elif state == _DATA_END:
                if end - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise HTTPProtocolError("a chunk's data is not followed by CRLF")
                pos += 2
                state = _SIZE
            elif state == _TRAILERS:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > MAX_HEAD_BYTES:
                        raise HTTPProtocolError("trailer section too long")
                    break
                if eol == pos:  # the empty line: the body's end
                    self._state = _DONE
                    self._finish(data[pos + 2 :])
                    return _joined(out)
                pos = eol + 2  # a trailer field: not used
        self._state = state
        if pos < end:
            self._buf = data[pos:]
        return _joined(out)


def _joined(parts: list[bytes]) -> bytes:
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)


def _parse_head(raw: bytes) -> ResponseHead:
    lines = raw.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise HTTPProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise HTTPProtocolError(f"malformed header line: {line[:100]!r}")
        headers.append((name, value.strip(b" \t")))
    return ResponseHead(int(code), reason, headers, version)
