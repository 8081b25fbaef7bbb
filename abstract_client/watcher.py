"""One shared watcher thread for the stop sources that have no callback of their own.

``AbortSignal`` listeners fire in the aborting thread, so they need nothing from here. A plain
``threading.Event`` offers no callback and a deadline needs a clock: the watcher polls the
registered events (every ``POLL_INTERVAL`` seconds, only while at least one is registered) and
sleeps until the next deadline otherwise. One thread serves every in-flight call of the process;
it is started on first use and is a daemon.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# 0.2 ms keeps the stop → raise latency of a threading.Event well under a millisecond; the loop
# costs ~1-2 % of one core, and only while an Event-driven call is in flight.
POLL_INTERVAL = 0.0002


class Watcher:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._events: dict[int, tuple[threading.Event, Callable[[], object]]] = {}
        self._deadlines: list[tuple[float, int, Callable[[], object]]] = []
        self._cancelled: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def watch_event(self, event: threading.Event, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback()`` once, on the watcher thread, when ``event`` is set."""
        with self._cond:
            key = next(self._ids)
            self._events[key] = (event, callback)
            self._ensure_thread()
            self._cond.notify()

        def unwatch() -> None:
            with self._cond:
                self._events.pop(key, None)

        return unwatch

    def call_at(self, when: float, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback()`` on the watcher thread at ``time.monotonic() >= when``."""
        with self._cond:
            key = next(self._ids)
            heapq.heappush(self._deadlines, (when, key, callback))
            self._ensure_thread()
            self._cond.notify()

        def cancel() -> None:
            with self._cond:
                self._cancelled.add(key)

        return cancel

    @property
    def watched(self) -> int:
        with self._cond:
            return len(self._events) + len(self._deadlines) - len(self._cancelled)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="abstract-client-watcher", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            due: list[Callable[[], object]] = []
            with self._cond:
                now = time.monotonic()
                for key, (event, callback) in list(self._events.items()):
                    if event.is_set():
                        del self._events[key]
                        due.append(callback)
                while self._deadlines and (self._deadlines[0][0] <= now or self._deadlines[0][1] in self._cancelled):
                    _, key, callback = heapq.heappop(self._deadlines)
                    if key in self._cancelled:
                        self._cancelled.discard(key)
                    else:
                        due.append(callback)
                if not due:
                    wait: float | None = None
                    if self._events:
                        wait = POLL_INTERVAL
                    if self._deadlines:
                        until = max(0.0, self._deadlines[0][0] - now)
                        wait = until if wait is None else min(wait, until)
                    self._cond.wait(wait)
            for callback in due:
                try:
                    callback()
                except Exception:  # a stop hook must never kill the watcher
                    log.exception("stop callback failed")


_watcher = Watcher()


def watcher() -> Watcher:
    return _watcher
