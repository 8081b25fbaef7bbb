"""Reading a request: its id (set by the outermost middleware) and its JSON body, whose depth is
checked before it is parsed (the parser is recursive)."""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
from starlette.requests import Request

from ...wires.chat_server import MAX_MESSAGES, BadRequest
from .json_parse import CHUNK, TooManyValues, parse_in_pieces, structure

__all__ = ["MAX_JSON_DEPTH", "REQUEST_ID", "json_depth", "parse_json", "read_json", "request_id_of"]

REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")  # what an X-Request-Id may be


def request_id_of(request: Request) -> str:
    return str(request.scope["state"]["request_id"])


MAX_JSON_DEPTH = 64  # arrays and objects nested deeper are refused before parsing


# A body larger than this is checked and parsed on a worker thread: a 28 MiB body (a million
# messages) took seconds of the event loop, every other request on this worker waiting (#48).
# The thread gives the loop the GIL back every switch interval.
_PARSE_INLINE_BYTES = 64 * 1024


async def read_json(request: Request) -> Any:
    raw = await request.body()
    if len(raw) > _PARSE_INLINE_BYTES:
        return await anyio.to_thread.run_sync(parse_json, raw)
    return parse_json(raw)


def parse_json(raw: bytes) -> Any:
    """A request body as JSON: UTF-8, nested at most ``MAX_JSON_DEPTH`` levels."""
    # A body with far more messages than a request may hold is refused by a count of its
    # "role" keys, before anything else reads it. An escaped quote inside a string
    # ("\"role\"") does not count.
    if raw.count(b'"role"') > 2 * MAX_MESSAGES:
        raise BadRequest(f"a request holds at most {MAX_MESSAGES} messages")
    # JSON between systems is UTF-8 (RFC 8259 section 8.1). json.loads(bytes) would also take
    # UTF-16 and UTF-32, whose nesting the depth check (reading bytes) cannot see: the text is
    # decoded as UTF-8 first, and exactly that text is checked and parsed.
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body must be UTF-8 JSON (RFC 8259): {exc.reason} at byte {exc.start}") from None
    if len(text) > CHUNK:  # in pieces: json.loads would hold the GIL for all of it (json_parse.py)
        try:
            depth, spans = structure(text)
        except TooManyValues as exc:
            raise BadRequest(f"the body holds {exc}") from None
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(f"the body nests JSON deeper than {MAX_JSON_DEPTH} levels")
        try:
            return parse_in_pieces(text, spans)
        except ValueError as exc:
            raise BadRequest(f"the body is not JSON: {exc}") from None
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise BadRequest(f"the body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None


_STRUCTURE = re.compile(rb'\\.|["\[\]{}]', re.S)  # an escape pair, a quote, or a bracket


def json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text (strings skipped), in one linear pass
    over its structural bytes only: the parser is recursive, so a deep body must be refused
    before it is parsed."""
    depth = deepest = 0
    in_string = False
    for match in _STRUCTURE.finditer(raw):
        token = match.group()
        if token == b'"':
            in_string = not in_string
        elif in_string or len(token) == 2:  # inside a string, or an escape pair
            continue
        elif token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest
