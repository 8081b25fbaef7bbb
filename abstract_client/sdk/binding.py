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
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import GenerationCancelledError
from ..stopping.abort import AbortSignal

__all__ = ["Binding", "Latch", "current_binding", "latches_named", "stop_on"]


class Latch:
    """A ``stop_on`` block's memory of its stop: ``(reason, signal_reason)`` once set, and the
    error its first stopped request raised (the one the block's edge raises); first wins."""

    __slots__ = ("_lock", "error", "stop")

    def __init__(self) -> None:
        self.stop: tuple[str, object] | None = None
        self.error: GenerationCancelledError | None = None
        self._lock = threading.Lock()

    def set(self, reason: str, signal_reason: object = None) -> None:
        with self._lock:
            if self.stop is None:
                self.stop = (reason, signal_reason)

    def raised(self, error: GenerationCancelledError) -> None:
        with self._lock:
            if self.error is None:
                self.error = error


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
    def request_id(self) -> str | None:
        """The innermost block's id: the request's name."""
        return self.request_ids[-1] if self.request_ids else None


_by_id: dict[str, list[Latch]] = {}  # the latches of the blocks open under each request id
_by_id_lock = threading.Lock()


def latches_named(request_id: str) -> list[Latch]:
    """The latches of the ``stop_on`` blocks open under ``request_id`` (``cancel`` sets them)."""
    with _by_id_lock:
        return list(_by_id.get(request_id, ()))


_NONE = Binding()
_current: contextvars.ContextVar[Binding] = contextvars.ContextVar("abstract_client_sdk_stop", default=_NONE)


def current_binding() -> Binding:
    return _current.get()


@contextlib.contextmanager
def stop_on(*sources: threading.Event | AbortSignal | float | str) -> Iterator[None]:
    """Requests sent through this library's SDK transports inside the block stop when any source
    says so: a ``threading.Event`` set, an :class:`~abstract_client.AbortSignal` aborted, a number
    of seconds from now passed (a deadline: ``reason="timeout"``), or ``cancel(request_id)``
    called with the string given here. Blocks nest: an inner block adds its sources, request ids
    included (``cancel`` of the outer id stops a request sent in the inner block). Once a request
    in the block was stopped, every later request in it is stopped before it is sent."""
    outer = _current.get()
    events, signals, request_ids = list(outer.events), list(outer.signals), list(outer.request_ids)
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
    latch = Latch()
    request_ids += [i for i in own_ids if i not in request_ids]
    with _by_id_lock:
        for request_id in own_ids:
            _by_id.setdefault(request_id, []).append(latch)
    reset = _current.set(Binding(tuple(events), tuple(signals), tuple(request_ids), (*outer.latches, latch)))
    try:
        yield
    except Exception as exc:
        # a framework that wrapped the stop (an SDK's connection error after its retries, a
        # retry layer's own exception): the caller gets the contract's error here, where it
        # wrote the stop, the framework's exception kept as its cause
        if latch.error is None or isinstance(exc, GenerationCancelledError):
            raise
        raise latch.error from exc
    finally:
        _current.reset(reset)
        with _by_id_lock:
            for request_id in own_ids:
                latches = _by_id.get(request_id, [])
                if latch in latches:
                    latches.remove(latch)
                if not latches:
                    _by_id.pop(request_id, None)
