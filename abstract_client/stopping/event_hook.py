"""A callback when a ``threading.Event`` is set, without polling and without a thread per event.

``threading.Event`` has no callback. Polling it costs CPU for as long as a call is in flight (the
0.2 ms poll this replaces cost ~10 % of a core for ONE call) and a waiter thread per event costs a
thread per call. Instead we hook the Event's own wake-up: ``Event.set()`` is

    with self._cond:
        self._flag = True
        self._cond.notify_all()

so the event's ``_cond`` is replaced, once, by :class:`_NotifyingCondition` — the *same*
Condition (same lock, same waiters, every method delegated) whose ``notify_all()`` also calls the
registered listeners, synchronously, in the thread that set the event. A stop therefore severs
the socket in the stopping thread, with no hop at all.

Why this is safe: ``set()`` reads ``self._cond`` again *after* taking the lock, and the swap is
made while holding that same lock, so a ``set()`` racing the swap still calls our
``notify_all()``; ``wait()``/``clear()`` only use the lock and ``wait()``, which are the inner
Condition's. Listeners run while the setter holds the event's lock: they must not block or touch
that event (ours only shut a socket down, set another event and schedule loop work).

Fallback: an Event subclass that overrides ``set``/``wait``, or an object without the CPython
``_cond`` layout, gets a small waiter thread blocked in ``event.wait()`` (no CPU while waiting,
the callback fires the moment ``set()`` notifies), which exits when the listener is removed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Listener", "listeners_on", "on_set"]

log = logging.getLogger(__name__)

Listener = Callable[[], object]
_install_lock = threading.Lock()
_FALLBACK_RECHECK = 0.05  # how often a fallback waiter looks whether it was released


class _NotifyingCondition:
    """Stands in for an Event's Condition: delegates everything, and ``notify_all`` also fires
    the one-shot listeners."""

    def __init__(self, inner: threading.Condition) -> None:
        self._inner = inner
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        return self._inner.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(*exc)  # type: ignore[arg-type]

    def wait(self, timeout: float | None = None) -> bool:
        return self._inner.wait(timeout)

    def notify(self, n: int = 1) -> None:
        self._inner.notify(n)

    def notify_all(self) -> None:
        self._inner.notify_all()
        with self._lock:
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            try:
                listener()
            except Exception:  # one broken listener must not keep the others from stopping
                log.exception("threading.Event listener failed")

    def __getattr__(self, name: str) -> object:  # acquire, release, _is_owned, _at_fork_reinit...
        return getattr(self._inner, name)

    def add(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove(self, listener: Listener) -> bool:
        """Remove ``listener``; False if it was not there (it already fired)."""
        with self._lock:
            for i, candidate in enumerate(self._listeners):
                if candidate is listener:
                    del self._listeners[i]
                    return True
        return False

    @property
    def listeners(self) -> int:
        with self._lock:
            return len(self._listeners)


def _hookable(event: threading.Event) -> bool:
    cls = type(event)
    return (
        cls.set is threading.Event.set
        and cls.wait is threading.Event.wait
        and isinstance(getattr(event, "_cond", None), (threading.Condition, _NotifyingCondition))
    )


def on_set(event: threading.Event, listener: Listener) -> Callable[[], None]:
    """Call ``listener()`` once, in the setting thread, when ``event`` is set (at once if it
    already is). Returns a function that removes the listener; call it when no longer needed."""
    if not _hookable(event):
        return _fallback_waiter(event, listener)
    cond = event._cond  # type: ignore[attr-defined]
    if not isinstance(cond, _NotifyingCondition):
        with _install_lock:
            cond = event._cond  # type: ignore[attr-defined]
            if not isinstance(cond, _NotifyingCondition):
                with cond:  # hold the event's lock: no set() is half-way through while we swap
                    wrapper = _NotifyingCondition(cond)
                    event._cond = wrapper  # type: ignore[attr-defined]
                cond = wrapper
    cond.add(listener)
    if event.is_set() and cond.remove(listener):  # set before we listened (else it already fired)
        listener()
        return lambda: None
    hooked = cond

    def unhook() -> None:
        hooked.remove(listener)

    return unhook


def listeners_on(event: threading.Event) -> int:
    """How many listeners wait on ``event`` (for leak tests)."""
    cond = getattr(event, "_cond", None)
    return cond.listeners if isinstance(cond, _NotifyingCondition) else 0


def _fallback_waiter(event: threading.Event, listener: Listener) -> Callable[[], None]:
    released = threading.Event()

    def wait() -> None:
        while not released.is_set():
            if event.wait(_FALLBACK_RECHECK):
                if not released.is_set():
                    listener()
                return

    threading.Thread(target=wait, name="abstract-client-event-waiter", daemon=True).start()
    return released.set
