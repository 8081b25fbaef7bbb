"""``stop_on(...)``: the stop sources a request sent inside the block listens to.

The SDKs' calls cannot take a stop argument, so the sources ride in a context variable: it
follows the call into whatever thread or task the SDK runs it on (``contextvars`` are copied by
``asyncio`` tasks, ``anyio.to_thread``, ``asyncio.to_thread`` and ``contextvars.copy_context``).
The transport reads it when a request is sent, so a stream keeps its sources after the block
ends, and a request sent later, outside any block, has none.

**A stopped call stays stopped.** Each block keeps a :class:`Latch`: once a request sent in it is
stopped by one of its sources (an event, a signal, a deadline, ``cancel(id)``), every request
sent afterwards in the block — an SDK's retry, a framework's retry layer or fallback — is
stopped before a byte is sent, with the same reason. ``cancel(id)`` sets the latch of a block
bound to that id even when no request is in flight (a retry's sleep). And whatever a framework
wrapped the stop in, the exception that leaves the block is the contract's
``GenerationCancelledError`` of the block's first stopped request (the framework's exception as
its ``__cause__``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from ..errors import GenerationCancelledError, StopReason
from ..stopping.abort import AbortSignal
from ..stopping.event_hook import on_set
from ..stopping.loop import loop_caller
from ..stopping.token import reason_from_signal

__all__ = ["Binding", "Latch", "StopOn", "current_binding", "latches_named", "stop_on"]


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


def stop_on(*sources: threading.Event | AbortSignal | float | str) -> StopOn:
    """Requests sent through this library's SDK transports inside the block stop when any source
    says so: a ``threading.Event`` set, an :class:`~abstract_client.AbortSignal` aborted, a number
    of seconds from now passed (a deadline: ``reason="timeout"``), or ``cancel(request_id)``
    called with the string given here. Blocks nest: an inner block adds its sources, request ids
    included (``cancel`` of the outer id stops a request sent in the inner block). Once a request
    in the block was stopped, every later request in it is stopped before it is sent.

    ``with stop_on(...)`` stops the block's requests (and an openai or anthropic SDK's retry
    sleep); ``async with stop_on(...)`` also ends the block's work where it stands — a tool an
    agent runs, a framework's own sleep — by a cancel scope, and raises the typed error."""
    events: list[threading.Event] = []
    signals: list[AbortSignal] = []
    own_ids: list[str] = []
    for source in sources:
        if isinstance(source, threading.Event):
            events.append(source)
        elif isinstance(source, AbortSignal):
            signals.append(source)
        elif isinstance(source, str):
            if not source:
                raise ValueError("stop_on: a request id must not be empty")
            own_ids.append(source)
        elif isinstance(source, int | float) and not isinstance(source, bool):
            if not math.isfinite(source) or source < 0:
                raise ValueError(f"stop_on: a deadline is a number of seconds >= 0, not {source!r}")
            signals.append(AbortSignal.timeout(float(source)))
        else:
            raise TypeError(
                "stop_on takes a threading.Event, an abstract_client.AbortSignal, a deadline in seconds "
                f"or a request id (str), not {type(source).__name__}"
            )
    return StopOn(tuple(events), tuple(signals), tuple(own_ids))


class StopOn:
    """One ``stop_on`` block (what :func:`stop_on` returns): ``with`` or ``async with``, once."""

    def __init__(
        self, events: tuple[threading.Event, ...], signals: tuple[AbortSignal, ...], own_ids: tuple[str, ...]
    ) -> None:
        self._own = Binding(events, signals, own_ids)
        self.latch = Latch(own_ids)
        self._reset: contextvars.Token[Binding] | None = None
        self._scope: anyio.CancelScope | None = None
        self._unwatch: Callable[[], None] = lambda: None  # an async block's scope's hooks
        self._unwatch_own: Callable[[], None] = lambda: None
        self._stopped: tuple[StopReason, object, float] | None = None  # what ended an async block

    # -- with ------------------------------------------------------------------------------------

    def __enter__(self) -> None:
        if self._reset is not None:
            raise RuntimeError("a stop_on block is entered once")
        outer = _current.get()
        own = self._own
        request_ids = outer.request_ids + tuple(i for i in own.request_ids if i not in outer.request_ids)
        self.latch.hold()
        latches = (*outer.latches, self.latch)
        binding = Binding(outer.events + own.events, outer.signals + own.signals, request_ids, latches)
        self._reset = _current.set(binding)
        # the block remembers its own sources' stop, whether a request is in flight or not
        self._unwatch_own = own.watch(lambda reason, why, at: self.latch.set(reason, why))
        from . import sleeps  # (it reads the binding: imported once the block is used)

        sleeps.install()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        assert self._reset is not None
        self._unwatch_own()
        _current.reset(self._reset)
        self.latch.drop()
        # a framework that wrapped the stop (an SDK's connection error after its retries, a retry
        # layer's own exception): the caller gets the contract's error here, where it wrote the
        # stop, the framework's exception kept as its cause
        if isinstance(exc, Exception) and not isinstance(exc, GenerationCancelledError):
            error = self.latch.the_error()
            if error is not None:
                raise error from exc

    # -- async with: the same, in a cancel scope the sources cancel -----------------------------

    async def __aenter__(self) -> None:
        self.__enter__()
        call_soon = loop_caller()
        scope = self._scope = anyio.CancelScope()
        scope.__enter__()

        def fire(reason: StopReason, signal_reason: object, when: float | None) -> None:
            if self._stopped is None:
                self._stopped = (reason, signal_reason, when or time.perf_counter())
            call_soon(scope.cancel)

        self._unwatch = _current.get().watch(fire)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self._unwatch()
        assert self._scope is not None
        try:
            swallowed = self._scope.__exit__(kind, exc, tb)
        finally:
            self.__exit__(kind, exc, tb)  # (a wrapped stop leaves as the typed error here)
        if swallowed and self._stopped is not None:  # a source ended the block where it stood
            raise self._error()

    def _error(self) -> GenerationCancelledError:
        """The block's first stopped request's error; else (the stop came between requests: a
        tool running, a framework's sleep) one made now, with the source's reason."""
        error = self.latch.the_error()
        if error is not None:
            return error
        assert self._stopped is not None
        reason, signal_reason, when = self._stopped
        binding = _current.get()
        return GenerationCancelledError(
            "generation cancelled",
            reason=reason,
            signal_reason=signal_reason,
            cancel_to_stop_ms=(time.perf_counter() - when) * 1000,
            partial_text="",
            request_id=(self._own.request_ids or binding.request_ids or (None,))[-1],
        )
