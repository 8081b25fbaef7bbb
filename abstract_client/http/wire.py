"""Reading HTTP responses for the lanes: error statuses, JSON bodies, and the one read loop
(:func:`read_chunks`) that drives any wire's sans-io decoder over a streamed answer.

Shared by every HTTP provider so each of them is only field mapping.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from ..errors import ProviderProtocolError, ServerUnavailableError
from .mapping import decode_json_body, error_from_frame, error_from_response, parse_error_body

if TYPE_CHECKING:
    from ..types import StreamChunk
    from .chunk_decoder import ChunkDecoder

MAX_ERROR_BODY = 64 * 1024


class StreamRefusedError(ProviderProtocolError):
    """A stream was asked for and the server answered one JSON body (it does not stream). A
    non-streaming call then falls back to the lane's plain route (``contract.run.complete``)."""


async def expect_stream(resp: httpx.Response) -> None:
    """Before decoding a streamed answer: raise the typed error for a non-2xx status, and for a
    JSON body where a stream was asked for — servers answer some errors that way under HTTP 200
    (LM Studio's ``{"error": "Model unloaded"}``), and decoding it as SSE would lose the message.
    Reads at most 64 KiB of such a body."""
    if resp.status_code < 300 and _media_type(resp) != "application/json":
        return
    if resp.is_redirect:
        raise _redirect_error(resp)
    raw = await _read_capped(resp)
    body = decode_json_body(raw)
    text = raw.decode("utf-8", "replace")
    if resp.status_code < 300 and parse_error_body(body) is None:
        raise StreamRefusedError(f"expected a stream, got a JSON body (the server does not stream): {text[:200]!r}")
    raise error_from_response(resp.status_code, body, headers=resp.headers, text=text)


def _media_type(resp: httpx.Response) -> str:
    return str(resp.headers.get("content-type", "")).partition(";")[0].strip().lower()


async def _read_capped(resp: httpx.Response) -> bytes:
    body = bytearray()
    async for part in resp.aiter_bytes():
        body += part
        if len(body) >= MAX_ERROR_BODY:
            break
    return bytes(body[:MAX_ERROR_BODY])


def _redirect_error(resp: httpx.Response) -> ProviderProtocolError:
    # A redirect would re-send a generation to an address nobody checked; say so instead.
    return ProviderProtocolError(
        f"unexpected redirect {resp.status_code} to {resp.headers.get('location', '?')!r} "
        "(redirects are not followed: point base_url at the final address)"
    )


def json_body(resp: httpx.Response) -> Any:
    """The JSON body of a read response; an error body (even under HTTP 200) raises typed."""
    if resp.is_redirect:
        raise _redirect_error(resp)
    if resp.status_code >= 300:
        raise error_from_response(
            resp.status_code, decode_json_body(resp.content), headers=resp.headers, text=resp.text[:500]
        )
    body = decode_json_body(resp.content)
    if body is None:
        raise ProviderProtocolError(f"expected a JSON body, got {resp.content[:200]!r}")
    if parse_error_body(body) is not None and isinstance(body, dict) and "choices" not in body:
        raise error_from_response(200, body)
    return body


async def read_chunks(
    source: AbstractAsyncContextManager[httpx.Response] | AsyncGenerator[bytes, None], decoder: ChunkDecoder
) -> AsyncGenerator[StreamChunk, None]:
    """The one read loop: an answer's bytes through a wire's sans-io ``decoder`` (a fresh one per
    answer), chunk by chunk, up to its final frame (then the rest of the body is drained, so the
    connection goes back to the pool) or the end of its bytes (``decoder.end()`` says whether the
    answer was whole). ``source`` is the request's ``ctx.stream(...)`` unopened, or the bytes of
    an answer that spans connections (``http.resume.resumed_bytes``: one decoder across all of
    them, so a frame cut by a drop is completed by the resumed connection).

    This is the lane's stream itself, not wrapped in another generator: the gateway pays this
    path for every upstream chunk."""
    async with _bytes_of(source) as parts:
        async for part in parts:
            for chunk in decoder.feed(part):
                yield chunk
            if decoder.done:
                await drain(parts)
                return
    for chunk in decoder.end():
        yield chunk


