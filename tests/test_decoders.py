"""The pure SSE, NDJSON and HTTP/1.1 response decoders: unit cases and Hypothesis fuzzing.

The fuzz runs 300 examples per property in the default suite; set ``FUZZ_EXAMPLES=100000`` for
the on-demand run (``scripts/fuzz.sh``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abstract_client import ProviderProtocolError
from abstract_client.http.http11 import MAX_HEAD_BYTES, HTTPProtocolError, ResponseReader
from abstract_client.http.ndjson import NDJSONDecoder
from abstract_client.http.sse import SSEDecoder, SSEEvent

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
fuzz = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def feed_all(decoder: SSEDecoder, parts: list[bytes]) -> list[SSEEvent]:
    out: list[SSEEvent] = []
    for p in parts:
        out.extend(decoder.feed(p))
    out.extend(decoder.close())
    return out


def test_sse_basic_frames_comments_and_done() -> None:
    raw = b': ping\n\ndata: {"a":1}\n\nevent: chat.end\ndata: x\ndata: y\n\ndata: [DONE]\n\n'
    events = feed_all(SSEDecoder(), [raw])
    assert events == [SSEEvent(data='{"a":1}'), SSEEvent(event="chat.end", data="x\ny"), SSEEvent(data="[DONE]")]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_sse_all_line_endings_even_split(newline: bytes) -> None:
    raw = b"data: one" + newline + newline + b"data: two" + newline + newline
    for cut in range(len(raw) + 1):
        events = feed_all(SSEDecoder(), [raw[:cut], raw[cut:]])
        assert [e.data for e in events] == ["one", "two"], cut


def test_sse_multibyte_utf8_split_across_chunks() -> None:
    raw = "data: café ☕ 日本\n\n".encode()
    for cut in range(len(raw) + 1):
        assert feed_all(SSEDecoder(), [raw[:cut], raw[cut:]])[0].data == "café ☕ 日本"


def test_sse_invalid_utf8_is_a_protocol_error() -> None:
    with pytest.raises(ProviderProtocolError):
        SSEDecoder().feed(b"data: \xff\xfe\n\n")


def test_sse_line_too_long_is_a_protocol_error() -> None:
    decoder = SSEDecoder(max_line_bytes=1024)
    with pytest.raises(ProviderProtocolError):
        decoder.feed(b"data: " + b"x" * 2000)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf-fast-path", "crlf"])
def test_sse_an_event_larger_than_its_bound_is_a_protocol_error_and_frees_its_lines(newline: bytes) -> None:
    """#48: each line under the line bound, no blank line: without an event bound the data
    lines piled up (300 lines of 1 MiB: 300 MiB held)."""
    decoder = SSEDecoder(max_line_bytes=1024, max_event_bytes=10_000)
    line = b"data: " + b"x" * 900 + newline
    events = decoder.feed((line * 11 + newline) * 3)  # each under the bound: the bound is per event
    assert [e.data.count("x") for e in events] == [9_900] * 3
    with pytest.raises(ProviderProtocolError, match="SSE event larger than 10000"):
        for _ in range(20):
            decoder.feed(line)
    assert decoder._data == []  # let go at once


def test_sse_the_default_event_bound_holds_over_many_reads() -> None:
    decoder = SSEDecoder()
    line = b"data: " + b"x" * (1024 * 1024 - 8) + b"\n"
    with pytest.raises(ProviderProtocolError, match="SSE event larger than"):
        for _ in range(300):
            decoder.feed(line)
    assert sum(len(d) for d in decoder._data) <= decoder.max_event_bytes


def test_sse_unfinished_block_is_dropped_and_flagged() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: partial") == []
    assert decoder.has_partial
    assert decoder.close() == []


def test_sse_bom_and_fields() -> None:
    events = feed_all(SSEDecoder(), [b"\xef\xbb\xbfid: 7\nretry: 100\ndata:x\n\n"])
    assert events == [SSEEvent(data="x", id="7", retry=100)]


@fuzz
@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0, max_value=2000), max_size=8))
def test_sse_fuzz_only_typed_errors(data: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(data) + 1) for c in cuts})
    parts = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    try:
        feed_all(SSEDecoder(max_line_bytes=512), parts)
    except ProviderProtocolError:
        pass


@fuzz
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["data", "event", "id", ":", "retry", "x"]),
            st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=30),
        ),
        max_size=20,
    ),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.integers(min_value=1, max_value=64),
)
def test_sse_fuzz_chunking_does_not_change_events(fields: list[tuple[str, str]], nl: str, size: int) -> None:
    text = ""
    for i, (name, value) in enumerate(fields):
        text += (f":{value}" if name == ":" else f"{name}: {value}") + nl
        if i % 3 == 2:
            text += nl
    raw = ("\ufeff" if size % 2 else "").encode() + text.encode()
    whole = feed_all(SSEDecoder(), [raw])
    pieces = feed_all(SSEDecoder(), [raw[i : i + size] for i in range(0, len(raw), size)])
    assert pieces == whole


def test_ndjson_lines_and_partial() -> None:
    decoder = NDJSONDecoder()
    assert decoder.feed(b'{"a":1}\n{"b"') == [{"a": 1}]
    assert decoder.feed(b":2}\r\n\n") == [{"b": 2}]
    assert decoder.feed(b'{"done":true}') == []
    assert decoder.close() == [{"done": True}]


def test_ndjson_malformed_and_truncated_are_protocol_errors() -> None:
    with pytest.raises(ProviderProtocolError):
        NDJSONDecoder().feed(b"{nope}\n")
    decoder = NDJSONDecoder()
    decoder.feed(b'{"message": {"content": "cut')
    with pytest.raises(ProviderProtocolError):
        decoder.close()


@fuzz
@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=64))
def test_ndjson_fuzz_only_typed_errors(data: bytes, size: int) -> None:
    decoder = NDJSONDecoder(max_line_bytes=512)
    try:
        for i in range(0, len(data), size):
            decoder.feed(data[i : i + size])
        decoder.close()
    except ProviderProtocolError:
        pass


@fuzz
@given(
    st.lists(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=10), max_size=4), max_size=10),
    st.integers(min_value=1, max_value=32),
)
def test_ndjson_fuzz_roundtrip(objs: list[dict[str, object]], size: int) -> None:
    raw = b"".join(json.dumps(o).encode() + b"\n" for o in objs)
    decoder = NDJSONDecoder()
    out = []
    for i in range(0, len(raw), size):
        out.extend(decoder.feed(raw[i : i + size]))
    out.extend(decoder.close())
    assert out == objs


# -- events before bad bytes in the same read come out first -------------------------------------


def test_sse_events_before_bad_bytes_in_the_same_read_come_out_then_the_error() -> None:
    """One read may carry many frames (the HTTP reader hands over whole reads): the frames before
    invalid UTF-8 are partial text the caller must keep; the error follows on the next call."""
    decoder = SSEDecoder()
    events = decoder.feed(b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: "\xff"\n\n')
    assert [e.data for e in events] == ['{"a": 1}', '{"b": 2}']
    with pytest.raises(ProviderProtocolError, match="UTF-8"):
        decoder.end()
    with pytest.raises(ProviderProtocolError, match="UTF-8"):
        decoder.feed(b"data: more\n\n")


def test_ndjson_objects_before_a_bad_line_in_the_same_read_come_out_then_the_error() -> None:
    decoder = NDJSONDecoder()
    assert decoder.feed(b'{"a": 1}\n{"b": 2}\nnot json\n') == [{"a": 1}, {"b": 2}]
    with pytest.raises(ProviderProtocolError, match="malformed"):
        decoder.close()


# -- the HTTP/1.1 response reader (abstract_client/http/http11.py) -----------------------------------


def read_response(parts: list[bytes], method: bytes = b"POST", eof: bool = True) -> tuple[ResponseReader, bytes]:
    reader = ResponseReader(method)
    body = b"".join(reader.feed(p) for p in parts)
    if eof and not reader.complete:
        reader.feed_eof()
    return reader, body


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def chunked(parts: list[bytes], *, ext: bool = False, trailers: bool = False) -> bytes:
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(p), b";x=y" if ext else b"", p) for p in parts if p)
    return out + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailers else b"") + b"\r\n"


def test_http11_a_chunked_stream_read_at_once_is_one_body_piece() -> None:
    """The reason the reader exists: a read that holds 500 chunks is one body piece, not 500."""
    frames = [b'data: {"i": %d}\n\n' % i for i in range(500)]
    reader = ResponseReader()
    pieces = [reader.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(frames))]
    assert pieces == [b"".join(frames)] and reader.reusable
    assert reader.head is not None and reader.head.status == 200


@pytest.mark.parametrize(
    ("raw", "reusable", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", True, b"abc"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc", False, b"abc"),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc", False, b"abc"),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nabc", True, b"abc"),
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the close", False, b"until the close"),
        (b"HTTP/1.1 200 OK\nContent-Length: 3\n\nabc", True, b"abc"),  # bare LF, as h11 takes it
        (b"HTTP/1.1 200 OK\r\nX-A: 1\r\n  folded\r\nContent-Length: 3\r\n\r\nabc", True, b"abc"),
        (b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", True, b""),  # no reason phrase
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\n\n",
            True,
            b"abc",
        ),  # trailers ending in bare LF
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", True, b""),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcSURPLUS", False, b"abc"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc", True, b"abc"),
    ],
)
def test_http11_framing_and_reuse(raw: bytes, reusable: bool, body: bytes) -> None:
    reader, got = read_response([raw])
    assert got == body and reader.complete and reader.reusable is reusable


def test_http11_head_has_no_body_and_a_cut_body_is_an_error() -> None:
    reader, body = read_response([b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"], method=b"HEAD")
    assert body == b"" and reader.reusable
    for raw in (
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
        b"HTTP/1.1 200 OK\r\nContent-",
        b"",
    ):
        with pytest.raises(HTTPProtocolError):
            read_response([raw])


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nraw",  # only chunked (h11 too)
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 099 Odd\r\n\r\n",
        b"\r\nHTTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10),
    ],
)
def test_http11_malformed_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(HTTPProtocolError):
        read_response([raw])


@fuzz
@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0, max_value=2000), max_size=8))
def test_http11_fuzz_only_typed_errors(data: bytes, cuts: list[int]) -> None:
    for prefix in (b"", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"):
        try:
            read_response(cut(prefix + data, cuts))
        except HTTPProtocolError:
            pass


@fuzz
@given(
    st.lists(st.binary(max_size=300), max_size=12),
    st.sampled_from(["chunked", "length", "close"]),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=5000), max_size=10),
)
def test_http11_fuzz_any_cuts_give_the_same_body(
    parts: list[bytes], framing: str, extras: bool, cuts: list[int]
) -> None:
    body = b"".join(parts)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if framing == "chunked":
        raw = head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(parts, ext=extras, trailers=extras)
    elif framing == "length":
        raw = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    else:
        raw = head + b"Connection: close\r\n\r\n" + body
    if extras:
        raw = b"HTTP/1.1 100 Continue\r\n\r\n" + raw
    reader, got = read_response(cut(raw, cuts))
    assert got == body and reader.complete
    assert reader.reusable is (framing != "close")
    assert reader.head is not None and (b"Content-Type", b"text/event-stream") in reader.head.headers


# -- the reader against h11, httpx's parser: the same response bytes, the same answer ----------------


def h11_reads(parts: list[bytes]) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
    """What h11 (as httpcore configures it) makes of a response read in ``parts``, then EOF:
    (status, headers, body), or None when it refuses it or never completes it."""
    import h11

    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    status, headers, body = 0, [], b""
    try:
        for part in [*(p for p in parts if p), b""]:  # b"" is h11's end of the stream: last only
            conn.receive_data(part)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    break
                if isinstance(event, h11.InformationalResponse):
                    if event.status_code == 101:
                        return None
                    continue
                if isinstance(event, h11.Response):
                    status, headers = event.status_code, [(bytes(n), bytes(v)) for n, v in event.headers.raw_items()]
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    return status, headers, body
                else:  # ConnectionClosed before the message ended
                    return None
    except h11.RemoteProtocolError:
        return None
    return None


def ours_reads(parts: list[bytes]) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
    try:
        reader, body = read_response(parts)
    except HTTPProtocolError:
        return None
    assert reader.head is not None and reader.complete
    # h11 keeps one Content-Length (its single value) and lowercases Transfer-Encoding's
    headers, length = [], False
    for name, value in reader.head.headers:
        lowered = name.lower()
        if lowered == b"content-length":
            if length:
                continue
            length, value = True, value.split(b",")[0].strip()
        elif lowered == b"transfer-encoding":
            value = value.lower()
        headers.append((name, value))
    return reader.head.status, headers, body


_EOL = st.sampled_from([b"\r\n", b"\n"])
_TEXT = st.sampled_from([b"OK", b"", b" spaced ", b"a\tb", b"ctl\x01x", b"\xffhigh", b"nul\x00x", b"cr\rx", b"x" * 40])


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    """A response built from the pieces servers get wrong: versions, reasons, line ends, header
    names and values, folded lines, framing headers that agree or not, chunk extensions and
    trailers, interim responses."""
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.x", b"HTTP/11", b"http/1.1"]))
    code = draw(st.sampled_from([b"200", b"204", b"404", b"099", b"2000", b"20x"]))
    reason = draw(st.sampled_from([b" OK", b"", b" ", b" \tx", b" ctl\x01", b"  two"]))
    lines = [version + b" " + code + reason]
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([b"X-A", b"Content-Type", b"bad name", b"", b"Connection", b"x:y"]))
        lines.append(name + b":" + draw(_TEXT))
        if draw(st.booleans()) and draw(st.booleans()):
            lines.append(draw(st.sampled_from([b" folded", b"\tmore", b"  "])))
    body = draw(st.binary(max_size=40))
    framing = draw(st.sampled_from(["length", "chunked", "close", "odd-length", "odd-te"]))
    if framing == "length":
        lines.append(b"Content-Length: %d" % len(body))
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from([b"Content-Length: %d" % len(body), b"content-length: 0"])))
    elif framing == "odd-length":
        lines.append(draw(st.sampled_from([b"Content-Length: 3, 3", b"Content-Length: -1", b"Content-Length: 1 2"])))
    elif framing == "chunked":
        lines.append(draw(st.sampled_from([b"Transfer-Encoding: chunked", b"Transfer-Encoding: Chunked"])))
    elif framing == "odd-te":
        lines.append(draw(st.sampled_from([b"Transfer-Encoding: gzip", b"Transfer-Encoding: gzip, chunked"])))
        if draw(st.booleans()):
            lines.append(b"Transfer-Encoding: chunked")
    head = b"".join(line + draw(_EOL) for line in lines) + draw(_EOL)
    if framing == "chunked":
        ext = draw(st.sampled_from([b"", b";x=y", b" ", b";\x01"]))
        payload = (b"%x" % len(body) + ext + b"\r\n" + body + b"\r\n") if body else b""
        trailer = draw(st.sampled_from([b"", b"X-T: 1" + draw(_EOL), b" bad" + draw(_EOL)]))
        payload += draw(st.sampled_from([b"0\r\n", b"0\n", b"00\r\n"])) + trailer + draw(_EOL)
    else:
        payload = body
    interim = draw(st.sampled_from([b"", b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Hints\nLink: x\n\n"]))
    return interim + head + payload


@fuzz
@given(responses(), st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_http11_reads_what_h11_reads(raw: bytes, cuts: list[int]) -> None:
    """The same bytes, cut the same way, to this reader and to h11: the same status, headers and
    body, or both refuse (h11 refusing includes never completing before the stream's end)."""
    parts = cut(raw, cuts)
    assert ours_reads(parts) == h11_reads(parts), raw


@fuzz
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0, max_value=400), max_size=4))
def test_http11_reads_what_h11_reads_after_a_valid_head(tail: bytes, cuts: list[int]) -> None:
    for head in (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
    ):
        parts = cut(head + tail, cuts)
        assert ours_reads(parts) == h11_reads(parts), head + tail


