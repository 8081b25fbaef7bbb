"""Rules 1 and 2: admission and release — the lifecycle's ``ADMIT`` and ``RELEASE`` moves and
their actions (``lifecycle.py``).

``admit`` is the only place a call starts holding anything: it registers the call in flight (so
``cancel(id)``, ``cancel_all()`` and an eject reach it), listens to the caller's stop sources and
makes the socket guard, then enters ``ADMITTED``. A stop that is already set is raised here,
before a byte is sent. ``release`` undoes all of it, once, synchronously (a dropped stream's
``__del__`` calls it), on every exit path.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import anyio

from ..http.guard import SocketGuard
from ..provider import HttpProvider
from .call import Call
from .lifecycle import FINAL, TRANSITIONS, Event, Phase, acts_on
from .translate import cancelled

__all__ = ["admit", "admit_now", "hand_over", "release"]


async def admit(call: Call) -> None:
    """Rule 1-2, on the loop: wait out an eject in progress, prepare the lane's clients, then
    :func:`admit_now`."""
    # A call made during an eject waits for it to finish (ejects are short and rare; polled so
    # that no per-loop state is needed), unless its own stop comes first.
    while call.gate is not None and call.gate.is_set() and not call.token.is_set:
        await anyio.sleep(0.005)
    if isinstance(call.provider, HttpProvider):
        await call.provider.clients.prepare()
    admit_now(call)


def admit_now(call: Call) -> None:
    """Register the call in flight, listen to its stop sources, make its socket guard; a stop already
    set raises here, before anything is sent."""
    call.handle(Event.ADMIT)  # observers start watching (telemetry: the span), ended by release
    if call.token.is_set:  # rule 1: nothing is sent
        release(call)
        raise cancelled(call)


@acts_on((Phase.BUILT, Event.ADMIT))
def _hold(call: Call, info: Mapping[str, Any]) -> None:
    """What ``ADMITTED`` holds, taken before the call is announced there."""
    token, spec = call.token, call.spec
    call.registry.add(token)  # a duplicate request id raises here, before anything is held
    call.t0 = time.perf_counter()
    token.bind(cancel_event=spec.cancel_event, signal=spec.signal)
    if isinstance(call.provider, HttpProvider):  # its stop severs the call's socket
        call.guard = SocketGuard()
        call.guard.register(token)


def hand_over(call: Call) -> None:
    """The ``HAND_OVER`` move, from any thread: a call is in flight until its outcome is handed to
    its caller; a sync caller raises its stop itself, at once, while the loop still closes up
    behind it (``release``). From that raise on, ``in_flight`` does not list it, ``cancel_all()``
    does not count it, and its request id may be used again. A call released already (or never
    admitted) has nothing to hand over."""
    with call.moving:
        if (call.phase, Event.HAND_OVER) in TRANSITIONS:
            call.handle(Event.HAND_OVER)


@acts_on(*((phase, Event.HAND_OVER) for phase in (Phase.ADMITTED, Phase.PREPARED, Phase.ANSWERED)))
def _off_the_list(call: Call, info: Mapping[str, Any]) -> None:
    _unlist(call)


def _unlist(call: Call) -> None:
    call.registry.remove(call.token)


def release(call: Call, *, clean: bool = False) -> None:
    """Idempotent and synchronous. ``clean``: the call read its answer to the end, so its
    connection is idle and may serve the next call; otherwise it is severed."""
    if call.phase not in FINAL:
        call.handle(Event.RELEASE, clean=clean)


@acts_on(*((phase, Event.RELEASE) for phase in (Phase.ADMITTED, Phase.PREPARED, Phase.ANSWERED)))
def _let_go(call: Call, info: Mapping[str, Any]) -> None:
    """What every held phase lets go of (a BUILT call holds nothing: its release has no action)."""
    guard = call.guard
    if guard is not None:
        if info["clean"] and not call.token.is_set:
            guard.detach()
        else:
            guard.sever()
    _unlist(call)
    call.token.release()