@asynccontextmanager
async def _bytes_of(
    source: AbstractAsyncContextManager[httpx.Response] | AsyncGenerator[bytes, None],
) -> AsyncIterator[AsyncIterator[bytes]]:
    if isinstance(source, AsyncGenerator):
        async with aclosing(source):
            yield source
        return
    async with source as resp:
        await expect_stream(resp)
        yield resp.aiter_bytes()


DRAIN_SECONDS = 0.25


async def drain(parts: AsyncIterator[bytes]) -> None:
    """Read what follows the last frame (the chunked body's terminator) so the connection ends
    its response cleanly and is kept for the next call, instead of a new TCP connection per
    call (a connect's latency, and a TIME_WAIT socket each). Bounded: a server that keeps the
    body open after ``[DONE]`` costs at most ``DRAIN_SECONDS`` and its connection is dropped."""
    with anyio.move_on_after(DRAIN_SECONDS):
        async for _ in parts:
            pass


_scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner json.loads ends in


def load_frame(data: str) -> Any:
    """Parse one SSE ``data`` payload as JSON; an error frame raises typed."""
    # The C scanner straight away: json.loads' Python layers (and its trailing-whitespace regex)
    # cost about a microsecond per token. Anything but one bare JSON value goes to json.loads,
    # which accepts surrounding whitespace or says what is wrong.
    try:
        obj, end = _scan_once(data, 0)
    except (StopIteration, ValueError, RecursionError):
        end = -1
    if end != len(data):
        try:
            obj = json.loads(data)  # from str: no re-encoding, no encoding detection
        except (ValueError, RecursionError):
            raise ProviderProtocolError(f"malformed SSE frame: {data[:200]!r}") from None
    if type(obj) is dict and "error" not in obj and obj.get("object") != "error":
        return obj  # the hot path: a plain frame (error_from_frame would say None)
    err = error_from_frame(obj)
    if err is not None:
        raise err
    return obj


def raise_if_error(obj: Any) -> None:
    """Raise the typed error of an error status (or an error body under 200); return otherwise."""
    err = error_from_frame(obj)
    if err is not None:
        raise err


# Set by a prober (the fleet's background health check) around a lane's ``wait_ready``: one
# request, and its answer is the verdict — a refused connection means "not ready", not "ask
# again" (a lane's own wait_ready polls; the prober has its own interval).
single_probe: contextvars.ContextVar[bool] = contextvars.ContextVar("abstract_client_single_probe", default=False)


async def poll_until_ready(
    client: httpx.AsyncClient,
    path: str,
    timeout: float,
    *,
    provider: str,
    interval: float = 0.25,
    ready: Callable[[httpx.Response], bool] | None = None,
) -> None:
    """Poll ``GET path`` until it answers 200 (and ``ready(resp)``, when given); connection
    refused and 503 mean "not yet". Not ready within ``timeout`` → ``ServerUnavailableError``.
    Under :data:`single_probe`, one request only."""
    last: BaseException | str = "no answer"
    once = single_probe.get()
    with anyio.move_on_after(timeout):
        while True:
            try:
                resp = await client.get(path)
                if resp.status_code == 200 and (ready is None or ready(resp)):
                    return
                last = f"HTTP {resp.status_code}" + ("" if resp.status_code != 200 else f": {resp.text[:200]!r}")
            except httpx.HTTPError as exc:
                last = exc
            if once:
                break
            await anyio.sleep(interval)
    if once:
        raise ServerUnavailableError(f"{provider} not ready ({last})", provider=provider)
    raise ServerUnavailableError(f"{provider} not ready after {timeout}s (last: {last})", provider=provider)


__all__ = [
    "DRAIN_SECONDS",
    "drain",
    "json_body",
    "load_frame",
    "poll_until_ready",
    "expect_stream",
    "raise_if_error",
    "read_chunks",
    "single_probe",
]
