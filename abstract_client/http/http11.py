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

What it accepts is what h11 (httpx's parser) accepts, no less and no more — ``tests/test_decoders.py``
feeds the same bytes to both and wants the same status, headers and body, or both refusing:
bare-LF line ends in the head and the trailers, obsolete line folding, any ``HTTP/d.d`` status
line, a head up to httpcore's limit (100 KiB); chunk-size lines end in CRLF, ``Transfer-Encoding``
is ``chunked`` or refused, ``Content-Length`` values must agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["HTTPProtocolError", "ResponseHead", "ResponseReader", "MAX_HEAD_BYTES"]

# status line + headers (and each chunk-size or trailer section): httpcore's limit for h11
MAX_HEAD_BYTES = 100 * 1024
# h11's grammar (its _abnf.py), compiled as h11 compiles it
_FIELD_VCHAR = rb"[^\x00\s]"
_STATUS_LINE = re.compile(
    rb"HTTP/(?P<version>[0-9]\.[0-9]) (?P<code>[0-9]{3})(?: (?P<reason>(?:[ \t]|" + _FIELD_VCHAR + rb")*))?"
)
_HEADER_FIELD = re.compile(
    rb"(?P<name>[-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*(?P<value>(?:"
    + _FIELD_VCHAR
    + rb"+(?:[ \t]+"
    + _FIELD_VCHAR
    + rb"+)*)?)[ \t]*"
)
_CHUNK_HEADER = re.compile(rb"(?P<size>[0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*")
_CONTENT_LENGTH = re.compile(rb"[0-9]{1,20}")
_FOLD = re.compile(rb"[ \t]+")
_BLANK_LINE = re.compile(rb"\n\r?\n")  # the head's end: bare LF accepted, as h11 does

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

    __slots__ = ("_buf", "_method", "_remaining", "_state", "complete", "head", "keep_alive", "received", "surplus")

    def __init__(self, method: bytes = b"POST") -> None:
        self._method = method.upper()
        self._buf = b""
        self._state = _HEAD
        self._remaining = 0
        self.head: ResponseHead | None = None
        self.complete = False  # the whole response was read
        self.keep_alive = False  # the server lets the connection carry another request
        self.surplus = False  # bytes came after the response's end: the connection is not clean
        self.received = False  # any byte of a response came (an interim 1xx included)

    @property
    def reusable(self) -> bool:
        """The response ended cleanly and the connection may carry the next request."""
        return self.complete and self.keep_alive and not self.surplus

    def feed(self, data: bytes) -> bytes:
        """Take the next bytes read; return the body bytes they complete (often ``b""``)."""
        if data:
            self.received = True
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
            lines, rest = _extract_lines(data)
            if lines is None:
                self._buf = data
                return None
            if not lines:
                raise HTTPProtocolError("no status line: the response starts with an empty line")
            head = _parse_head(lines)
            data = rest
            if 100 <= head.status < 200:
                if head.status == 101:
                    raise HTTPProtocolError("unexpected 101 Switching Protocols")
                continue  # an interim response (100 Continue, 103 Early Hints): the real one follows
            self.head = head
            self._frame(head)
            return data

    def _frame(self, head: ResponseHead) -> None:
        # the headers as h11 validates them, then RFC 9112 section 6.3's order
        connection = b""
        chunked = False
        length: bytes | None = None
        for name, value in head.headers:
            lowered = name.lower()
            if lowered == b"transfer-encoding":
                if chunked:
                    raise HTTPProtocolError("more than one Transfer-Encoding header")
                if value.lower() != b"chunked":
                    raise HTTPProtocolError(f"unsupported Transfer-Encoding: {value[:100]!r} (only chunked)")
                chunked = True
            elif lowered == b"content-length":
                values = {v.strip() for v in value.split(b",")}
                given = values.pop() if len(values) == 1 else b""
                if not _CONTENT_LENGTH.fullmatch(given) or (length is not None and length != given):
                    raise HTTPProtocolError(f"invalid or conflicting Content-Length: {value[:100]!r}")
                length = given
            elif lowered == b"connection":
                connection += b"," + value.lower()
        tokens = {t.strip() for t in connection.split(b",")}
        if head.version >= b"HTTP/1.1":
            self.keep_alive = b"close" not in tokens
        else:
            self.keep_alive = b"keep-alive" in tokens and b"close" not in tokens
        if self._method == b"HEAD" or head.status in (204, 304) or (self._method == b"CONNECT" and head.status < 300):
            self._finish(b"")
        elif chunked:
            self._state = _SIZE
        elif length is not None:
            self._remaining = int(length)
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
                eol = data.find(b"\r\n", pos)  # a chunk-size line ends in CRLF (h11 too)
                if eol < 0:
                    if end - pos > MAX_HEAD_BYTES:
                        raise HTTPProtocolError("chunk-size line too long")
                    break
                match = _CHUNK_HEADER.fullmatch(data, pos, eol)
                if match is None:
                    raise HTTPProtocolError(f"invalid chunk size: {data[pos:eol][:40]!r}")
                pos = eol + 2
                self._remaining = int(match["size"], 16)
                state = _DATA if self._remaining else _TRAILERS
            elif state == _DATA_END:
                if end - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise HTTPProtocolError("a chunk's data is not followed by CRLF")
                pos += 2
                state = _SIZE
            elif state == _TRAILERS:
                lines, rest = _extract_lines(data[pos:])
                if lines is None:
                    break
                _header_fields(lines)  # validated as h11 does; not used
                self._state = _DONE
                self._finish(rest)
                return _joined(out)
        self._state = state
        if pos < end:
            self._buf = data[pos:]
        return _joined(out)


def _joined(parts: list[bytes]) -> bytes:
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)


