"""The gateway's error answers, in the shape of the route that gives them: OpenAI's error body
(``wires.chat_server``) for every route but the Messages one, whose clients read Anthropic's
(``wires.messages_server``). A route that answers with a Starlette response takes them from
here; the runner's own refusals go through the route's ``shape`` (``runner.Job.shape``)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Scope, Send

from ...wires.chat_server import Shape, as_written, error_body, openai_error
from ...wires.messages_server import anthropic_error_body, anthropic_shape
from .client_writes import send_json

__all__ = [
    "error_answer",
    "anthropic_error_response",
    "anthropic_no_backend",
    "error_response",
    "no_backend",
    "refusal_response",
    "refuse",
    "store_unavailable",
]


def error_answer(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
    shape: Shape = as_written,
) -> JSONResponse:
    """An error of the gateway's own (a route's 404, a refused query, a busy store...), in the
    route's ``shape``."""
    return JSONResponse(shape(status, openai_error(message, kind, code)), status, headers=headers)


def no_backend(model: Any) -> JSONResponse:
    return JSONResponse(
        openai_error(f"no backend serves model {model!r}", "invalid_request_error", "model_not_found"), 404
    )


def error_response(err: BaseException) -> JSONResponse:
    status, body = error_body(err)
    return JSONResponse(body, status_code=status)


def refusal_response(
    status: int, body: Any, headers: list[tuple[bytes, bytes]], shape: Shape = as_written
) -> JSONResponse:
    """A key's limit refusing a request (``Accounting.refused``'s body and headers), in the
    route's ``shape``, for a route that answers with a Starlette response."""
    return JSONResponse(shape(status, body), status, headers={k.decode(): v.decode() for k, v in headers})


def store_unavailable(
    exc: Exception, what: str = "the store shared by the gateway hosts", code: str = "store_unavailable"
) -> JSONResponse:
    """A 503 for what needs a store (by default the one several hosts share: ``hosts.py``) while
    it does not answer; the client may try again (``Retry-After``)."""
    body = openai_error(f"{what} is unavailable ({exc})", "unavailable_error", code)
    return JSONResponse(body, status_code=503, headers={"retry-after": "1"})


def anthropic_error_response(err: BaseException) -> JSONResponse:
    """``error_response`` in Anthropic's shape (the Messages route)."""
    status, body = anthropic_error_body(err)
    return JSONResponse(body, status_code=status)


def anthropic_no_backend(model: Any) -> JSONResponse:
    body = {"type": "error", "error": {"type": "not_found_error", "message": f"no backend serves model {model!r}"}}
    return JSONResponse(body, status_code=404)


async def refuse(
    scope: Scope,
    send: Send,
    status: int,
    why: str,
    kind: str,
    code: str | None = None,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """The middleware's refusal of a request before any route saw it, in the shape of the route it
    was meant for: Anthropic's clients read only theirs (``/v1/messages``)."""
    path = str(scope.get("path", ""))
    messages_route = path == "/v1/messages" or path.startswith("/v1/messages/")
    body = openai_error(why, kind, code)
    await send_json(send, status, anthropic_shape(status, body) if messages_route else body, extra)