def test_http11_the_head_limit_is_httpcores() -> None:
    """httpcore's limit for h11 (100 KiB of a head still incomplete): a head under it is read,
    one that has not ended past it is refused — in any cuts, by both readers alike."""
    big = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES - 100) + b"\r\nContent-Length: 0\r\n\r\n"
    for parts in ([big], cut(big, [4096 * i for i in range(1, 30)])):
        assert ours_reads(parts) == h11_reads(parts) and ours_reads(parts) is not None
    endless = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 10)
    for parts in ([endless], cut(endless, [4096 * i for i in range(1, 30)])):
        assert ours_reads(parts) is None and h11_reads(parts) is None
    with pytest.raises(HTTPProtocolError, match="larger than"):
        ResponseReader().feed(endless)  # refused as it arrives, not at the end of the stream


# -- a large JSON body in pieces (gateway/json_parse.py) and a large request body's encoding
# (http/json_encode.py), each against the json module as the reference --------------------------

_JSON_TEXT = st.text(alphabet=st.sampled_from(["a", "é", '"', "\\", "\n", "\x00", "\u2028", "😀", "\ud83d", " "]))
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _JSON_TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_JSON_TEXT, inner, max_size=5),
    max_leaves=40,
)


@fuzz
@given(_JSON_VALUES, st.integers(min_value=2, max_value=40), st.sampled_from([None, 0, 2]), st.booleans())
def test_a_body_parsed_in_pieces_is_what_json_loads_reads(
    value: Any, chunk: int, indent: int | None, ascii_: bool
) -> None:
    import json

    from abstract_client.gateway.http.json_parse import parse_in_pieces, structure

    text = json.dumps(value, indent=indent, ensure_ascii=ascii_)
    _, spans = structure(text, chunk)
    assert parse_in_pieces(text, spans, chunk) == json.loads(text)


