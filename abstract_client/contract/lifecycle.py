"""A call's lifecycle: its phases, and one table that drives them (as h11 drives a connection:
``(phase, event) -> next phase``, and the action the move takes).

==========  ===========================================================  ========================
phase       what the call holds                                          entered by the event
==========  ===========================================================  ========================
BUILT       nothing: no stop source listened to, no socket, not listed   ``Call(...)``
ADMITTED    listed in flight, its stop sources bound, its socket guard   ``ADMIT`` (admission.py)
PREPARED    the request the lane is sent is fixed and checked (a forced  ``PREPARE`` (answer.py)
            tool call on a lane without tool calling: rewritten)
ANSWERED    a whole answer, judged so by rule 7; still held              ``ANSWER`` (translate.py)
COMPLETED   nothing again, after a whole answer                          ``RELEASE`` of ANSWERED
RELEASED    nothing again, without one (stopped, failed, abandoned)      ``RELEASE`` of the others
==========  ===========================================================  ========================

A retry (``RETRY``, run.py) is a move that stays in its phase (ADMITTED or PREPARED): observers
are told ``"retry"``, with the error, the attempt and the delay. So is a hand-over
(``HAND_OVER``, admission.py): a sync caller raises its stop itself, at once, from its own
thread, while the loop still closes up behind it; from that raise on the call is off the
in-flight list (its request id free again) though it holds the rest until ``RELEASE``. Moves
from two threads are one at a time (the call's ``moving`` lock). The outcome is the final phase:
COMPLETED or RELEASED. :data:`TRANSITIONS` is every move;
:data:`ACTIONS` what a move does, registered by the module that owns it (admission takes its
hold on ``ADMIT`` and lets go on ``RELEASE``), and run *before* the phase is entered, so a phase
means what its row says when observers hear of it. An event the table has no row for is a bug
in the contract (:class:`LifecycleError`), never silently taken. Observers (telemetry) are told
of each move after it happened: they read the moves, they write nothing on
the call (their own data goes in ``call.extensions``). An observer that fails is logged and
ignored — it never changes what the caller gets.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ACTIONS",
    "FINAL",
    "TRANSITIONS",
    "Event",
    "LifecycleError",
    "Observer",
    "Phase",
    "acts_on",
    "notify",
    "observe",
]

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    BUILT = "built"
    ADMITTED = "admitted"
    PREPARED = "prepared"
    ANSWERED = "answered"
    COMPLETED = "completed"
    RELEASED = "released"


class Event(enum.Enum):
    ADMIT = "admit"
    PREPARE = "prepare"
    ANSWER = "answer"
    RELEASE = "release"
    RETRY = "retry"  # another attempt: the call stays where it is
    HAND_OVER = "hand_over"  # its outcome handed to a sync caller: off the in-flight list, still held


TRANSITIONS: Mapping[tuple[Phase, Event], Phase] = {
    (Phase.BUILT, Event.ADMIT): Phase.ADMITTED,
    (Phase.BUILT, Event.RELEASE): Phase.RELEASED,
    (Phase.ADMITTED, Event.PREPARE): Phase.PREPARED,
    (Phase.ADMITTED, Event.ANSWER): Phase.ANSWERED,  # an embedding: nothing to prepare
    (Phase.ADMITTED, Event.RELEASE): Phase.RELEASED,
    (Phase.ADMITTED, Event.RETRY): Phase.ADMITTED,  # an embedding's batch, or a refusal before any byte
    (Phase.PREPARED, Event.ANSWER): Phase.ANSWERED,
    (Phase.PREPARED, Event.RELEASE): Phase.RELEASED,
    (Phase.PREPARED, Event.RETRY): Phase.PREPARED,
    (Phase.ANSWERED, Event.RELEASE): Phase.COMPLETED,
    **{(phase, Event.HAND_OVER): phase for phase in (Phase.ADMITTED, Phase.PREPARED, Phase.ANSWERED)},
}
FINAL = frozenset({Phase.COMPLETED, Phase.RELEASED})  # the outcomes: a call there holds nothing, for good

# action(call, info): what a move does (``info``: what the event knows, e.g. ``clean`` on release)
Action = Callable[[Any, Mapping[str, Any]], None]
ACTIONS: dict[tuple[Phase, Event], Action] = {}


def acts_on(*moves: tuple[Phase, Event]) -> Callable[[Action], Action]:
    """Register the decorated function as what each of ``moves`` does."""

    def register(action: Action) -> Action:
        for move in moves:
            assert move in TRANSITIONS, move
            ACTIONS[move] = action
        return action

    return register


class LifecycleError(RuntimeError):
    """A move the lifecycle table does not allow (a bug in the contract, not in the caller's use)."""


# observer(call, what, info): ``what`` is the phase moved to (its value: "admitted", ...,
# "completed", "released") or "retry"; ``info`` what the move knows (``from``: the phase left;
# ``clean`` on release; ``error``, ``attempt``, ``delay`` on a retry)
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
