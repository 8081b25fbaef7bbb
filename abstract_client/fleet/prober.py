"""The fleet's background health check: members that are down are probed off the callers' path.

One prober per fleet, on a loop thread of its own (started when a member goes down, ended when
none is left down or the fleet closes). Every ``interval`` seconds (±25 % jitter, so a fleet of
clients does not probe in step) it starts a probe of each member that is down and has no probe
in flight: one readiness request (``wait_ready`` under :data:`~abstract_client.http.wire.single_probe`),
bounded by ``timeout``. A success brings the member back at once; a failure is one step of the
member's backoff. No caller ever waits on it.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence

import anyio

from .._sync import Portal
from ..errors import NotSupportedError
from ..http.wire import single_probe
from ..provider import InProcessProvider
from .member import Member

__all__ = ["Prober", "probe_once"]

log = logging.getLogger(__name__)


async def probe_once(member: Member, timeout: float) -> bool:
    """One readiness request to ``member``; True (and the member healthy) if it answered ready.
    A member with no readiness route is marked unprobeable: its next call is the probe."""
    if isinstance(member.llm.provider, InProcessProvider):  # its "readiness" is loading the model
        member.health.probeable = False
        return False
    token = single_probe.set(True)
    try:
        with anyio.fail_after(timeout):
            await member.llm.provider.wait_ready(timeout)
    except NotSupportedError:
        member.health.probeable = False
        return False
    except Exception as exc:
        log.debug("fleet: %s not ready (%s: %s)", member.name, type(exc).__name__, exc)
        member.health.probe_failed()
        return False
    finally:
        single_probe.reset(token)
    member.health.succeeded()
    log.info("fleet: %s is back", member.name)
    return True


class Prober:
    """Probes the down members of one fleet in the background (see the module docstring)."""

    def __init__(self, members: Sequence[Member], *, interval: float, timeout: float) -> None:
        self._members = list(members)
        self.interval = interval
        self.timeout = timeout
        self._portal = Portal()
        self._lock = threading.Lock()
        self._running = False
        self._closed = False
        self._probing: set[str] = set()
        self.probes = 0  # probes made (all members): the evidence that one runs at a time per member

    def down(self) -> list[Member]:
        return [m for m in self._members if m.health.probe_due and m.health.probeable]

    def wake(self) -> None:
        """A member went down: make sure the prober runs (idempotent, from any thread)."""
        with self._lock:
            if self._running or self._closed:
                return
            self._running = True
        self._portal.submit(self._run)

    async def _run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                while not self._closed:
                    down = self.down()
                    if not down:
                        with self._lock:
                            if not self.down():  # checked again under the lock: wake() sees _running
                                self._running = False
                                break
                    for member in down:
                        if member.name not in self._probing:
                            self._probing.add(member.name)
                            tg.start_soon(self._probe, member)
                    await anyio.sleep(self.interval * random.uniform(0.75, 1.25))
                tg.cancel_scope.cancel()
        finally:
            with self._lock:
                self._running = False

    async def _probe(self, member: Member) -> None:
        try:
            self.probes += 1
            await probe_once(member, self.timeout)
        finally:
            self._probing.discard(member.name)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._portal.shutdown(timeout=0)
