"""What every in-process lane shares: the thread that owns the engine, the engine's own record
of each request (the evidence a stop is judged by), and the messages a worker sends back.

:class:`EngineThread`: every call that touches the engine — load, generate, close a generator,
unload — runs on it, one at a time (MLX streams are bound to their thread). ``on_exit`` runs on
the thread before it ends (MLX: ``mx.clear_streams()``, without which the process can abort at
exit); the thread is shut down at interpreter exit too.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from abstract_client.stopping._loop import loop_caller

__all__ = ["END", "EngineThread", "Failure", "RequestStats"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_STOP = object()
END = object()  # a worker's last message for one request, after its last chunk


@dataclass
class RequestStats:
    """The engine side's own record of one request: the evidence a stop is judged by."""

    tokens: int = 0  # tokens sampled for this request (embeddings: inputs embedded)
    prefill_done: int = 0
    prefill_total: int = 0
    tokens_at_stop: int | None = None  # the counter when the worker saw the stop flag
    stopped_in: str | None = None  # "queue", "prefill", "decode" or "embed"
    stopped_at: float | None = None  # perf_counter when the worker saw the flag
    finished: bool = False


@dataclass
class Failure:
    """An engine failure as a worker reports it: a fresh record, never the exception (its
    traceback would pin the model's memory across threads)."""

    kind: str
    message: str


class EngineThread:
    def __init__(self, name: str, on_exit: Callable[[], object] | None = None) -> None:
        self.name = name
        self._on_exit = on_exit
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        ref = weakref.ref(self)

        def at_exit() -> None:
            thread = ref()
            if thread is not None:
                thread.shutdown()

        atexit.register(at_exit)

    @property
    def ident(self) -> int | None:
        return self._thread.ident if self._thread is not None else None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._pending == 0

    def wait_idle(self, timeout: float | None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
                self._thread.start()
            self._pending += 1
        self._jobs.put((fn, future))
        return future

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread; await it without blocking the event loop (asyncio
        or trio). A cancelled awaiter does not cancel the job: engine jobs stop via their flag."""
        future = self.submit(fn)
        done = anyio.Event()
        call = loop_caller()
        future.add_done_callback(lambda _: call(done.set))
        with anyio.CancelScope(shield=True):
            await done.wait()
        return future.result()

    def shutdown(self, timeout: float = 30.0) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        if threading.current_thread() is thread:
            return
        self._jobs.put(_STOP)
        thread.join(timeout)

    def _done_one(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def _main(self) -> None:
        try:
            while True:
                item = self._jobs.get()
                if item is _STOP:
                    return
                fn, future = item
                if not future.set_running_or_notify_cancel():
                    self._done_one()
                    continue
                try:
                    result = fn()
                except BaseException as exc:  # the job's error goes to its future, not the thread
                    del fn, item
                    self._done_one()  # idle before anyone awaiting the future wakes up
                    future.set_exception(exc)
                else:
                    del fn, item
                    self._done_one()
                    future.set_result(result)
                del future  # drop references (and tracebacks) before the next job
        finally:
            if self._on_exit is not None:
                try:
                    self._on_exit()
                except Exception:
                    log.exception("%s: exit hook failed", self.name)
