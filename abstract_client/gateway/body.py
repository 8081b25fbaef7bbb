"""Reading a request: its id (set by the outermost middleware) and its JSON body, whose depth is
checked before it is parsed (the parser is recursive); the error answers every route shares."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from .openai_wire import BadRequest, error_body, openai_error

__all__ = ["MAX_JSON_DEPTH", "REQUEST_ID", "error_response", "json_depth", "no_backend", "read_json", "request_id_of"]

REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")  # what an X-Request-Id may be


def request_id_of(request: Request) -> str:
    return str(request.scope["state"]["request_id"])


MAX_JSON_DEPTH = 64  # arrays and objects nested deeper are refused before parsing


async def read_json(request: Request) -> Any:
    raw = await request.body()
    # JSON between systems is UTF-8 (RFC 8259 section 8.1). json.loads(bytes) would also take
    # UTF-16 and UTF-32, whose nesting the depth check (reading bytes) cannot see: the text is
    # decoded as UTF-8 first, and exactly that text is checked and parsed.
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body must be UTF-8 JSON (RFC 8259): {exc.reason} at byte {exc.start}") from None
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


def no_backend(model: Any) -> JSONResponse:
    return JSONResponse(
        openai_error(f"no backend serves model {model!r}", "invalid_request_error", "model_not_found"), 404
    )


def error_response(err: BaseException) -> JSONResponse:
    status, body = error_body(err)
    return JSONResponse(body, status_code=status)
