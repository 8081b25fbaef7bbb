"""What every generation route does first: read the request's JSON body, parse it into the call's
arguments (the route's own parser), and find the backend that serves its model — each failure
answered in the route's shape (Anthropic's for the Messages routes), before anything runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from ...wires.chat_server import BadRequest
from ..flight import Backend
from ..gateway import Gateway
from ..http.error_answers import anthropic_error_response, anthropic_no_backend, error_response, no_backend
from ..http.reading import read_json, request_id_of

__all__ = ["Parsed", "parse_request"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Parsed(Generic[T]):
    """A request its route can run: its body, its arguments, its backend, the model name it
    answers with, its id."""

    body: dict[str, Any]
    args: T
    backend: Backend
    model: str
    request_id: str


async def parse_request(
    gateway: Gateway, request: Request, parse: Callable[[Any], T], *, anthropic: bool = False
) -> Parsed[T] | Response:
    """The request parsed by ``parse`` (which raises ``BadRequest``), or the answer that refuses it."""
    try:
        body = await read_json(request)
        args = parse(body)
    except BadRequest as err:
        return anthropic_error_response(err) if anthropic else error_response(err)
    backend = gateway.backend_for(body.get("model"))
    if backend is None:
        return anthropic_no_backend(body.get("model")) if anthropic else no_backend(body.get("model"))
    return Parsed(body, args, backend, str(body.get("model") or backend.name), request_id_of(request))
