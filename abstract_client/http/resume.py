"""The bytes of a resumable stream: one answer across the connections it takes.

A server that keeps a stream's bytes past a disconnect (llama-server with ``X-Conversation-Id``
and ``GET /v1/stream?conv_id=…&from=N``; a Responses API ``background`` response) lets a client
whose connection dropped read on from the byte it had. This generator is that client's side:
it yields the body of the first response; when the connection drops before the body ended
(reset, a proxy's cut, an idle close), it opens ``reopen(offset)`` — ``offset`` the count of
body bytes already yielded — and yields on, so a decoder fed from it sees one byte stream: no
byte lost or repeated, whatever frame the cut fell in.

Bounded: ``resume_timeout`` seconds from a drop to a reopened stream (attempts back off from
50 ms to 1 s); then a :class:`TransportError`. Never after a stop: the token is checked
before each attempt, a stop ends the pause between attempts at once, and a reopened connection
is the call's, which the stop severs. The stop's other half — the server's own cancel, for a stream that outlives its
connection — is the lane's (``ServerCancels``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import anyio
import httpx

from ..errors import TransportError
from ..stopping.loop import loop_caller
from ..stopping.token import StopToken
from .guard import SocketGuard, current_guard
from .wire import expect_stream

__all__ = ["resumed_bytes", "resumed_items"]

P = TypeVar("P")
T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)

# what a dropped connection raises, reading on or connecting anew
_DROPS = (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError, httpx.ConnectError, httpx.ConnectTimeout)


def resumed_bytes(
    first: Callable[[], AbstractAsyncContextManager[httpx.Response]],
    reopen: Callable[[int], AbstractAsyncContextManager[httpx.Response]],
    *,
    resume_timeout: float,
    token: StopToken,
    provider: str,
) -> AsyncGenerator[bytes, None]:
    """The body bytes of a stream resumed by byte offset (llama-server's ``/v1/stream``)."""
    return resumed_items(
        first,
        reopen,
        read=lambda resp: resp.aiter_bytes(),
        advance=lambda offset, part: offset + len(part),
        start=0,
        where=lambda offset: f"byte {offset}",
        resume_timeout=resume_timeout,
        token=token,
        provider=provider,
    )


async def resumed_items(
    first: Callable[[], AbstractAsyncContextManager[httpx.Response]],
    reopen: Callable[[P], AbstractAsyncContextManager[httpx.Response]],
    *,
    read: Callable[[httpx.Response], AsyncIterator[T]],
    advance: Callable[[P, T], P],
    start: P,
    where: Callable[[P], str],
    resume_timeout: float,
    token: StopToken,
    provider: str,
    seen: Callable[[P, T], bool] | None = None,
) -> AsyncGenerator[T, None]:
    """What ``read`` takes from each connection of a stream, as one sequence: ``advance`` keeps
    the position of the last item handed out (a byte offset, an event's sequence number) and a
    drop reopens the stream there. ``read`` decides what a connection's items are: a decoder of
    its own drops a frame the cut fell in (a resume by event number sends it again whole).
    ``seen(position, item)``: an item at or before the position, dropped — a server (or a
    proxy) that ignores the resume's position, or sends an event twice, never hands out text
    twice."""
    position = start
    # The call's guard, taken now (inside the contract's step): a reopened connection is made
    # from an await the contract runs without one, and a connection no guard holds is one the
    # stop cannot sever (the resumed GET stayed open after a Stop).
    guard = current_guard.get()
    opening = first()
    dropped_at: float | None = None
    delay = 0.05
    resumes = 0
    while True:
        # a resume attempt, connection and first item, is bounded by what is left of
        # resume_timeout (an accepted, never answered GET held the caller for ever)
        resume_by = None if dropped_at is None else dropped_at + resume_timeout
        try:
            async with contextlib.AsyncExitStack() as stack:
                resp = await _bounded(resume_by, stack.enter_async_context(opening), guard)
                if resp is None:
                    raise _unresumed(provider, where(position), resume_timeout, "no answer to the resumed request")
                if resumes and resp.status_code in (400, 404, 410):  # expired, evicted, or cancelled
                    raise TransportError(
                        f"the server no longer holds the stream (HTTP {resp.status_code} at {where(position)})",
                        provider=provider,
                    )
                await expect_stream(resp)
                items = read(resp)
                try:
                    waiting_first = resume_by is not None
                    while True:
                        if waiting_first:
                            got = await _bounded(resume_by, _next(items), guard)
                            if got is None:
                                raise _unresumed(
                                    provider, where(position), resume_timeout, "nothing on the resumed stream"
                                )
                            if not got:  # the end
                                break
                            item = got[0]
                            waiting_first = False
                        else:
                            try:
                                item = await items.__anext__()
                            except StopAsyncIteration:
                                break
                        dropped_at, delay = None, 0.05
                        if seen is not None and seen(position, item):
                            continue
                        position = advance(position, item)
                        yield item
                finally:
                    close = getattr(items, "aclose", None)
                    if close is not None:
                        await close()
            return
        except _DROPS as exc:
            if token.is_set:
                raise
            now = anyio.current_time()
            dropped_at = now if dropped_at is None else dropped_at
            if now - dropped_at >= resume_timeout:
                raise _unresumed(provider, where(position), resume_timeout, f"{type(exc).__name__}: {exc}") from exc
            log.info("%s: the stream dropped at %s (%s); resuming", provider, where(position), type(exc).__name__)
            if not await _pause(min(delay, max(0.0, dropped_at + resume_timeout - now)), token):
                raise  # stopped in the pause: the contract makes it the stop
            delay = min(delay * 2, 1.0)
            resumes += 1
            opening = reopen(position)


async def _next(items: AsyncIterator[T]) -> tuple[T] | tuple[()]:
    """The next item, as a 1-tuple; ``()`` at the end."""
    try:
        return (await items.__anext__(),)
    except StopAsyncIteration:
        return ()


async def _bounded(by: float | None, awaitable: Awaitable[R], guard: SocketGuard | None) -> R | None:
    """``await awaitable`` with the call's guard current (a connection it makes is the call's),
    until ``by`` (loop time; None: no bound). None when ``by`` passed first."""
    reset = current_guard.set(guard)
    try:
        if by is None:
            return await awaitable
        with anyio.move_on_after(max(0.0, by - anyio.current_time())):
            return await awaitable
        return None
    finally:
        current_guard.reset(reset)


def _unresumed(provider: str, at: str, resume_timeout: float, what: str) -> TransportError:
    return TransportError(
        f"the stream dropped at {at} and could not be resumed within {resume_timeout:g} s ({what})", provider=provider
    )


async def _pause(seconds: float, token: StopToken) -> bool:
    """Sleep ``seconds``; a stop ends the sleep at once (the stream's reads have no cancel scope:
    a sever ends them, and nothing severs a sleep). False if the stop came."""
    call_soon = loop_caller()
    with anyio.CancelScope() as scope:
        remove = token.add_hook(lambda: call_soon(scope.cancel))
        try:
            await anyio.sleep(seconds)
        finally:
            remove()
    return not token.is_set
