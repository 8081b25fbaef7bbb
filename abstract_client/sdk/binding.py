"""What ``stop_on`` blocks bind (``blocks.py`` makes the blocks): their sources, request ids and
latches, carried to the requests they send.

The SDKs' calls cannot take a stop argument, so the sources ride in a context variable: it
follows the call into whatever thread or task the SDK runs it on (``contextvars`` are copied by
``asyncio`` tasks, ``anyio.to_thread``, ``asyncio.to_thread`` and ``contextvars.copy_context``).
The transport reads it when a request is sent, so a stream keeps its sources after the block
ends, and a request sent later, outside any block, has none.

**A stopped call stays stopped.** Each block keeps a :class:`Latch`, set when one of the block's
sources fires (an event, a signal, a deadline, ``cancel(id)``), a request in flight or not: every
request the block sends afterwards — an SDK's retry, a framework's retry layer or fallback — is
stopped before a byte is sent, with the same reason. The latch also keeps the error of the
block's first stopped request, which the block's edge raises whatever a framework wrapped it in.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import GenerationCancelledError, StopReason
from ..stopping.abort import AbortSignal
from ..stopping.event_hook import on_set
from ..stopping.token import reason_from_signal

__all__ = ["Binding", "Fire", "Latch", "bind", "current_binding", "latches_named", "unbind"]


Fire = Callable[[StopReason, object, "float | None"], object]  # (reason, signal_reason, when)


class Latch:
    """A ``stop_on`` block's memory of its stop: ``(reason, signal_reason)`` once set, and the
    error its first stopped request raised (the one the block's edge raises); first wins."""

    __slots__ = ("_holds", "_listeners", "_lock", "_request", "error", "ids", "stop")

    def __init__(self, ids: tuple[str, ...] = ()) -> None:
        self.ids = ids  # the block's own request ids: cancel(id) finds it while it is held
        self._holds = 0
        self.stop: tuple[StopReason, object] | None = None
        self.error: GenerationCancelledError | None = None
        self._request: Callable[[], GenerationCancelledError] | None = None
        self._lock = threading.Lock()
        self._listeners: list[Fire] = []

    def stopped_request(self, error: Callable[[], GenerationCancelledError]) -> None:
        """A request of the block was stopped by the caller: ``error()`` makes its error (the
        block's, if no request raised one: an async block cancelled before it could)."""
        with self._lock:
            if self._request is None:
                self._request = error

    def the_error(self) -> GenerationCancelledError | None:
        """The error of the block's first stopped request, made now if it was never raised."""
        with self._lock:
            error, request = self.error, self._request
        return error if error is not None or request is None else request()

    def set(self, reason: StopReason, signal_reason: object = None) -> int:
        """Remember the stop and tell the listeners (the requests in flight in the block or one
        nested in it, a sleep, an async block's scope); how many requests it stopped."""
        with self._lock:
            if self.stop is not None:
                return 0
            self.stop = (reason, signal_reason)
            listeners, self._listeners = self._listeners, []
        return sum(listener(reason, signal_reason, None) is True for listener in listeners)

    def listen(self, fire: Fire) -> Callable[[], None]:
        """``fire`` once the latch is set (at once if it is); returns its removal. A latch
        listened to is held: ``cancel`` of its ids still finds it after its block ended (a
        stream bound in the block, read after it)."""
        with self._lock:
            stop = self.stop
            if stop is None:
                self._listeners.append(fire)
        if stop is not None:
            fire(stop[0], stop[1], None)
            return lambda: None
        self.hold()

        def remove() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(fire)
            self.drop()

        return remove

    def hold(self) -> None:
        """Findable by its ids (``latches_named``) until as many :meth:`drop` calls."""
        with _by_id_lock:
            self._holds += 1
            if self._holds == 1:
                for request_id in self.ids:
                    _by_id.setdefault(request_id, []).append(self)

    def drop(self) -> None:
        with _by_id_lock:
            self._holds -= 1
            if self._holds:
                return
            for request_id in self.ids:
                latches = _by_id.get(request_id, [])
                if self in latches:
                    latches.remove(self)
                if not latches:
                    _by_id.pop(request_id, None)

    def raised(self, error: GenerationCancelledError) -> None:
        with self._lock:
            if self.error is None:
                self.error = error


_by_id: dict[str, list[Latch]] = {}  # the latches held under each request id
_by_id_lock = threading.Lock()


@dataclass(frozen=True)
class Binding:
    """What ``stop_on`` blocks, innermost last, have bound: every source stops the request, every
    request id names it (``cancel`` of any of them stops it), and each block's latch remembers a
    stop for the requests sent after it."""

    events: tuple[threading.Event, ...] = ()
    signals: tuple[AbortSignal, ...] = ()
    request_ids: tuple[str, ...] = ()
    latches: tuple[Latch, ...] = ()

    @property
    def bound(self) -> bool:
        """Inside a ``stop_on`` block (every block has a latch)."""
        return bool(self.latches)

    @property
    def request_id(self) -> str | None:
        """The innermost block's id: the request's name."""
        return self.request_ids[-1] if self.request_ids else None

    def stopped(self) -> tuple[StopReason, object] | None:
        """``(reason, signal_reason)`` if a source has stopped already (a latch set, an event
        set, a signal aborted), else None."""
        for latch in reversed(self.latches):
            if latch.stop is not None:
                return latch.stop
        for event in self.events:
            if event.is_set():
                return "user", None
        for signal in self.signals:
            if signal.aborted:
                return reason_from_signal(signal.reason), signal.reason
        return None

    def watch(self, fire: Fire) -> Callable[[], None]:
        """Call ``fire(reason, signal_reason, when)`` when any source stops (an event set, a
        signal aborted, a block's latch set: ``cancel(id)``, or another request of the block
        stopped), at once for one that already has; it may be called more than once, from any
        thread, and must not block. Returns what removes every hook."""
        unhooks: list[Callable[[], None]] = []
        for event in self.events:
            unhooks.append(on_set(event, lambda: fire("user", None, None)))
        for signal in self.signals:

            def on_abort(sig: AbortSignal) -> None:
                fire(reason_from_signal(sig.reason), sig.reason, sig.aborted_at)

            signal.add_listener(on_abort)
            unhooks.append(functools.partial(signal.remove_listener, on_abort))
            if signal.aborted:
                on_abort(signal)
        for latch in self.latches:
            unhooks.append(latch.listen(fire))

        def unwatch() -> None:
            for unhook in unhooks:
                unhook()

        return unwatch


def latches_named(request_id: str) -> list[Latch]:
    """The latches of the ``stop_on`` blocks open under ``request_id`` (``cancel`` sets them)."""
    with _by_id_lock:
        return list(_by_id.get(request_id, ()))


_NONE = Binding()
_current: contextvars.ContextVar[Binding] = contextvars.ContextVar("abstract_client_sdk_stop", default=_NONE)


def current_binding() -> Binding:
    return _current.get()


def bind(binding: Binding) -> contextvars.Token[Binding]:
    """Make ``binding`` the current one (a block entered); :func:`unbind` with what it returns."""
    return _current.set(binding)


def unbind(token: contextvars.Token[Binding]) -> None:
    _current.reset(token)
