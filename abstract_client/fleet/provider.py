"""The fleet as one provider: the contract runs it like any lane (one request id, one stop token,
one span), and it runs each call's attempts on its members.

* **Failover before the first byte only** (:func:`may_fail_over`): a member that refused the
  connection, timed it out, or answered 429/502/503/504 produced nothing the caller saw, so the
  call moves to another member, at most ``max_attempts`` in all. Never once output started (a
  member dying mid-answer is a typed error with the partial text, never a silent replay), never
  for a stop, never for the caller's deadline (those end the call in the contract's scope).
* **Hedging** (``hedge_after``): if no chunk has come ``hedge_after`` seconds into an attempt, the
  same request starts on another healthy member; the first to produce a chunk wins and every
  other attempt is stopped through its own token (its socket severed, its engine's flag set).
  ``hedge_after="p90"`` hedges at the observed 90th percentile of time to first chunk (once 20
  calls are observed).
* A member that is down is probed in the background (``fleet/prober.py``: its readiness route,
  ``/health`` or ``/v1/models``, never a generation), and serves again the moment a probe
  succeeds. Callers never probe and never wait on a probe: they go to the healthy members, and to
  a down member whose cooldown ended only when none is left.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import Any

import anyio

from ..contract.translate import as_typed
from ..errors import AbstractClientError, ServerUnavailableError
from ..provider import (
    CallContext,
    EmbeddingBatch,
    EngineRecord,
    ModelInfo,
    RoutingProvider,
    UnloadReport,
    engine_record,
    http_clients,
)
from ..types import GenerationRequest, StreamChunk
from .attempt import Attempt
from .health import may_fail_over
from .member import Member
from .prober import Prober
from .routing import RouteKey, Router

__all__ = ["FleetProvider"]

log = logging.getLogger(__name__)

_MIN_OBSERVED = 20  # first-chunk times observed before a quantile hedge delay applies


class FleetProvider(RoutingProvider):
    """The provider of a :class:`~abstract_client.fleet.Fleet`: each call routed to a member, failed
    over before its first byte, hedged if asked."""

    name = "fleet"
    complete_over_stream = True  # every call streams from its member: a stop is always a sever
    plain_route = False

    def __init__(
        self,
        members: Sequence[Member],
        *,
        router: Router,
        max_attempts: int,
        hedge_after: float | str | None,
        probe_timeout: float,
        probe_interval: float = 0.5,
    ) -> None:
        names = [m.name for m in members]
        if not members:
            raise ValueError("a fleet needs at least one member")
        if len(set(names)) != len(names):
            raise ValueError(f"member names must be unique: {names}")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self._hedge_quantile: float | None = None
        if isinstance(hedge_after, str):
            if not (hedge_after.startswith("p") and hedge_after[1:].isdigit() and 0 < int(hedge_after[1:]) < 100):
                raise ValueError(f"hedge_after must be seconds or a percentile like 'p90', not {hedge_after!r}")
            self._hedge_quantile = int(hedge_after[1:]) / 100
        elif hedge_after is not None and not (isinstance(hedge_after, (int, float)) and hedge_after >= 0):
            raise ValueError("hedge_after must be >= 0 seconds")
        super().__init__(model=members[0].llm.provider.model)
        self.members = list(members)
        self.router = router
        self.max_attempts = max_attempts
        self.hedge_after = hedge_after
        self.probe_timeout = probe_timeout
        if not probe_interval > 0:
            raise ValueError("probe_interval must be > 0 seconds")
        self.prober = Prober(self.members, interval=probe_interval, timeout=probe_timeout)
        for member in self.members:
            member.health.on_down = self.prober.wake
        self.default_embed_batch_size = min(m.llm.provider.default_embed_batch_size for m in members)
        # the fleet's own key, and every member lane's (a member that does not know one ignores it)
        self.call_options = {
            **{k: v for m in members for k, v in m.llm.provider.call_options.items()},
            "session": "a conversation key: calls with the same session go to the same member (never sent upstream)",
        }
        self._served: OrderedDict[str, str] = OrderedDict()
        self._running: dict[str, list[Attempt]] = {}
        self._first_chunk_s: deque[float] = deque(maxlen=500)

    # -- which member --------------------------------------------------------------------------------

    def served_by(self, request_id: str) -> str | None:
        return self._served.get(request_id)

    def _mark(self, request_id: str, member: Member) -> None:
        self._served[request_id] = member.name
        self._served.move_to_end(request_id)
        while len(self._served) > 1024:
            self._served.popitem(last=False)

    def _choose(self, tried: set[str], key: RouteKey | None) -> Member | None:
        """A member not tried yet: a healthy one; when none is left, a down one whose cooldown
        ended (the last resort). Never a probe here: the prober brings members back."""
        now = time.monotonic()
        untried = [m for m in self.members if m.name not in tried]
        candidates = [m for m in untried if m.health.routable(now)]
        if not candidates:
            candidates = [m for m in untried if not m.health.cooling(now)]
        return self.router.pick(candidates, key, first=not tried)

    def _hedge_delay(self) -> float | None:
        if self._hedge_quantile is None:
            return None if self.hedge_after is None else float(self.hedge_after)  # type: ignore[arg-type]
        if len(self._first_chunk_s) < _MIN_OBSERVED:
            return None
        cuts = statistics.quantiles(self._first_chunk_s, n=100, method="inclusive")
        return cuts[max(0, min(98, round(self._hedge_quantile * 100) - 1))]

    # -- a call ----------------------------------------------------------------------------------------

    def stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        return self._stream(request, ctx)

    async def _stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        session = request.extra.get("session")
        if session is not None:
            request = replace(request, extra={k: v for k, v in request.extra.items() if k != "session"})
        key = self.router.key_for(request, None if session is None else str(session))
        attempts: list[Attempt] = []
        self._running[ctx.request_id] = attempts
        winner: Attempt | None = None
        try:
            winner, first = await self._first_chunk(request, ctx, attempts, key)
            if first is None:
                await winner.close(completed=True)
                return
            yield first
            while True:
                try:
                    chunk = await winner.next()
                except StopAsyncIteration:
                    break
                except Exception as exc:  # mid-answer: a typed error with the partial text, never a replay
                    err = as_typed(exc, winner.member.name)
                    await winner.close(error=err)
                    raise err from exc
                yield chunk
            winner.member.count("served")
            await winner.close(completed=True)
        finally:
            self._running.pop(ctx.request_id, None)
            with anyio.CancelScope(shield=True):
                for attempt in attempts:
                    await attempt.close()

    async def _first_chunk(
        self, request: GenerationRequest, ctx: CallContext, attempts: list[Attempt], key: RouteKey
    ) -> tuple[Attempt, StreamChunk | None]:
        """Start attempts until one produces its first chunk (or its end): failover and hedging.
        Returns the winner; every other attempt is stopped and closed."""
        tried: set[str] = set()
        failures: list[AbstractClientError] = []
        outcome: list[tuple[Attempt, StreamChunk | None]] = []
        delay = self._hedge_delay()
        hedged = False

        async def start(hedge: bool) -> bool:
            # at most max_attempts members for failover; a hedge is one more copy on top
            if len(tried) >= self.max_attempts + (1 if hedged else 0) or ctx.token.is_set:
                return False
            member = self._choose(tried, key)
            if member is None:
                return False
            tried.add(member.name)
            attempt = Attempt(member, request, ctx, fleet_model=self.model, hedge=hedge)
            attempts.append(attempt)
            self._mark(ctx.request_id, member)
            tg.start_soon(run, attempt)
            return True

        async def run(attempt: Attempt) -> None:
            try:
                chunk: StreamChunk | None = await attempt.next()
            except StopAsyncIteration:
                chunk = None
            except Exception as exc:
                err = as_typed(exc, attempt.member.name)
                if attempt.token.is_set:  # stopped (the call's stop, or it lost): not its failure
                    await attempt.close()
                    return
                await attempt.close(error=err)
                failures.append(err)
                others = any(not a.closed for a in attempts)
                if not others and not (may_fail_over(err) and await start(hedge=False)):
                    tg.cancel_scope.cancel()  # nothing left running: the call fails with this error
                return
            if outcome:  # lost the race by a hair: never two answers
                attempt.stop()
                await attempt.close()
                return
            outcome.append((attempt, chunk))
            for other in attempts:
                if other is not attempt and not other.closed:
                    other.stop()  # its server hears it now; its task unwinds below
            tg.cancel_scope.cancel()

        nobody = False
        async with anyio.create_task_group() as tg:
            if not await start(hedge=False):
                nobody = True  # raised below, outside the group (inside, an ExceptionGroup would wrap it)
                tg.cancel_scope.cancel()
            elif delay is not None:
                await anyio.sleep(delay)
                if not outcome and not ctx.token.is_set and any(not a.closed for a in attempts):
                    hedged = True
                    await start(hedge=True)  # counted on its member (Member.hedges_sent)
            await anyio.sleep(math.inf)  # until run() cancels the group
        if nobody:
            raise ServerUnavailableError(
                "no fleet member is available (all cooling down)", provider=self.name, retryable=False
            )
        for attempt in attempts:  # losers: stopped above; closed here (severed, judged as stopped)
            if not outcome or attempt is not outcome[0][0]:
                await attempt.close()
        if not outcome:
            if failures:
                raise failures[-1]
            raise ServerUnavailableError("no fleet member answered", provider=self.name, retryable=False)
        winner, first = outcome[0]
        self._first_chunk_s.append((winner.first_at or time.perf_counter()) - winner.started_at)
        if winner.hedge:
            winner.member.count("hedges_won")
        return winner, first

    def on_cancel(self, request_id: str) -> None:
        for attempt in self._running.get(request_id, []):
            attempt.provider.on_cancel(request_id)

    def engine_record(self, request_id: str) -> EngineRecord | None:
        name = self._served.get(request_id)
        for member in self.members:
            if member.name == name:
                return engine_record(member.llm.provider, request_id)
        return None

    # -- everything else goes to one member (with failover), or to all -----------------------------

    async def _on_any(self, what: str, fn: Any) -> Any:
        tried: set[str] = set()
        last: BaseException | None = None
        for _ in range(max(self.max_attempts, 1)):
            member = self._choose(tried, None)
            if member is None:
                break
            tried.add(member.name)
            try:
                return await fn(member)
            except AbstractClientError as exc:
                last = exc
                if not may_fail_over(exc):
                    raise
        if last is not None:
            raise last
        raise ServerUnavailableError(f"no fleet member is available for {what}", provider=self.name)

    async def embed(
        self, texts: list[str], ctx: CallContext, *, model: str | None, dimensions: int | None = None
    ) -> EmbeddingBatch:
        async def one(member: Member) -> EmbeddingBatch:
            m = member.llm.provider.model if model == self.model else model
            sub = CallContext(
                token=ctx.token, request_id=ctx.request_id, clients=http_clients(member.llm.provider),
                connect_timeout=ctx.connect_timeout, extensions=ctx.extensions,
            )  # fmt: skip
            self._mark(ctx.request_id, member)
            return await member.llm.provider.embed(texts, sub, model=m, dimensions=dimensions)

        result: EmbeddingBatch = await self._on_any("embed", one)
        return result

    async def count_tokens(self, request: GenerationRequest) -> int:
        async def one(member: Member) -> int:
            m = member.llm.provider.model if request.model == self.model else request.model
            return await member.llm.provider.count_tokens(replace(request, model=m))

        result: int = await self._on_any("count_tokens", one)
        return result

    async def native_tools(self, request: GenerationRequest) -> bool:
        # all or nothing: a forced call must not change shape with the member that serves it
        answers = [await m.llm.provider.native_tools(request) for m in self.members]
        return all(answers)

    async def list_models(self) -> list[ModelInfo]:
        seen: dict[str, ModelInfo] = {}
        for member in self.members:
            try:
                for info in await member.llm.provider.list_models():
                    seen.setdefault(info.id, info)
            except AbstractClientError:
                continue
        return list(seen.values())

    async def load_model(self) -> None:
        for member in self.members:
            await member.llm.provider.load_model()

    async def unload_model(self, *, drain_timeout: float = 30.0) -> UnloadReport:
        reports = [await m.llm.provider.unload_model(drain_timeout=drain_timeout) for m in self.members]
        return UnloadReport(
            server_unloaded=all(r.server_unloaded for r in reports),
            detail="; ".join(f"{m.name}: {r.detail}" for m, r in zip(self.members, reports, strict=True)),
            extra={"members": {m.name: r for m, r in zip(self.members, reports, strict=True)}},
        )

    async def wait_ready(self, timeout: float) -> None:
        """Ready once any member is (each probed on its readiness route)."""
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        for member in self.members:
            try:
                await member.llm.provider.wait_ready(max(0.1, deadline - time.monotonic()))
                return
            except AbstractClientError as exc:
                last = exc
        raise last if last is not None else ServerUnavailableError("no member is ready", provider=self.name)

    async def aclose(self) -> None:
        self.prober.close()
        for member in self.members:
            await member.llm.provider.aclose()

    def __repr__(self) -> str:
        return f"<FleetProvider {[m.name for m in self.members]} policy={self.router.policy}>"
