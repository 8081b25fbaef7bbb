"""``stop_on(...)``: the stop sources a request sent inside the block listens to.

The SDKs' calls cannot take a stop argument, so the sources ride in a context variable: it
follows the call into whatever thread or task the SDK runs it on (``contextvars`` are copied by
``asyncio`` tasks, ``anyio.to_thread``, ``asyncio.to_thread`` and ``contextvars.copy_context``).
The transport reads it when a request is sent, so a stream keeps its sources after the block
ends, and a request sent later, outside any block, has none.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from ..stopping.abort import AbortSignal

__all__ = ["Binding", "current_binding", "stop_on"]


@dataclass(frozen=True)
class Binding:
    """What ``stop_on`` blocks, innermost last, have bound: every source stops the request."""

    events: tuple[threading.Event, ...] = ()
    signals: tuple[AbortSignal, ...] = ()
    request_id: str | None = None


_NONE = Binding()
_current: contextvars.ContextVar[Binding] = contextvars.ContextVar("abstract_client_sdk_stop", default=_NONE)


def current_binding() -> Binding:
    return _current.get()


@contextlib.contextmanager
def stop_on(*sources: threading.Event | AbortSignal | float | str) -> Iterator[None]:
    """Requests sent through this library's SDK transports inside the block stop when any source
    says so: a ``threading.Event`` set, an :class:`~abstract_client.AbortSignal` aborted, a number
    of seconds from now passed (a deadline: ``reason="timeout"``), or ``cancel(request_id)``
    called with the string given here. Blocks nest: an inner block adds its sources."""
    outer = _current.get()
    events, signals, request_id = list(outer.events), list(outer.signals), outer.request_id
    for source in sources:
        if isinstance(source, threading.Event):
            events.append(source)
        elif isinstance(source, AbortSignal):
            signals.append(source)
        elif isinstance(source, str):
            if not source:
                raise ValueError("stop_on: a request id must not be empty")
            request_id = source
        elif isinstance(source, int | float) and not isinstance(source, bool):
            if not math.isfinite(source) or source < 0:
                raise ValueError(f"stop_on: a deadline is a number of seconds >= 0, not {source!r}")
            signals.append(AbortSignal.timeout(float(source)))
        else:
            raise TypeError(
                "stop_on takes a threading.Event, an abstract_client.AbortSignal, a deadline in seconds "
                f"or a request id (str), not {type(source).__name__}"
            )
    reset = _current.set(Binding(tuple(events), tuple(signals), request_id))
    try:
        yield
    finally:
        _current.reset(reset)
