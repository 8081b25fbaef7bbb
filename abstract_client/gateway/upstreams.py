"""Whether the gateway can reach each of its backends: what ``/health`` and ``/ready`` say, and
the log lines an operator reads when a backend comes and goes.

The view comes from the calls and from a probe, never from a request to ``/health``:

* **calls**: a call that could not connect (``ConnectionFailedError``: refused, unreachable)
  marks its backend down at once; a call answered 200 marks it up.
* **probes**: a connection opened to the backend's server as a call opens one (its proxy, its
  tunnel, its TLS) and closed, with nothing sent (:meth:`HttpClients.reach`): the server sees
  no request, its logs and its request counts stay its clients'. One per backend at start-up,
  waited for (at most :data:`START_WAIT` seconds) so the start-up log says where each backend
  stands before the first request; then every ``health_interval`` seconds for a backend that is
  down or not known yet, to see it come back. A backend that is up is not probed: its calls say
  when it goes away. (A fleet's members are reached in turn: one is enough.)

One INFO line when a backend is first reached (or comes back), one WARNING when it is not (or
goes away), never one per probe or per call. In-process backends have nothing to reach: their
state is ``in_process``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any, Literal

from ..errors import ConnectionFailedError
from ..fleet import Fleet
from ..http.clients import HttpClients
from ..provider import http_clients
from .flight import Backend

__all__ = ["Upstreams", "View"]

log = logging.getLogger("abstract_client.gateway")

State = Literal["unknown", "up", "down", "in_process"]
SERVING: frozenset[str] = frozenset({"up", "in_process"})  # what a request can be sent to
START_WAIT = 2.0  # seconds start-up waits for the first probes (a slower one goes on, "starting")


class View:
    """What the gateway knows of one backend: its state, since when, the last failure."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        llm = backend.llm
        providers = [m.llm.provider for m in llm.members] if isinstance(llm, Fleet) else [llm.provider]
        # what a probe connects to: each server over HTTP (none: every engine is in this process)
        self.clients: list[HttpClients] = [c for p in providers if (c := http_clients(p)) is not None]
        self.where = ", ".join(c.base_url for c in self.clients) or "in process"
        self.state: State = "unknown" if self.clients else "in_process"
        self.since = time.time()
        self.error: str | None = None
        self.probing = False

    def up(self) -> None:
        if self.state == "up":
            return
        if self.state == "down":
            after = time.time() - self.since
            log.info("backend %s: reachable again at %s (after %.1f s)", self.backend.name, self.where, after)
        elif self.state == "unknown":
            log.info("backend %s (%s): reachable at %s", self.backend.name, self.backend.cfg.provider, self.where)
        self._become("up", None)

    def down(self, why: str) -> None:
        self.error = why
        if self.state == "down":
            return
        log.warning(
            "backend %s (%s): unreachable at %s (%s); its requests fail until it is back",
            self.backend.name,
            self.backend.cfg.provider,
            self.where,
            why,
        )
        self._become("down", why)

    def _become(self, state: State, error: str | None) -> None:
        self.state, self.since, self.error = state, time.time(), error

    def describe(self, *, detail: bool) -> dict[str, Any]:
        """The view as ``/health`` shows it; ``detail`` (a caller with a key): where, and why."""
        out: dict[str, Any] = {"state": self.state, "since": round(self.since, 3)}
        if detail:
            out["url"] = self.where
            if self.error is not None:
                out["error"] = self.error
        llm = self.backend.llm
        if isinstance(llm, Fleet):
            out["members"] = {m["name"]: m["state"] for m in llm.status()["members"]}
        return out


class Upstreams:
    """The views of every backend: :meth:`start` probes them all, :meth:`run` probes the ones
    that are down, :meth:`finished` reads each call's outcome."""

    def __init__(self, backends: Iterable[Backend], *, interval: float) -> None:
        self.views = {b.name: View(b) for b in backends}
        self.interval = interval
        self.probe_timeout = min(5.0, interval)
        self._tasks: set[asyncio.Task[None]] = set()

    def settled(self) -> bool:
        """Every backend's first probe has answered."""
        return all(v.state != "unknown" for v in self.views.values())

    def serving(self) -> bool:
        """At least one backend can take a request."""
        return any(v.state in SERVING for v in self.views.values())

    def finished(self, backend: str, status: int, error: BaseException | None) -> None:
        """A request on ``backend`` ended (on the loop): a connection that could not be made
        marks it down, an answer (200) up."""
        view = self.views.get(backend)
        if view is None or view.state == "in_process":
            return
        if isinstance(error, ConnectionFailedError):
            view.down(error.message)
        elif status == 200:
            view.up()

    async def start(self) -> None:
        """Probe every backend over HTTP; wait for the answers, at most :data:`START_WAIT`."""
        for view in self.views.values():
            if view.state == "unknown":
                self._probe_soon(view)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=START_WAIT)

    async def run(self) -> None:
        """Every ``interval``, probe each backend that is down (or not known yet)."""
        while True:
            await asyncio.sleep(self.interval)
            for view in self.views.values():
                if view.state in ("down", "unknown"):
                    self._probe_soon(view)

    def _probe_soon(self, view: View) -> None:
        if view.probing:
            return
        view.probing = True
        task = asyncio.get_running_loop().create_task(self._probe(view))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe(self, view: View) -> None:
        try:
            async with asyncio.timeout(self.probe_timeout):
                failures: list[BaseException] = []
                for clients in view.clients:  # a fleet: any member reached is enough
                    try:
                        await clients.reach(self.probe_timeout)
                        break
                    except Exception as exc:
                        failures.append(exc)
                else:
                    raise failures[-1]
        except TimeoutError:
            view.down(f"no connection within {self.probe_timeout:g}s")
        except Exception as exc:
            view.down(getattr(exc, "message", None) or str(exc) or type(exc).__name__)
        else:
            view.up()
        finally:
            view.probing = False

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
