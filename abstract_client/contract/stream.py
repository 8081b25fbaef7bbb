"""Streaming under the contract: :class:`GenerationStream`.

Nothing is held until the first ``__anext__`` admits the call (rules 1-2). The provider's stream
is opened — and retried, only before its first chunk — inside the first step's scope (rules 3,
6). Each later chunk costs an attribute check and a record: the stop reaches a severable stream
through its socket, and a scope is paid for only where ``needs_scope`` says so. A stop that races
a chunk wins (rule 7). Leaving early — ``aclose()``, the ``async with`` block ending, or a
``break`` dropping the last reference — severs the connection at once, without waiting for GC.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio

from ..types import GenerateResult, StreamChunk
from .admission import admit, release
from .answer import finish_output, prepare
from .call import Call
from .lifecycle import Phase
from .run import result_of, with_retries
from .scope import needs_scope, step
from .translate import cancelled, judge_complete, raise_translated

__all__ = ["GenerationStream", "Source", "open_source"]

log = logging.getLogger(__name__)

_OPEN = frozenset({Phase.ADMITTED, Phase.PREPARED, Phase.ANSWERED})  # it holds a connection (or an engine job)
_STATE = {Phase.BUILT: "new", **dict.fromkeys(_OPEN, "open"), Phase.COMPLETED: "done", Phase.RELEASED: "done"}
Source = AsyncGenerator[StreamChunk, None]
_PULL_END_S = 10.0  # a close waits this long, at most, for another task's pull to end


async def open_source(call: Call) -> tuple[Source, StreamChunk | None]:
    """The provider's stream and its first chunk (None: it ended at once). A module-level
    function on purpose: nothing here may tie the stream object into a reference cycle, or a
    ``break`` would wait for a GC pass to sever the socket."""

    await prepare(call)

    async def attempt() -> tuple[Source, StreamChunk | None]:
        source = call.provider.stream(call.sent_request, call.ctx)
        try:
            return source, await source.__anext__()
        except StopAsyncIteration:
            return source, None
        except Exception:
            await source.aclose()
            raise

    return await with_retries(call, attempt)


class GenerationStream:
    """An async iterator of :class:`StreamChunk` that is also an async context manager.
    After the end, :meth:`result` gives the whole answer as a ``GenerateResult``."""

    def __init__(self, call: Call) -> None:
        self._call = call
        call.streaming = True
        self._source: Source | None = None
        # A pull of the provider's stream is under way (in some task): the source is running, and
        # closing it from another task now is "aclose(): asynchronous generator is already
        # running" — it stayed open, its connection unreleased. ``_pulled`` is made only by a
        # closer that has to wait for the pull to end.
        self._pulling = False
        self._pulled: anyio.Event | None = None

    def __repr__(self) -> str:
        return f"<GenerationStream {self._call.request_id} {self.state}>"

    @property
    def request_id(self) -> str:
        """The call's id (for ``llm.cancel``)."""
        return self._call.request_id

    @property
    def text(self) -> str:
        """Everything received so far."""
        return self._call.text

    @property
    def call(self) -> Call:
        """The contract's record of this call (its stop token, its progress)."""
        return self._call

    @property
    def state(self) -> str:
        """``new`` (nothing sent, nothing held), ``open`` or ``done``: the call's phase
        (``lifecycle.py``), as a stream's reader names it."""
        return _STATE[self._call.phase]

    def abandon(self) -> None:
        """End a stream that was never started (it holds nothing, so no await is needed)."""
        if self._call.phase is Phase.BUILT:
            release(self._call)

    def cancel(self, reason: Any = "user") -> None:
        """Stop this stream from any thread; the consumer gets ``GenerationCancelledError``."""
        self._call.token.stop(reason)

    def result(self) -> GenerateResult:
        """The whole answer, once the stream has ended (``RuntimeError`` before)."""
        if self._call.phase is not Phase.COMPLETED:
            raise RuntimeError("the stream has not finished")
        return result_of(self._call)

    def __aiter__(self) -> GenerationStream:
        return self

    async def __aenter__(self) -> GenerationStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def __anext__(self) -> StreamChunk:
        call, source = self._call, self._source
        if source is None:
            if call.phase is Phase.BUILT:
                return await self._start()
            raise StopAsyncIteration
        self._pulling = True
        try:
            if needs_scope(call, "idle"):
                chunk = await step(call, source.__anext__, "idle")
            else:
                try:
                    chunk = await source.__anext__()  # the hot path: no scope, no hook
                except StopAsyncIteration:
                    raise
                except BaseException as exc:
                    raise_translated(call, exc)
                    raise
        except StopAsyncIteration:
            self._pulled_now()
            await self._end()
            raise
        except BaseException:
            self._pulled_now()
            await self._finish()
            raise
        self._pulled_now()
        return await self._deliver(chunk)

    def _pulled_now(self) -> None:
        self._pulling = False
        if self._pulled is not None:
            self._pulled.set()
            self._pulled = None

    async def _end(self) -> None:
        """The provider's stream ended: complete, unless a stop was requested first (rule 7)."""
        if judge_complete(self._call):
            await self._finish(clean=True)
            finish_output(self._call)  # only a complete answer is parsed and validated
            return
        await self._finish()
        raise cancelled(self._call) from None

    async def _start(self) -> StreamChunk:
        call = self._call
        try:
            await admit(call)
        except BaseException:
            release(call)  # admission refused (a duplicate id) or was stopped: the stream is over
            raise
        try:
            source, first = await step(call, lambda: open_source(call), "first")
        except BaseException:
            await self._finish()
            raise
        self._source = source
        if first is None:
            await self._end()
            raise StopAsyncIteration
        return await self._deliver(first)

    async def _deliver(self, chunk: StreamChunk) -> StreamChunk:
        call = self._call
        chunk = call.progress.record(chunk)
        if call.token.stopped_by_caller:
            await self._finish()
            raise cancelled(call)  # rule 7: a stop wins over a chunk that raced it
        return chunk

    async def aclose(self) -> None:
        """Stop the generation now if it is still running (the server sees the connection go)."""
        if self._call.phase in _OPEN:
            self._call.token.stop("user", internal=True)  # sever first: the server sees EOF now
            await self._finish()
        else:
            self.abandon()

    async def _finish(self, *, clean: bool = False) -> None:
        if self._pulling and self._source is not None:
            # closed from another task while one pulls (a sync caller's close after its stop was
            # handed over, an async task's aclose): the stop already requested ends that pull
            # (a sever, an engine's flag), and the source is closed after it, in order.
            pulled = self._pulled = self._pulled or anyio.Event()
            with anyio.CancelScope(shield=True), anyio.move_on_after(_PULL_END_S):
                await pulled.wait()
        source, self._source = self._source, None
        try:
            if source is not None:
                with anyio.CancelScope(shield=True):
                    await source.aclose()
        except Exception:  # the connection is gone either way; the caller gets the real error
            rid = self._call.request_id
            log.debug("closing %s", rid, exc_info=True, extra={"request_id": rid})
        finally:
            release(self._call, clean=clean)

    def __del__(self) -> None:
        # ``break`` out of ``async for``: no await possible here, but severing and releasing are
        # synchronous. The provider's generator is finalised later by the loop's asyncgen hooks.
        call = getattr(self, "_call", None)
        if call is not None and call.phase in _OPEN:
            call.token.stop("user", internal=True)
            release(call)