@fuzz
@given(
    st.text(
        alphabet=st.sampled_from(["{", "}", "[", "]", '"', "\\", ",", ":", "1", "a", " ", "u", "d", "8"]), max_size=60
    ),
    st.integers(min_value=2, max_value=8),
)
def test_text_that_is_not_json_fails_in_pieces_as_it_fails_json_loads(text: str, chunk: int) -> None:
    import json

    from abstract_client.gateway.http.json_parse import parse_in_pieces, structure

    try:
        expected: Any = json.loads(text)
    except ValueError:
        expected = ValueError
    try:
        _, spans = structure(text, chunk)
        got: Any = parse_in_pieces(text, spans, chunk)
    except ValueError:
        got = ValueError
    assert got == expected or (got is not ValueError and expected is not ValueError and str(got) == str(expected))


def test_no_piece_of_a_large_body_is_longer_than_a_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism, counted: every call into the C decoder (and every regex search of the
    structure pass) covers at most ``CHUNK`` characters, whatever the body — a 30 MB body took
    one call of 350-630 ms before."""
    import json

    from abstract_client.gateway.http import json_parse

    chunk = 1000
    calls: list[int] = []
    real_raw, real_decode = json_parse._DECODER.raw_decode, json_parse._DECODER.decode

    class Counting(json.JSONDecoder):
        def raw_decode(self, s: str, idx: int = 0) -> Any:  # type: ignore[override]
            value, end = real_raw(s, idx)
            calls.append(end - idx)
            return value, end

        def decode(self, s: str) -> Any:  # type: ignore[override]
            calls.append(len(s))
            return real_decode(s)

    monkeypatch.setattr(json_parse, "_DECODER", Counting())
    searched: list[int] = []  # how many characters each regex search of the structure pass covers
    pattern = json_parse._STRUCTURE

    class CountingPattern:
        def finditer(self, text: str, pos: int = 0, endpos: int | None = None) -> Any:
            end = len(text) if endpos is None else endpos
            searched.append(end - pos)
            return pattern.finditer(text, pos, end)

    monkeypatch.setattr(json_parse, "_STRUCTURE", CountingPattern())
    body = {
        "numbers": [1.5] * 20_000,
        "text": "x\\é\n" * 5_000 + "\U0001f600" * 3_000,
        "objects": [{"role": "user", "content": "y" * 50}] * 2_000,
    }
    text = json.dumps(body)
    _, spans = json_parse.structure(text, chunk)
    assert json_parse.parse_in_pieces(text, spans, chunk) == body
    assert max(calls) <= chunk + 2, max(calls)  # a string piece has its two quotes
    assert max(searched) <= chunk, max(searched)
    found = [m.end() for m in json_parse._windowed(text, chunk)]
    assert found == [m.end() for m in pattern.finditer(text)]


def test_a_body_with_too_many_values_is_refused_before_any_is_made() -> None:
    import json

    from abstract_client.gateway.http.json_parse import TooManyValues, structure

    text = json.dumps({"tools": [{"name": "t"}] * 10})
    structure(text, 8, max_values=33)  # 10 x {"name": "t"}: 30; the array, "tools", the body: 3
    with pytest.raises(TooManyValues):
        structure(text, 8, max_values=32)


@fuzz
@given(_JSON_VALUES, st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=6))
def test_a_request_encoded_in_pieces_is_what_httpx_sends(value: Any, piece: int, long: int) -> None:
    import json

    from abstract_client.http import json_encode

    shared = 'é"\\\n' * 3  # one string object at two places
    value = [value, shared, {"again": shared}]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_encode, "PIECE", piece)
        patch.setattr(json_encode, "LONG", long)
        try:
            expected: Any = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        except UnicodeEncodeError:
            expected = UnicodeEncodeError
        try:
            got: Any = json_encode.encode_json(value)
        except UnicodeEncodeError:
            got = UnicodeEncodeError
    assert got == expected