def _extract_lines(data: bytes) -> tuple[list[bytes] | None, bytes]:
    """A head or trailer section, h11's way: everything up to the first blank line (``\n\n`` or
    ``\n\r\n``), split at ``\n`` with a trailing ``\r`` dropped; ``[]`` when it starts with
    a blank line; None while the blank line has not come (refused past the size limit)."""
    if data[:1] == b"\n":
        return [], data[1:]
    if data[:2] == b"\r\n":
        return [], data[2:]
    match = _BLANK_LINE.search(data)
    if match is None:
        # as h11 (max_incomplete_event_size): a section still incomplete past the limit is
        # refused; one whose end came in the same read is taken whole
        if len(data) > MAX_HEAD_BYTES:
            raise HTTPProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
        return None, data
    end = match.end()
    lines = [line[:-1] if line.endswith(b"\r") else line for line in data[:end].split(b"\n")]
    return lines[:-2], data[end:]


def _header_fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """Header lines as (name, value); an obsolete folded line (starting with SP or HTAB) joins the
    one before it with a single space, as h11 does."""
    unfolded: list[bytes] = []
    for line in lines:
        fold = _FOLD.match(line)
        if fold is None:
            unfolded.append(line)
        elif not unfolded:
            raise HTTPProtocolError(f"a continuation line before any header: {line[:100]!r}")
        else:
            unfolded[-1] += b" " + line[fold.end() :]
    headers: list[tuple[bytes, bytes]] = []
    for line in unfolded:
        match = _HEADER_FIELD.fullmatch(line)
        if match is None:
            raise HTTPProtocolError(f"malformed header line: {line[:100]!r}")
        headers.append((match["name"], match["value"]))
    return headers


def _parse_head(lines: list[bytes]) -> ResponseHead:
    status = _STATUS_LINE.fullmatch(lines[0])
    if status is None:
        raise HTTPProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    version, code = b"HTTP/" + status["version"], int(status["code"])
    if code < 100:
        raise HTTPProtocolError(f"status {code}: not a status code")
    return ResponseHead(code, status["reason"] or b"", _header_fields(lines[1:]), version)
