"""A call's lifecycle: its phases and the moves between them, in one table (as h11 keeps its
connection states).

=========  ==========================================================  ===========================
phase      what the call holds                                         moved there by
=========  ==========================================================  ===========================
BUILT      nothing: no stop source listened to, no socket, not listed  ``Call(...)``
ADMITTED   listed in flight, its stop sources bound, its socket guard  ``admission.admit_now``
PREPARED   the request the lane is sent is fixed (a forced tool call    ``answer.prepare``
           on a lane without tool calling: rewritten)
RELEASED   nothing again (the guard severed or detached, unlisted)     ``admission.release``
=========  ==========================================================  ===========================

A call built and dropped without being iterated goes BUILT → RELEASED. Every move is checked
against :data:`MOVES`; a move the table does not allow is a bug in the contract
(:class:`LifecycleError`), never silently taken. Observers (telemetry) are told of each move,
and of each retry, after it happened: they watch the rules, they are not called from inside them.
An observer that fails is logged and ignored — it never changes what the caller gets.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MOVES", "LifecycleError", "Observer", "Phase", "notify", "observe"]

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    BUILT = "built"
    ADMITTED = "admitted"
    PREPARED = "prepared"
    RELEASED = "released"


MOVES: Mapping[Phase, frozenset[Phase]] = {
    Phase.BUILT: frozenset({Phase.ADMITTED, Phase.RELEASED}),
    Phase.ADMITTED: frozenset({Phase.PREPARED, Phase.RELEASED}),
    Phase.PREPARED: frozenset({Phase.RELEASED}),
    Phase.RELEASED: frozenset(),
}


class LifecycleError(RuntimeError):
    """A move the lifecycle table does not allow (a bug in the contract, not in the caller's use)."""


# observer(call, what, info): ``what`` is the phase moved to ("admitted", "prepared",
# "released") or "retry"; ``info`` what the move knows (``from``: the phase left; ``clean`` on
# release; ``error``, ``attempt``, ``delay`` on a retry)
Observer = Callable[[Any, str, Mapping[str, Any]], None]
_observers: list[Observer] = []


def observe(observer: Observer) -> None:
    """Be told of every call's moves and retries (telemetry registers itself here)."""
    if observer not in _observers:
        _observers.append(observer)


def notify(call: Any, what: str, **info: Any) -> None:
    for observer in _observers:
        try:
            observer(call, what, info)
        except Exception:  # an observer never changes the call's outcome
            log.exception("a lifecycle observer failed on %s %s", call.request_id, what)
