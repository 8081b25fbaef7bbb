"""The sync API: each ``LLM`` owns one daemon thread that runs the same async contract
(:class:`Portal`), started on the first sync call and ended by ``LLM.close()`` (or when the LLM
is garbage-collected); :class:`SyncGenerationStream` is the sync face of a stream.

So there is one code path for sync and async: a sync call submits the coroutine here and blocks
on its result. A ``KeyboardInterrupt`` (or any exception) in the waiting thread stops the call
first, waits for it to unwind (bounded), then propagates unchanged. ``break`` out of
``for chunk in llm.stream(...)`` drops the last reference to the stream; CPython runs
``__del__`` at once, which severs the socket synchronously (no GC pass needed: nothing here is
in a reference cycle).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import sniffio

from .contract import Call, GenerationStream, SyncStop, hand_over, stop_error
from .stopping.loop import on_event_loop
from .stopping.token import Step
from .types import GenerateResult, StreamChunk

log = logging.getLogger(__name__)
T = TypeVar("T")

_UNWIND_WAIT = 5.0
# How long a stop may hold the sever back while the sync caller it just woke raises (Step.HAND_OFF)
HANDOFF_S = 0.002


class Portal:
    """Each ``LLM``'s loop thread, and the sync caller's side of a call: it waits on the call and is
    woken by the stop itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run_loop() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    try:
                        loop.run_forever()
                        # Finalise what is left (e.g. the parked generators that close this
                        # loop's HTTP clients) before the loop goes.
                        loop.run_until_complete(loop.shutdown_asyncgens())
                    finally:
                        loop.close()

                self._thread = threading.Thread(target=run_loop, name="abstract-client-sync", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def shutdown(self, timeout: float = 5.0) -> None:
        """End the loop thread (idempotent; a later ``run`` starts a new one)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or not thread.is_alive():
            return
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:  # already closed
            return
        if threading.current_thread() is not thread:
            thread.join(timeout)

    def run(
        self,
        fn: Callable[[], Coroutine[Any, Any, T]],
        *,
        call: Call | None = None,
        on_interrupt: Callable[[], object] | None = None,
        on_abandon: Callable[[], Coroutine[Any, Any, Any]] | None = None,
    ) -> T:
        """Run ``fn()`` on the loop thread and return its result, raising its exception.

        With ``call`` (a generation or an embedding): the moment its stop is requested, this
        thread is woken by the stop itself (``Step.WAKE``) and raises the call's one
        ``GenerationCancelledError``, built here, with the partial text of that moment, without
        waiting for the loop (whose share of the stop, ``Step.LOOP``, may be behind other work);
        the loop closes the rest behind it (``on_abandon``). ``on_interrupt`` (default: stop the
        call) runs when this thread is interrupted (Ctrl-C) while waiting.
        """
        loop = self.loop
        if threading.current_thread() is self._thread:
            raise RuntimeError("the sync API cannot be called from its own event loop thread")
        if call is None:
            return self._wait(_on_loop(fn(), loop), None, on_interrupt)
        if not call.sync:  # built by a sync method: its stop error is built here, by the thread that raises it
            raise RuntimeError("an async call cannot be run by the sync portal")
        if call.token.stopped_by_caller:
            # Stopped while the caller was busy elsewhere (e.g. between two chunks of a stream):
            # raise here, without a round trip through the loop; the loop closes up behind.
            if on_abandon is not None:
                self.submit(on_abandon)
            raise _handed_over(call)
        future: concurrent.futures.Future[T] = _on_loop(fn(), loop)
        raised = threading.Event()
        me = threading.get_ident()

        def hand_off() -> None:  # Step.HAND_OFF, in the stopping thread
            if threading.get_ident() != me and not on_event_loop():
                raised.wait(HANDOFF_S)

        wake = threading.Event()
        future.add_done_callback(lambda _: wake.set())
        removes = [call.token.add_hook(wake.set, step=Step.WAKE), call.token.add_hook(hand_off, step=Step.HAND_OFF)]
        try:
            try:
                wake.wait()
            except BaseException:  # interrupted while waiting (Ctrl-C): stop, unwind, propagate
                self._unwind(future, on_interrupt or call.token.stop)
                raise
            if not future.done() and call.token.stopped_by_caller:
                if on_abandon is not None:
                    # The caller leaves now; once the step it abandoned has unwound on the loop,
                    # finish the job there (close the stream, release the call).
                    future.add_done_callback(lambda _: self.submit(on_abandon))
                err = _handed_over(call)
                raised.set()  # the stopping thread may go on: sever, then the loop's work
                raise err
            return self._wait(future, call, on_interrupt or call.token.stop)
        finally:
            raised.set()
            for remove in removes:
                remove()

    @staticmethod
    def _wait(future: concurrent.futures.Future[T], call: Call | None, on_interrupt: Callable[[], object] | None) -> T:
        try:
            return future.result()
        except SyncStop:
            # The loop's word for "stopped": the one error is built here, for this caller.
            assert call is not None
            raise _handed_over(call) from None
        except BaseException:
            if not future.done():  # interrupted while waiting (Ctrl-C): stop, unwind, propagate
                Portal._unwind(future, on_interrupt)
            raise

    @staticmethod
    def _unwind(future: concurrent.futures.Future[Any], on_interrupt: Callable[[], object] | None) -> None:
        if on_interrupt is not None:
            on_interrupt()
        try:
            future.result(timeout=_UNWIND_WAIT)
        except BaseException:
            pass

    def submit(self, fn: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Fire and forget (cleanup from ``__del__``). Not while the interpreter ends: a loop
        thread started then never runs, and its start would wait for it for ever."""
        if sys.is_finalizing():
            fn().close()
            return
        try:
            _on_loop(fn(), self.loop)
        except RuntimeError:
            pass


def _on_loop(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future[T]:
    """``coro`` on ``loop`` (another thread's), in a copy of this thread's context (a trace's
    parent goes with it) that does not say which async library runs: sniffio reads it from a
    context variable, and a caller on trio would make anyio on the loop thread take asyncio for
    trio (a stop's cancel request from a trio task was never sent)."""
    context = contextvars.copy_context()
    context.run(sniffio.current_async_library_cvar.set, None)
    return context.run(asyncio.run_coroutine_threadsafe, coro, loop)


def _handed_over(call: Call) -> BaseException:
    """The stop this sync caller raises; from here on the call is not listed in flight."""
    err = stop_error(call)
    hand_over(call)
    return err


class SyncGenerationStream:
    """What :meth:`LLM.stream` returns: an iterator of :class:`StreamChunk` that is also a
    context manager. Each ``next()`` runs the async stream's step on the LLM's loop thread; a
    stop raises ``GenerationCancelledError`` from ``next()`` at once."""

    def __init__(self, inner: GenerationStream, portal: Portal, owner: Any = None) -> None:
        self._inner = inner
        self._portal = portal
        self._owner = owner  # the LLM: its loop thread must outlive this stream
        self._stopped = False

    def __repr__(self) -> str:
        return repr(self._inner).replace("GenerationStream", "SyncGenerationStream")

    @property
    def request_id(self) -> str:
        """The call's id (for ``llm.cancel``)."""
        return self._inner.request_id

    @property
    def text(self) -> str:
        """Everything received so far."""
        return self._inner.text

    def result(self) -> GenerateResult:
        """The whole answer, once the stream has ended (``RuntimeError`` before)."""
        return self._inner.result()

    def cancel(self, reason: str = "user") -> None:
        """Stop from any thread; the iterating thread gets ``GenerationCancelledError``."""
        self._inner.cancel(reason)

    def __iter__(self) -> SyncGenerationStream:
        return self

    def __next__(self) -> StreamChunk:
        inner = self._inner
        if self._stopped or inner.state == "done":  # finished: a later cancel() changes nothing
            raise StopIteration
        call = inner.call
        try:
            return self._portal.run(inner.__anext__, call=call, on_abandon=inner.aclose)
        except StopAsyncIteration:
            raise StopIteration from None
        except BaseException:
            self._stopped = True
            raise

    def close(self) -> None:
        """Stop the generation now if it is still running (the server sees the connection go)."""
        if self._inner.state == "open":
            self._portal.run(self._inner.aclose)
        else:
            self._inner.abandon()

    def __enter__(self) -> SyncGenerationStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
