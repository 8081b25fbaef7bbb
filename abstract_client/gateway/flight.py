"""A served model (:class:`Backend`: its ``LLM`` and its slots) and one request in flight on it
(:class:`Flight`: one generation, what stops it, when the stop was seen, its owner)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

import anyio

from ..errors import GenerationCancelledError
from ..llm import LLM
from ..registry import create_llm
from ..stopping.abort import AbortController
from ..types import Usage
from .config import BackendConfig, ConfigError
from .fair import FairSlots
from .keys import ANONYMOUS
from .limits import Admission

__all__ = ["Backend", "Flight"]


class Backend:
    """One served model: its LLM and its slots (``max_concurrent`` generations at once, shared
    between keys: ``fair.FairSlots``)."""

    def __init__(self, cfg: BackendConfig, *, private_image_urls: bool = False) -> None:
        self.cfg = cfg
        # the upstream model: the configured one, else the name clients use (an MLX model is a path)
        model = cfg.model or (None if cfg.provider == "mlx" else cfg.name)
        try:
            self.llm: LLM = create_llm(cfg.provider, model, base_url=cfg.base_url, max_retries=0, **cfg.options)
        except (ValueError, TypeError) as err:  # an unknown provider, a bad URL or option: one line at start-up
            raise ConfigError(f"backend {cfg.name!r}: {err}") from None
        # a client's image is data or a URL, never a path: it must not make us read our own files
        # nor make a backend that fetches URLs fetch one inside this network
        self.llm.image_limits = dataclasses.replace(
            self.llm.image_limits, local_files=False, private_urls=private_image_urls
        )
        self.slots = FairSlots(cfg.max_concurrent, reserved=cfg.reserved_slots, fair=cfg.fair_queuing)

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
        self.unsent: Any = None  # its socket's unsent bytes, judged at each write (stall.UnsentWatch)
        self.queue_scope: anyio.CancelScope | None = None
        self.span: Any = None  # the request's SERVER span, when tracing is on
        self.finished = False  # the response is done: a late disconnect is not its stop
        self.error: BaseException | None = None  # what failed it (upstreams.py reads a connect failure)
        self._loop = loop  # where a stop from another thread sends its bookkeeping
        # what it cost (accounting.py): whose, when, and what the engine counted
        self.key = ANONYMOUS  # the name of the key it came with
        self.arrived_at = time.time()
        self.started_at = time.perf_counter()
        self.admitted_at: float | None = None  # a slot taken (perf_counter)
        self.first_token_at: float | None = None  # the first token sent to its client (streams)
        self.usage: Usage | None = None  # a complete answer's
        self.stop_error: GenerationCancelledError | None = None  # a stop's (its usage at the stop)
        self.admission: Admission | None = None  # its key's limits, settled when it ends
        # an in-process engine drains behind a stopped call: its count is final once it settled
        self.settling = False
        self.engine_usage: Usage | None = None  # the engine's own count, once settled
        self.unaccounted: tuple[str, int] | None = None  # (route, status) waiting for the engine
        self.accounted = False
        self._claim_lock = threading.Lock()

    def answered(self, usage: Usage | None, metrics: Any) -> None:
        """A complete answer's usage (the engine's count): for its key's account (accounting.py)
        and the gateway's metrics."""
        self.usage = usage
        metrics.prompt(self.backend.name, usage)

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
