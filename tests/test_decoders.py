"""The pure SSE and NDJSON decoders: unit cases and Hypothesis fuzzing.

The fuzz runs 300 examples per property in the default suite; set ``FUZZ_EXAMPLES=100000`` for
the on-demand run (``scripts/fuzz.sh``).
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abstract_client import ProviderProtocolError
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
