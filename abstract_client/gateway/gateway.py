"""What the gateway holds while it serves: its backends and the requests in flight
(``flight.py``), the records of the latest stops (what ``GET /v1/requests/{id}`` and the chat
page show) and the background responses it runs (``background.py``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

from ..errors import GenerationCancelledError
from ..provider import engine_record
from .background import BackgroundStore
from .config import GatewayConfig
from .flight import Backend, Flight
from .hosts.store import Hosts, StoreUnavailable
from .hosts.workers import Peers, answer_op
from .metrics import Metrics
from .runner import Runner
from .spawn import spawn_on
from .team.accounting import Accounting
from .upstreams import Upstreams

__all__ = ["Gateway"]

log = logging.getLogger("abstract_client.gateway")


class Gateway:
    def __init__(self, config: GatewayConfig, *, peers: Peers | None = None) -> None:
        self.config = config
        self.backends = {b.name: Backend(b, private_image_urls=config.private_image_urls) for b in config.backends}
        self.metrics = Metrics()
        # limits per key (kept where every worker serving the key sees them), usage records,
        # per-key counters
        self.accounting = Accounting(config, shared_dir=peers.run_dir if peers is not None else None)
        self.metrics.more.append(self.accounting.families)
        self.upstreams = Upstreams(self.backends.values(), interval=config.health_interval)
        self.flights: dict[str, Flight] = {}
        # the latest stops, by request id (GET /v1/requests/{id}: what the chat page shows)
        self.stop_records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.loop: asyncio.AbstractEventLoop | None = None  # set at start-up (uvicorn's loop)
        self.peers: Peers | None = peers  # the sibling workers, when there are several
        # the other hosts, through the store (None: this host alone, or its workers' sockets)
        self.hosts: Hosts | None = None
        self._spawned: set[asyncio.Task[None]] = set()
        # the background responses this worker runs
        self.runner = Runner(self)  # every request, foreground or background, runs there
        self.background: BackgroundStore
        if config.store is None:
            self.background = BackgroundStore(config)
        else:
            from .hosts.shared_background import SharedBackgroundStore  # the `redis` extra

            self.hosts = Hosts(config)
            self.hosts.on_op = lambda words: answer_op(self, words)
            self.background = SharedBackgroundStore(config, self.hosts)
        self.background.runner = self.runner

    def backend_for(self, model: Any, *, exact: bool = False) -> Backend | None:
        """The backend serving ``model``. A generation on a one-backend gateway reaches it by
        any name (clients that send a fixed name, Claude Code's ``claude-…``, just work), unless
        ``strict_model_names``; ``exact`` (model management: an unload stops other clients'
        calls) needs the backend's own name."""
        if isinstance(model, str) and model in self.backends:
            return self.backends[model]
        if len(self.backends) == 1 and not exact and not self.config.strict_model_names:
            return next(iter(self.backends.values()))
        return None

    def health(self, *, detail: bool) -> dict[str, Any]:
        """What ``/health`` and ``/ready`` say: ``status`` is ``starting`` (a first probe has not
        answered yet), ``unavailable`` (no backend can take a request, or the store shared by
        the hosts does not answer), ``degraded`` (a backend is down, another serves) or ``ok``.
        ``detail`` (a caller whose key was accepted): the addresses and the errors too."""
        upstreams, hosts = self.upstreams, self.hosts
        store_ok = None if hosts is None else hosts.store_ok
        if not upstreams.settled() or (hosts is not None and store_ok is None):
            status = "starting"
        elif not upstreams.serving() or store_ok is False:
            status = "unavailable"
        elif any(v.state == "down" for v in upstreams.views.values()):
            status = "degraded"
        else:
            status = "ok"
        body: dict[str, Any] = {
            "status": status,
            "in_flight": len(self.flights),
            "backends": {name: v.describe(detail=detail) for name, v in upstreams.views.items()},
        }
        if hosts is not None:
            store: dict[str, Any] = {"state": {None: "unknown", True: "up", False: "down"}[store_ok]}
            if detail:
                store["url"] = hosts.where
            body["store"] = store
        return body

    def stop_all(self, reason: str = "shutdown") -> None:
        """Stop every request in flight (on the gateway's loop): each stream ends with an error
        frame, each upstream is severed, each queued request leaves its queue."""
        for flight in list(self.flights.values()):
            flight.stop(reason)

    @property
    def siblings(self) -> Hosts | Peers | None:
        """Whom to ask about a request or a model this worker does not hold: the other hosts
        through the store (its workers are hosts too), else this host's other workers."""
        return self.hosts if self.hosts is not None else self.peers

    def _spawn(self, op: Coroutine[Any, Any, Any]) -> None:
        """Run ``op`` on the gateway's loop, from any thread, never waited on: a store that is
        down or slow costs a request nothing. Its failure is a DEBUG line: the lease loop says
        once that the store went, and once that it is back (``Hosts._reachable``)."""

        def failed(exc: Exception) -> None:
            log.debug("store: not written (%s)", exc)

        spawn_on(self.loop, op, self._spawned, failed, (StoreUnavailable,))

    def stop_all_soon(self) -> None:
        """:meth:`stop_all` from a signal handler (it only schedules the work on the loop)."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stop_all)

    async def aclose(self) -> None:
        self.stop_all()
        for backend in self.backends.values():
            await backend.llm.aclose()
        await self.accounting.aclose()
        self.accounting.close()

    def stop_recorded(self, flight: Flight, err: GenerationCancelledError) -> None:
        """Record a stop whose caller was just released. An in-process engine drains behind its
        caller: the record is completed with its own figures (when it saw the flag, what it
        sampled after) and published once it has settled — on the loop, a moment later (the
        chat page polls ``GET /v1/requests/{id}`` for it)."""
        released = time.perf_counter()
        flight.stopped_with(err)  # what it cost up to the stop (accounting.py)
        record: dict[str, Any] = {
            "request_id": flight.request_id,
            "owner": flight.owner,
            "reason": flight.reason or err.reason,  # the LLM's own stop (an eject) has no flight reason
            "stop_to_engine_stopped_ms": None,
            "generated_tokens": err.generated_tokens,
            "tokens_after_stop": None,
        }
        self.metrics.prompt(flight.backend.name, err.usage)
        engine = engine_record(flight.backend.llm.provider, flight.call_id)  # in-process engines' own
        if engine is None:  # over HTTP the engine stopped when its connection was severed: now
            self._engine_stopped(flight, record, released, None)
            return
        flight.settle_later()  # its usage is the engine's, once it settled (accounting.py)
        loop = self.loop
        if loop is None:
            engine.when_settled(lambda: self._engine_stopped(flight, record, released, engine))
            return

        def on_loop() -> None:
            self._engine_stopped(flight, record, released, engine)

        def settled() -> None:  # on the engine thread
            try:
                loop.call_soon_threadsafe(on_loop)
            except RuntimeError:  # the loop is gone (shutdown): nobody reads the record
                pass

        engine.when_settled(settled)

    def _engine_stopped(self, flight: Flight, record: dict[str, Any], released: float, engine: Any) -> None:
        stop_seen = flight.stop_seen_at or released
        stopped = released if engine is None or engine.stopped_at is None else engine.stopped_at
        seconds = max(0.0, stopped - stop_seen)
        record["stop_to_engine_stopped_ms"] = seconds * 1000
        if engine is not None and engine.tokens_at_stop is not None:
            record["tokens_after_stop"] = engine.tokens - engine.tokens_at_stop
        if engine is not None:
            flight.settled(engine.usage_at_stop())
            if flight.unaccounted is not None:  # its request ended first: accounted now, exactly
                self.accounting.account(flight, *flight.unaccounted)
        self.stop_records[flight.call_id] = record  # published complete (GET /v1/requests/{id})
        if self.hosts is not None:  # ... and to every host (best effort: a foreground call never waits on it)
            self._spawn(self.hosts.put_stop_record(flight.call_id, record))
        while len(self.stop_records) > 1000:
            self.stop_records.popitem(last=False)
        reason = record["reason"]
        self.metrics.stopped(flight.backend.name, reason, seconds)
        if flight.span is not None:
            flight.span.add_event("engine_stopped", {"abstract_client.stop.chain_ms": seconds * 1000})
        log.info(
            "stopped %s backend=%s reason=%s stop->engine stopped %.2f ms",
            flight.request_id,
            flight.backend.name,
            reason,
            seconds * 1000,
        )
