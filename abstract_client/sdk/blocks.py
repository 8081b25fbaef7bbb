"""``stop_on(...)``: a block whose sources stop the requests sent in it (``binding.py`` keeps
what it binds), ``with`` or ``async with``.

Entering a block binds its sources, adds its latch and gives the SDKs' retry sleeps their
stop-aware twin (``sleeps.py``); ``async with`` also opens a cancel scope the sources cancel.
Leaving it raises the typed error in place of whatever a framework wrapped the stop in.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
import types
from collections.abc import Callable

import anyio

from ..errors import GenerationCancelledError, StopReason
from ..stopping.abort import AbortSignal
from ..stopping.loop import loop_caller
from . import sleeps
from .binding import Binding, Latch, bind, current_binding, unbind

__all__ = ["StopOn", "stop_on"]


def stop_on(*sources: threading.Event | AbortSignal | float | str) -> StopOn:
    """Requests sent through this library's SDK transports inside the block stop when any source
    says so: a ``threading.Event`` set, an :class:`~abstract_client.AbortSignal` aborted, a number
    of seconds from now passed (a deadline: ``reason="timeout"``), or ``cancel(request_id)``
    called with the string given here. Blocks nest: an inner block adds its sources, request ids
    included (``cancel`` of the outer id stops a request sent in the inner block). Once one of
    the block's sources has fired, every later request in it is stopped before it is sent.

    ``with stop_on(...)`` stops the block's requests (and the retry sleeps of openai-python, the
    anthropic SDK and tenacity); ``async with stop_on(...)`` also ends the block's work where it
    stands — a tool an agent runs, a framework's own sleep — by a cancel scope, and raises the
    typed error."""
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
        self._binding = Binding()  # what the block binds, its outer blocks' sources included
        self._reset: contextvars.Token[Binding] | None = None
        self._scope: anyio.CancelScope | None = None
        self._unwatch: Callable[[], None] = lambda: None  # an async block's scope's hooks
        self._unwatch_own: Callable[[], None] = lambda: None
        self._stopped: tuple[StopReason, object, float] | None = None  # what ended an async block

    # -- with ------------------------------------------------------------------------------------

    def __enter__(self) -> None:
        if self._reset is not None:
            raise RuntimeError("a stop_on block is entered once")
        outer = current_binding()
        own = self._own
        request_ids = outer.request_ids + tuple(i for i in own.request_ids if i not in outer.request_ids)
        self.latch.hold()
        latches = (*outer.latches, self.latch)
        self._binding = Binding(outer.events + own.events, outer.signals + own.signals, request_ids, latches)
        self._reset = bind(self._binding)
        # the block remembers its own sources' stop, whether a request is in flight or not
        self._unwatch_own = own.watch(lambda reason, why, at: self.latch.set(reason, why))
        sleeps.install()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        assert self._reset is not None
        self._unwatch_own()
        unbind(self._reset)
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

        self._unwatch = self._binding.watch(fire)

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
        return GenerationCancelledError(
            "generation cancelled",
            reason=reason,
            signal_reason=signal_reason,
            cancel_to_stop_ms=(time.perf_counter() - when) * 1000,
            partial_text="",
            request_id=self._binding.request_id,
        )
