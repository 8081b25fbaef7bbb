"""Turning HTTP statuses, error bodies and httpx exceptions into this library's error types.

Error bodies come in several shapes and all are accepted: ``{"error": {"message", "type", "code"}}``
(OpenAI, llama-server, vLLM, LM Studio), ``{"error": "text"}`` (Ollama, LM Studio),
``{"object": "error", "message", "code"}`` (older vLLM) and ``{"detail": ...}`` (FastAPI).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import httpx

from ..errors import (
    AbstractClientError,
    ConnectionFailedError,
    ContextOverflowError,
    GenerationTimeoutError,
    InvalidRequestError,
    ModelNotFoundError,
    NotSupportedError,
    ProviderAPIError,
    ProviderError,
    ProviderProtocolError,
    RateLimitError,
    ServerUnavailableError,
    TransportError,
)
from .transport import NoResponseError

__all__ = [
    "decode_json_body",
    "error_from_frame",
    "error_from_response",
    "map_transport_error",
    "parse_error_body",
    "parse_retry_after",
]

# Servers report context overflow only in prose (vLLM, LM Studio, Ollama wrapping llama-server).
# This is used to pick the error *type*, never to decide a retry.
_OVERFLOW = re.compile(
    r"maximum context length|exceeds? the available context|context length exceeded|"
    r"exceed_context_size|context window|too many tokens|prompt is too long|exceeds model's maximum",
    re.IGNORECASE,
)
_NO_MODEL = re.compile(r"no models? (is |are )?loaded", re.IGNORECASE)


def parse_error_body(body: Any) -> tuple[str, str | None, Any] | None:
    """Return (message, type, code) if ``body`` is an error body, else None."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict):
        message = err.get("message") or json.dumps(err)[:500]
        return str(message), _str_or_none(err.get("type")), err.get("code")
    if isinstance(err, str) and err:
        return err, None, None
    if body.get("object") == "error" and "message" in body:
        return str(body["message"]), _str_or_none(body.get("type")), body.get("code")
    detail = body.get("detail")
    if detail is not None and len(body) == 1:
        return (detail if isinstance(detail, str) else json.dumps(detail)[:500]), None, None
    return None


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare for LLM servers and not supported);
    anything else — negative, NaN, infinite, not a number — is no Retry-After."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def decode_json_body(content: bytes) -> Any:
    """The JSON of an error body, or None when it is not JSON (or nests too deep)."""
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        return None


_AUTO_TOOLS = re.compile(
    r"tool.?choice.{0,20} requires|enable-auto-tool-choice|requires --tool-call-parser", re.IGNORECASE
)


def error_from_response(
    status: int,
    body: Any,
    *,
    headers: httpx.Headers | None = None,
    text: str = "",
) -> ProviderError | NotSupportedError:
    """Map an error status (or an error body under 200) to a typed ``ProviderError`` (or the
    ``NotSupportedError`` a server says it is)."""
    parsed = parse_error_body(body)
    message, etype, code = parsed if parsed else ((text or f"HTTP {status}")[:500], None, None)
    if isinstance(code, int) and status == 200 and code >= 400:
        status = code  # llama-server puts the real status in error.code of a stream frame
    retry_after = parse_retry_after(headers.get("retry-after")) if headers is not None else None
    lowered_type = (etype or "").lower()
    common: dict[str, Any] = {"status": status, "body": body}
    error_obj = body.get("error") if isinstance(body, dict) else None
    param = error_obj.get("param") if isinstance(error_obj, dict) else None

    if lowered_type == "exceed_context_size_error" or (status in (400, 413, 422, 500) and _OVERFLOW.search(message)):
        n_prompt = error_obj.get("n_prompt_tokens") if isinstance(error_obj, dict) else None
        n_ctx = error_obj.get("n_ctx") if isinstance(error_obj, dict) else None
        return ContextOverflowError(message, n_prompt_tokens=n_prompt, n_ctx=n_ctx, **common)
    model_flagged = (
        code == "model_not_found"
        or param == "model"
        or lowered_type == "model_not_found"
        or _NO_MODEL.search(message) is not None
    )
    if model_flagged or (status == 404 and "model" in message.lower()):
        return ModelNotFoundError(message, **common)
    if status == 429:
        return RateLimitError(message, retry_after=retry_after, **common)
    if status in (503, 529) or lowered_type in ("unavailable_error", "overloaded_error"):  # 529: Anthropic's
        return ServerUnavailableError(message, retry_after=retry_after, **common)
    if status in (400, 422) and _AUTO_TOOLS.search(message):
        return NotSupportedError(message, **common)  # vLLM started without its tool-call flags
    if status in (400, 422):
        return InvalidRequestError(message, **common)
    return ProviderAPIError(message, **common)


def error_from_frame(obj: Any) -> ProviderError | NotSupportedError | None:
    """An error carried inside a stream frame (SSE ``data:`` or an NDJSON line), or None."""
    if not isinstance(obj, dict) or ("error" not in obj and obj.get("object") != "error"):
        return None
    if parse_error_body(obj) is None:
        return None
    return error_from_response(200, obj)


def map_transport_error(exc: httpx.HTTPError) -> AbstractClientError:
    """An httpx failure that was not caused by our own stop."""
    if isinstance(exc, httpx.ConnectTimeout):
        return GenerationTimeoutError(f"connect timed out: {exc}", kind="connect")
    if isinstance(exc, httpx.ConnectError):
        # nothing was sent: safe to retry
        return ConnectionFailedError(f"cannot connect: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return GenerationTimeoutError(f"timed out: {exc}", kind="idle")
    if isinstance(exc, httpx.TooManyRedirects):
        return ProviderProtocolError(f"too many redirects: {exc}")
    if isinstance(exc, httpx.DecodingError):
        return ProviderProtocolError(f"undecodable body: {exc}")
    # Read/Write/RemoteProtocol errors: the request may have reached the server; not retryable.
    # Nothing of a response came back at all: a fleet may still send it to another member.
    no_response = isinstance(exc, NoResponseError)
    return TransportError(f"connection lost: {type(exc).__name__}: {exc}".rstrip(": "), no_response=no_response)
