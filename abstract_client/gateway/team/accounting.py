"""Who used the gateway and what it cost: every flight (``flight.Flight``) is admitted against
its key's limits (``limits.py``) and, when it ends, accounted once — its key's counts settle to
what the engine counted, a :class:`~.usage.UsageRecord` goes to the usage log, and the
per-key counters of ``/metrics`` move.

What a request cost comes from the library's own result or stop: a complete answer's usage, a
stopped answer's usage at its stop (an in-process engine's own count of what it sampled; over
HTTP, what the server reported), an error's partial usage. A request that never reached an
engine (refused by a limit, a full queue, stopped while queued) costs nothing."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import AbstractClientError
from ...wires.chat_server import openai_error
from ..config import ConfigError, GatewayConfig
from .keys import ANONYMOUS
from .limit_stores import LimitStore, MemoryLimits, SQLiteLimits
from .limits import MAX_TOKENS, UNLIMITED, Admission, Limiter, Refusal, period_bounds, prompt_bound
from .usage import UsageLog
from .usage_records import UsageRecord, UsageUnwritable, usage_file

if TYPE_CHECKING:
    from ..flight import Flight

__all__ = ["Accounting"]

log = logging.getLogger("abstract_client.gateway")


class Accounting:
    def __init__(self, config: GatewayConfig, *, shared_dir: Path | None = None) -> None:
        """``shared_dir``: the run directory this process's sibling workers share (their limits
        are kept in a SQLite file there); with a ``store``, the limits are kept in it."""
        self.keyed = bool(config.key_names())  # keys configured: per-key figures are the admin's
        self.names = {*config.key_names(), ANONYMOUS}  # every name a request can be billed to
        self.limits = {name: config.limits_for(name) for name in self.names}
        self.weights = {name: (lim.weight if lim is not None else 1) for name, lim in self.limits.items()}
        self.log: UsageLog | None = None
        if config.usage:
            try:
                self.log = UsageLog(
                    usage_file(config.data_dir), retention_days=config.usage_retention_days, store=config.store
                )
            except UsageUnwritable as exc:
                raise ConfigError(str(exc)) from None
        self.limiter = Limiter(
            self.limits,
            self._spent_in_periods(),
            store=_limit_store(config, shared_dir)
            if any(lim and lim.limited for lim in self.limits.values())
            else None,
            lease=config.limits_lease,
            when_down=config.limits_store_down,
        )
        self._lock = threading.Lock()
        self._renewing: asyncio.Task[None] | None = None  # renews this process's reservations (start)
        self.clamped = 0  # usage numbers out of range an upstream reported (clamped, said)
        self._said_clamped_at = 0.0
        # per key and backend (both bounded by the config: a key nobody configured is a 401)
        self.requests: dict[tuple[str, str, str], int] = defaultdict(int)  # (key, model, outcome)
        self.tokens: dict[tuple[str, str, str], int] = defaultdict(int)  # (key, model, kind)
        self.refusals: dict[tuple[str, str], int] = defaultdict(int)  # (key, limit)

    def _spent_in_periods(self) -> dict[str, int]:
        """What each key with a budget spent in its period before this process started."""
        if self.log is None:
            return {}
        now, spent = time.time(), {}
        by_start: dict[float, dict[str, int]] = {}  # one query per period, whatever the keys
        try:
            for name, limits in self.limits.items():
                if limits is not None and limits.token_budget is not None:
                    start, _ = period_bounds(limits.budget_period, now)
                    if start not in by_start:
                        by_start[start] = self.log.spent_since(start)
                    spent[name] = by_start[start].get(name, 0)
        except self.log.store.errors as exc:  # a shared store down at start-up: serve all the same
            log.warning("usage: what the keys spent of their budgets could not be read (%s); counting from 0", exc)
        return spent

    async def admit(
        self, key: str, max_tokens: Any, prompt: Mapping[str, Any] | None = None, *, count_only: bool = False
    ) -> Admission | Refusal:
        """Within the key's limits (an admission to settle at the end), or a refusal to send.
        ``prompt``: the call's arguments, whose prompt's bound (``limits.prompt_bound``, walked
        only for a key with limits) is reserved with ``max_tokens``; ``count_only``: a token
        count (concurrency and requests only)."""
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            max_tokens = None
        prompt_tokens = prompt_bound(prompt) if prompt is not None and self.limiter.limited(key) else 0
        admitted = await self.limiter.admit(key, max_tokens, prompt_tokens, count_only=count_only)
        if isinstance(admitted, Refusal):
            with self._lock:
                self.refusals[(key, admitted.limit)] += 1
        return admitted

    def weight(self, key: str) -> int:
        return self.weights.get(key, 1)

    def account(self, flight: Flight, route: str, status: int) -> None:
        """The flight ended with ``status``: settle its key, log its record, count it (once)."""
        if flight.accounted:
            return
        if flight.settling:  # an in-process engine still draining: when it settled (state.py)
            flight.accounted_later(route, status)
            return
        flight.accounted_now()
        try:
            record = self.record_of(flight, route, status)
        except Exception:  # accounting never fails a request: a defect here is logged, loudly
            log.exception("usage: request %s could not be accounted", flight.request_id)
            (flight.admission or UNLIMITED).settle(0)
            return
        (flight.admission or UNLIMITED).settle(record.computed_tokens)
        self._count(record)
        if self.log is not None:
            self.log.add(record)

    def refused(
        self, refusal: Refusal, key: str, backend: str, route: str, request_id: str
    ) -> tuple[dict[str, Any], list[tuple[bytes, bytes]]]:
        """A request refused by a limit before it reached an engine: counted at no cost, per
        key, limit and minute (a flood of refusals is a few counters, never a row each); the
        429's body (OpenAI's shape: a route answering in another reshapes it) and headers."""
        with self._lock:
            self.requests[(key, backend, "refused")] += 1
        if self.log is not None:
            self.log.add_refusal(time.time(), key, backend, route, refusal.limit)
        kind = "rate_limit_error" if refusal.status == 429 else "unavailable_error"
        body = openai_error(refusal.message, kind, refusal.limit)
        return body, [(b"retry-after", str(refusal.retry_after).encode())]

    def counted(self, key: str, backend: str, request_id: str, started: float, error: BaseException | None) -> None:
        """A token count (``/v1/messages/count_tokens``): on the record, 0 tokens billed."""
        outcome, reason = ("completed", None) if error is None else ("error", type(error).__name__)
        total = round((time.time() - started) * 1000, 3)
        record = UsageRecord(started, key, backend, "count_tokens", request_id, outcome, reason, total_ms=total)
        self._count(record)
        if self.log is not None:
            self.log.add(record)

    def _count(self, record: UsageRecord) -> None:
        with self._lock:
            self.requests[(record.key, record.model, record.outcome)] += 1
            for kind in ("prompt_tokens", "cached_tokens", "generated_tokens"):
                n = getattr(record, kind)
                if n:
                    self.tokens[(record.key, record.model, kind)] += n

    def record_of(self, flight: Flight, route: str, status: int) -> UsageRecord:
        now = time.perf_counter()
        usage, generated = flight.usage, None
        reason: str | None = None
        if flight.stop_error is not None:
            outcome, reason = "stopped", flight.stop_error.reason
            if flight.reason:
                reason = flight.reason
            generated = flight.stop_error.generated_tokens
            usage = flight.stop_error.usage or usage
            if flight.engine_usage is not None:  # the engine's own, final count
                usage, generated = flight.engine_usage, flight.engine_usage.completion_tokens
        elif status == 200 and flight.error is None:
            outcome = "completed"
        elif flight.admitted_at is None:  # never reached the engine: a full queue
            outcome, reason = "refused", "queue_timeout" if status == 503 else str(status)
        else:
            outcome = "error"
            err = flight.error
            reason = type(err).__name__ if err is not None else str(status)
            if isinstance(err, AbstractClientError):
                usage, generated = err.usage or usage, err.generated_tokens
        prompt = cached = 0
        if usage is not None:
            prompt, cached = usage.prompt_tokens or 0, usage.cached_tokens or 0
        if generated is None:  # a stop's count is its own (the engine's, where it has one)
            generated = usage.completion_tokens or 0 if usage is not None else 0
        prompt, cached, generated = (self._sane(flight, n) for n in (prompt, cached, generated))
        cached = min(cached, prompt)
        if flight.admitted_at is None:  # nothing ran: nothing to bill
            prompt = cached = generated = 0
        started = flight.started_at

        def ms(at: float | None) -> float | None:
            return None if at is None else round((at - started) * 1000, 3)

        return UsageRecord(
            started_at=flight.arrived_at,
            key=flight.key,
            model=flight.backend.name,
            route=route,
            request_id=flight.request_id,
            outcome=outcome,
            reason=reason,
            prompt_tokens=prompt,
            cached_tokens=cached,
            generated_tokens=generated,
            queued_ms=ms(flight.admitted_at),
            first_token_ms=ms(flight.first_token_at),
            total_ms=ms(now),
        )

    def _sane(self, flight: Flight, n: Any) -> int:
        """An upstream's count, in ``0 … MAX_TOKENS`` (a negative one never refunds a key, a huge
        one never breaks the store); one out of range is clamped, counted and said (once a
        minute)."""
        if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_TOKENS:
            return n
        try:
            value = max(0, min(int(n), MAX_TOKENS))
        except (TypeError, ValueError, OverflowError):
            value = 0
        with self._lock:
            self.clamped += 1
        now = time.monotonic()
        if now - self._said_clamped_at >= 60:
            self._said_clamped_at = now
            log.warning(
                "usage: %s reported a token count out of range (%.40r) for %s: counted as %d",
                flight.backend.name,
                n,
                flight.request_id,
                value,
            )
        return value

    async def start(self) -> None:
        """On the gateway's loop: renew this process's reservations while it lives."""
        self._renewing = asyncio.get_running_loop().create_task(self.limiter.run_renewals())

    async def aclose(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
        await self.limiter.aclose()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()

    def families(self, *, per_key: bool = True) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily

        from ..metrics import PREFIX

        requests = CounterMetricFamily(
            f"{PREFIX}_key_requests", "Requests per key, model and outcome", labels=["key", "model", "outcome"]
        )
        tokens = CounterMetricFamily(
            f"{PREFIX}_key_tokens",
            "Tokens per key and model as the engine counted them (kind: prompt, cached, generated)",
            labels=["key", "model", "kind"],
        )
        refusals = CounterMetricFamily(
            f"{PREFIX}_key_limited", "Requests refused by a key's limit (429)", labels=["key", "limit"]
        )
        dropped = CounterMetricFamily(f"{PREFIX}_usage_records_dropped", "Usage records a failed write lost")
        clamped = CounterMetricFamily(
            f"{PREFIX}_usage_counts_clamped", "Token counts out of range an upstream reported (clamped)"
        )
        failures = CounterMetricFamily(
            f"{PREFIX}_limits_store_failures", "Admissions the shared limits store did not answer"
        )
        dropped.add_metric([], self.log.dropped if self.log is not None else 0)
        clamped.add_metric([], self.clamped)
        failures.add_metric([], self.limiter.store_failures)
        if not per_key:  # another key's name or figures are the admin's to read
            return [dropped, clamped, failures]
        with self._lock:
            for (k, m, o), n in sorted(self.requests.items()):
                requests.add_metric([k, m, o], n)
            for (k, m, kind), n in sorted(self.tokens.items()):
                tokens.add_metric([k, m, kind.removesuffix("_tokens")], n)
            for (k, lim), n in sorted(self.refusals.items()):
                refusals.add_metric([k, lim], n)
        return [requests, tokens, refusals, dropped, clamped, failures]


def _limit_store(config: GatewayConfig, shared_dir: Path | None) -> LimitStore:
    """Where the keys' counts live: the store the hosts share, the file the workers share, or
    this process's memory."""
    if config.store is not None:
        from .limit_stores import RedisLimits

        return RedisLimits(config.store, config.store_timeout)
    if shared_dir is not None:
        return SQLiteLimits(shared_dir / "limits.sqlite3")
    return MemoryLimits()
