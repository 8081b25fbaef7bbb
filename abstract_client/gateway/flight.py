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
from .team.fair import FairSlots
from .team.keys import ANONYMOUS
from .team.limits import Admission

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
    client's; ``call_id`` the id it is held and called by (``request_ids.scoped``).

    Written here only: its fields are set when it is made and by its own methods, each named for
    what happened (``tests/test_gateway_runner.py`` refuses a write from any other module), as
    the library's ``Call`` is moved only by its lifecycle table."""

    def __init__(
        self,
        request_id: str,
        backend: Backend,
        *,
        write_timeout: float = 30.0,
        loop: asyncio.AbstractEventLoop | None = None,
        owner: str | None = None,
        call_id: str | None = None,
        key: str = ANONYMOUS,
        admission: Admission | None = None,
        unsent: Any = None,
    ) -> None:
        self.request_id = request_id
        self.backend = backend
        self.controller = AbortController()
        self.reason: str | None = None
        self.stop_seen_at: float | None = None
        self.client_gone = False
        self.owner = owner  # the identity of the key it came with (cancel(id) checks it)
        self.call_id = call_id or request_id  # scoped(request_id, owner)
        self.write_timeout = write_timeout  # a client that reads nothing for this long is stalled
        self.unsent = unsent  # its socket's unsent bytes, judged at each write (stall.UnsentWatch)
        self.queue_scope: anyio.CancelScope | None = None
        self.span: Any = None  # the request's SERVER span, when tracing is on
        self.finished = False  # the response is done: a late disconnect is not its stop
        self.error: BaseException | None = None  # what failed it (upstreams.py reads a connect failure)
        self._loop = loop  # where a stop from another thread sends its bookkeeping
        # what it cost (accounting.py): whose, when, and what the engine counted
        self.key = key  # the name of the key it came with
        self.arrived_at = time.time()
        self.started_at = time.perf_counter()
        self.admitted_at: float | None = None  # a slot taken (perf_counter)
        self.first_token_at: float | None = None  # the first token sent to its client (streams)
        self.usage: Usage | None = None  # a complete answer's
        self.stop_error: GenerationCancelledError | None = None  # a stop's (its usage at the stop)
        self.admission = admission  # its key's limits, settled when it ends
        # an in-process engine drains behind a stopped call: its count is final once it settled
        self.settling = False
        self.engine_usage: Usage | None = None  # the engine's own count, once settled
        self.unaccounted: tuple[str, int] | None = None  # (route, status) waiting for the engine
        self.accounted = False
        self._claim_lock = threading.Lock()

    # -- what happened to it (the runner's steps, and the modules that see them) -----------------

    def traced(self, span: Any) -> None:
        """Its SERVER span (tracing on)."""
        self.span = span

    def queued(self, scope: anyio.CancelScope | None) -> None:
        """Waiting for a slot in ``scope`` (a stop cancels it), or no longer (None)."""
        self.queue_scope = scope

    def admitted(self) -> None:
        """A slot taken."""
        self.admitted_at = time.perf_counter()

    def first_token(self) -> None:
        """The first token went to its client (a stream)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    def failed(self, err: BaseException) -> None:
        """It failed for a reason other than a stop (``upstreams.py`` reads a connect failure)."""
        self.error = err

    def embedded(self, usage: Usage | None) -> None:
        """An embedding's usage: billed to its key (not a generation's prompt in ``/metrics``)."""
        self.usage = usage

    def end(self) -> None:
        """The response is done: a late disconnect is not its stop."""
        self.finished = True

    def stalled(self) -> None:
        """Its client stopped reading (the write timeout passed): nothing more can be written to
        it, and that is its stop."""
        self.client_gone = True
        self.stop("client_stalled")

    def stopped_with(self, err: GenerationCancelledError) -> None:
        """The stop its caller was released with: what it cost up to the stop (accounting.py)."""
        self.stop_error = err

    def settle_later(self) -> None:
        """An in-process engine drains behind its stop: its usage is the engine's, once settled."""
        self.settling = True

    def settled(self, usage: Usage | None) -> None:
        """The engine settled: its own count."""
        self.engine_usage, self.settling = usage, False

    def accounted_later(self, route: str, status: int) -> None:
        """It ended while its engine was still settling: accounted when it settled."""
        self.unaccounted = (route, status)

    def accounted_now(self) -> None:
        """Its usage is on its key's record (once: ``accounting.account``)."""
        self.accounted = True

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
        """From the disconnect thread (``departures.py``): the upstream is severed here, on
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
