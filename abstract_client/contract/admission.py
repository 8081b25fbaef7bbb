"""Rules 1 and 2: admission and release.

``admit`` is the only place a call starts holding anything: it listens to the caller's stop
sources, makes the socket guard, and registers the call in flight (so ``cancel(id)``,
``cancel_all()`` and an eject reach it). A stop that is already set is raised here, before a byte
is sent. ``release`` undoes all of it, once, synchronously (a dropped stream's ``__del__`` calls
it), on every exit path.
"""

from __future__ import annotations

import time

import anyio

from ..http.guard import SocketGuard
from ..provider import HttpProvider
from .call import Call
from .lifecycle import Phase
from .translate import cancelled

__all__ = ["admit", "admit_now", "release", "unlist"]


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
    token, spec = call.token, call.spec
    call.registry.add(token)  # a duplicate request id raises here, before anything is held
    call.t0 = time.perf_counter()
    call.move(Phase.ADMITTED)  # observers start watching (telemetry: the span), ended by release
    token.bind(cancel_event=spec.cancel_event, signal=spec.signal)
    if token.is_set:  # rule 1: nothing is sent
        release(call)
        raise cancelled(call)
    if isinstance(call.provider, HttpProvider):  # its stop severs the call's socket
        call.guard = SocketGuard()
        call.guard.register(token)


def unlist(call: Call) -> None:
    """Take the call off the in-flight list now, from any thread. A call is in flight until its
    outcome is handed to its caller: a sync caller raises its stop itself, at once, while the
    loop still closes up behind it (``release``); from that raise on, ``in_flight`` does not list
    it, ``cancel_all()`` does not count it, and its request id may be used again."""
    call.registry.remove(call.token)


def release(call: Call, *, clean: bool = False) -> None:
    """Idempotent and synchronous. ``clean``: the call read its answer to the end, so its
    connection is idle and may serve the next call; otherwise it is severed."""
    if call.phase is Phase.RELEASED:
        return
    if call.phase is Phase.BUILT:  # never admitted: it holds nothing
        call.move(Phase.RELEASED, clean=clean)
        return
    guard = call.guard
    if guard is not None:
        if clean and not call.token.is_set:
            guard.detach()
        else:
            guard.sever()
    unlist(call)
    call.token.release()
    call.move(Phase.RELEASED, clean=clean)
