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
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .contract import GenerationStream, cancelled
from .stopping.token import PRIORITY_WAKE, SyncWaiter
from .types import GenerateResult, StreamChunk

if TYPE_CHECKING:
    from .stopping.token import StopToken

log = logging.getLogger(__name__)
T = TypeVar("T")

_UNWIND_WAIT = 5.0


class Portal:
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

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    try:
                        loop.run_forever()
                        # Finalise what is left (e.g. the parked generators that close this
                        # loop's HTTP clients) before the loop goes.
                        loop.run_until_complete(loop.shutdown_asyncgens())
                    finally:
                        loop.close()

                self._thread = threading.Thread(target=run, name="abstract-client-sync", daemon=True)
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
        on_interrupt: Callable[[], object] | None = None,
        stop: StopToken | None = None,
        stopped_error: Callable[[], BaseException] | None = None,
        on_abandon: Callable[[], Coroutine[Any, Any, Any]] | None = None,
    ) -> T:
        """Run ``fn()`` on the loop thread and return its result, raising its exception.

        With ``stop``/``stopped_error``: the moment the stop is requested, the waiting thread is
        woken by the stop hook itself and raises ``stopped_error()`` (the contract's error, with
        the partial text) without waiting for the loop to finish unwinding — the hooks have
        already severed the connection; the loop closes the rest behind it (``on_abandon``).
        """
        loop = self.loop
        if threading.current_thread() is self._thread:
            raise RuntimeError("the sync API cannot be called from its own event loop thread")
        if stop is not None and stopped_error is not None and stop.is_set and not stop.internal:
            # Stopped while the caller was busy elsewhere (e.g. between two chunks of a stream):
            # raise here, without a round trip through the loop; the loop closes up behind.
            if on_abandon is not None:
                self.submit(on_abandon)
            raise stopped_error()
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(fn(), loop)
        wake = threading.Event()
        future.add_done_callback(lambda _: wake.set())
        waiter = SyncWaiter()
        remove = None
        if stop is not None and stopped_error is not None:
            stop.waiter = waiter
            remove = stop.add_hook(wake.set, priority=PRIORITY_WAKE)
        try:
            wake.wait()
            if not future.done() and stop is not None and stopped_error is not None and not stop.internal:
                if on_abandon is not None:
                    # The caller leaves now; once the step it abandoned has unwound on the loop,
                    # finish the job there (close the stream, release the call).
                    future.add_done_callback(lambda _: self.submit(on_abandon))
                err = stopped_error()
                waiter.raised.set()  # the stopping thread may sever now (StopToken._hand_off)
                raise err
            return future.result()
        except BaseException:
            if future.done() or (stop is not None and stop.is_set and not stop.internal):
                raise
            # Interrupted while waiting (Ctrl-C): stop the call, let it unwind, then propagate.
            if on_interrupt is not None:
                on_interrupt()
            try:
                future.result(timeout=_UNWIND_WAIT)
            except BaseException:
                pass
            raise
        finally:
            waiter.raised.set()
            if stop is not None and stop.waiter is waiter:
                stop.waiter = None
            if remove is not None:
                remove()

    def submit(self, fn: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Fire and forget (cleanup from ``__del__``)."""
        try:
            asyncio.run_coroutine_threadsafe(fn(), self.loop)
        except RuntimeError:
            pass


class SyncGenerationStream:
    def __init__(self, inner: GenerationStream, portal: Portal, owner: Any = None) -> None:
        self._inner = inner
        self._portal = portal
        self._owner = owner  # the LLM: its loop thread must outlive this stream
        self._stopped = False

    def __repr__(self) -> str:
        return repr(self._inner).replace("GenerationStream", "SyncGenerationStream")

    @property
    def request_id(self) -> str:
        return self._inner.request_id

    @property
    def text(self) -> str:
        return self._inner.text

    def result(self) -> GenerateResult:
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
            return self._portal.run(
                inner.__anext__,
                on_interrupt=inner.cancel,
                stop=call.token,
                stopped_error=lambda: cancelled(call),
                on_abandon=inner.aclose,
            )
        except StopAsyncIteration:
            raise StopIteration from None
        except BaseException:
            self._stopped = True
            raise

    def close(self) -> None:
        if self._inner.state == "open":
            self._portal.run(self._inner.aclose)
        else:
            self._inner.abandon()

    def __enter__(self) -> SyncGenerationStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
