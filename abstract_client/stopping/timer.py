"""One shared timer thread for deadlines that have no event loop to run on.

``AbortSignal.timeout(seconds)`` must abort by itself, from whatever thread or loop is around, so
its deadline lives here: one daemon thread per process, started on first use, asleep until the
next deadline (no polling: a ``threading.Event`` stop source is hooked, see ``event_hook.py``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Watcher", "watcher"]

log = logging.getLogger(__name__)


class Watcher:
    """One thread for every deadline (``AbortSignal.timeout``): each fires its callback once, or is
    cancelled."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadlines: list[tuple[float, int, Callable[[], object]]] = []
        self._cancelled: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def call_at(self, when: float, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback()`` on the watcher thread at ``time.monotonic() >= when``; returns a
        function that cancels it."""
        with self._cond:
            key = next(self._ids)
            heapq.heappush(self._deadlines, (when, key, callback))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="abstract-client-watcher", daemon=True)
                self._thread.start()
            self._cond.notify()

        def cancel() -> None:
            with self._cond:
                self._cancelled.add(key)
                self._cond.notify()

        return cancel

    def _run(self) -> None:
        while True:
            due: list[Callable[[], object]] = []
            with self._cond:
                now = time.monotonic()
                while self._deadlines and (self._deadlines[0][0] <= now or self._deadlines[0][1] in self._cancelled):
                    _, key, callback = heapq.heappop(self._deadlines)
                    if key in self._cancelled:
                        self._cancelled.discard(key)
                    else:
                        due.append(callback)
                if not due:
                    self._cond.wait(max(0.0, self._deadlines[0][0] - now) if self._deadlines else None)
            for callback in due:
                try:
                    callback()
                except Exception:  # a stop hook must never kill the watcher
                    log.exception("deadline callback failed")


_watcher = Watcher()


def watcher() -> Watcher:
    """The process's deadline thread."""
    return _watcher
