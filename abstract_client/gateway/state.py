"""What the gateway holds while it serves: its backends (each an ``LLM`` and a slot count), the
requests in flight (:class:`Flight`: one generation, its stop and its owner) and the records of
the latest stops (what ``GET /v1/requests/{id}`` and the chat page show)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import anyio

from ..errors import GenerationCancelledError
from ..llm import LLM
from ..registry import create_llm
from ..stopping.abort import AbortController
from .config import BackendConfig, ConfigError, GatewayConfig
from .metrics import Metrics
from .workers import Peers

__all__ = ["Backend", "Flight", "Gateway"]

log = logging.getLogger("abstract_client.gateway")


class Backend:
    """One served model: its LLM and its slots (``max_concurrent`` generations at once)."""

    def __init__(self, cfg: BackendConfig) -> None:
        self.cfg = cfg
        # the upstream model: the configured one, else the name clients use (an MLX model is a path)
        model = cfg.model or (None if cfg.provider == "mlx" else cfg.name)
        try:
            self.llm: LLM = create_llm(cfg.provider, model, base_url=cfg.base_url, max_retries=0, **cfg.options)
        except (ValueError, TypeError) as err:  # an unknown provider, a bad URL or option: one line at start-up
            raise ConfigError(f"backend {cfg.name!r}: {err}") from None
        # a client's image is data or a URL, never a path: it must not make us read our own files
        self.llm.image_limits = dataclasses.replace(self.llm.image_limits, local_files=False)
        self.slots = anyio.Semaphore(cfg.max_concurrent)

    @property
    def name(self) -> str:
        return self.cfg.name


class Flight:
    """One request in flight: what stops it, and when the stop was seen. ``request_id`` is the
    client's; ``call_id`` the id it is held and called by (``request_ids.scoped``)."""

    def __init__(
        self,
        request_id: str,
        backend: Backend,
        *,
        write_timeout: float = 30.0,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.request_id = request_id
        self.backend = backend
        self.controller = AbortController()
        self.reason: str | None = None
        self.stop_seen_at: float | None = None
        self.client_gone = False
        self.owner: str | None = None  # the identity of the key it came with (cancel(id) checks it)
        self.call_id = request_id  # scoped(request_id, owner), once the owner is known
        self.write_timeout = write_timeout  # a client that reads nothing for this long is stalled
        self.queue_scope: anyio.CancelScope | None = None
        self.span: Any = None  # the request's SERVER span, when tracing is on
        self.finished = False  # the response is done: a late disconnect is not its stop
        self._loop = loop  # where a stop from another thread sends its bookkeeping
        self._claim_lock = threading.Lock()

    def _claim(self, reason: str) -> bool:
        """Record the stop's reason (the first wins, from any thread)."""
        with self._claim_lock:
            if reason == "client_disconnect":
                self.client_gone = True
            if self.reason is not None or self.finished:
                return False
            self.reason, self.stop_seen_at = reason, time.perf_counter()
            return True

    def stop(self, reason: str) -> None:
        """On the loop: from the protocol's ``connection_lost``, the ASGI disconnect watcher,
        the cancel endpoint or shutdown."""
        if self._claim(reason):
            self.controller.abort(reason)  # severs the upstream
            self._after_stop(reason)

    def stop_from_thread(self, reason: str) -> None:
        """From the disconnect thread (``disconnects.py``): the upstream is severed here, on
        that thread; the rest follows on the loop."""
        if self._claim(reason):
            self.controller.abort(reason)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._after_stop, reason)

    def _after_stop(self, reason: str) -> None:
        if self.span is not None:  # the chain, on the request's span: stop seen ... engine stopped
            self.span.add_event("stop", {"abstract_client.stop.reason": reason})
        if self.queue_scope is not None:
            self.queue_scope.cancel()


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.backends = {b.name: Backend(b) for b in config.backends}
        self.metrics = Metrics()
        self.flights: dict[str, Flight] = {}
        # the latest stops, by request id (GET /v1/requests/{id}: what the chat page shows)
        self.stop_records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.loop: asyncio.AbstractEventLoop | None = None  # set at start-up (uvicorn's loop)
        self.peers: Peers | None = None  # the sibling workers, when there are several
        self.background: Any = None  # responses.BackgroundStore (set by create_app)

    def backend_for(self, model: Any, *, exact: bool = False) -> Backend | None:
        """The backend serving ``model``. A generation on a one-backend gateway reaches it by
        any name; ``exact`` (model management: an unload stops other clients' calls) needs the
        backend's own name."""
        if isinstance(model, str) and model in self.backends:
            return self.backends[model]
        if len(self.backends) == 1 and not exact:
            return next(iter(self.backends.values()))
        return None

    def stop_all(self, reason: str = "shutdown") -> None:
        """Stop every request in flight (on the gateway's loop): each stream ends with an error
        frame, each upstream is severed, each queued request leaves its queue."""
        for flight in list(self.flights.values()):
            flight.stop(reason)

    def stop_all_soon(self) -> None:
        """:meth:`stop_all` from a signal handler (it only schedules the work on the loop)."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stop_all)

    async def aclose(self) -> None:
        self.stop_all()
        for backend in self.backends.values():
            await backend.llm.aclose()

    def stop_recorded(self, flight: Flight, err: GenerationCancelledError) -> None:
        """Record a stop whose caller was just released. An in-process engine drains behind its
        caller: the record is completed with its own figures (when it saw the flag, what it
        sampled after) and published once it has settled — on the loop, a moment later (the
        chat page polls ``GET /v1/requests/{id}`` for it)."""
        released = time.perf_counter()
        record: dict[str, Any] = {
            "request_id": flight.request_id,
            "owner": flight.owner,
            "reason": flight.reason or err.reason,  # the LLM's own stop (an eject) has no flight reason
            "stop_to_engine_stopped_ms": None,
            "generated_tokens": err.generated_tokens,
            "tokens_after_stop": None,
        }
        self.metrics.prompt(flight.backend.name, err.usage)
        engine = flight.backend.llm.provider.engine_record(flight.call_id)  # in-process engines' own
        if engine is None:  # over HTTP the engine stopped when its connection was severed: now
            self._engine_stopped(flight, record, released, None)
            return
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
        self.stop_records[flight.call_id] = record  # published complete (GET /v1/requests/{id})
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
