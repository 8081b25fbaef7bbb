"""The gateway's Prometheus text: requests running, stops by reason, prompt tokens (and the
share a backend's prompt cache served), and the stop chain's latency (the stop seen → the
engine stopped: upstream socket severed and the call unwound, or the in-process engine's worker
drained)."""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["BUCKETS", "Metrics", "PREFIX"]

BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PREFIX = "abstract_client_gateway"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running: dict[str, int] = defaultdict(int)
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.stops: dict[tuple[str, str], int] = defaultdict(int)
        self.rejected: dict[str, int] = defaultdict(int)
        self.prompt_tokens: dict[str, int] = defaultdict(int)
        self.cached_tokens: dict[str, int] = defaultdict(int)
        self._buckets = [0] * len(BUCKETS)
        self._count = 0
        self._sum = 0.0
        self.chain_ms: deque[float] = deque(maxlen=10_000)  # the latest stop chains, for benchmarks
        # other families (the accounting's): called with per_key=False for a reader who may not
        # see other keys' names and figures
        self.more: list[Callable[..., list[Any]]] = []

    def started(self, backend: str) -> None:
        with self._lock:
            self.running[backend] += 1

    def finished(self, backend: str, endpoint: str, status: int) -> None:
        with self._lock:
            self.running[backend] -= 1
            self.requests[(backend, endpoint, status)] += 1

    def stopped(self, backend: str, reason: str, seconds: float) -> None:
        with self._lock:
            self.stops[(backend, reason)] += 1
            self._count += 1
            self._sum += seconds
            self.chain_ms.append(seconds * 1000)
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    self._buckets[i] += 1

    def prompt(self, backend: str, usage: Any) -> None:
        """A generation's prompt, answered or stopped (its partial usage): how many tokens, and
        how many a prompt cache served (where the backend reports it)."""
        if usage is None or usage.prompt_tokens is None:
            return
        with self._lock:
            self.prompt_tokens[backend] += usage.prompt_tokens
            self.cached_tokens[backend] += usage.cached_tokens or 0

    def queue_rejected(self, backend: str) -> None:
        with self._lock:
            self.rejected[backend] += 1

    def render(
        self, backends: list[str], fleets: dict[str, dict[str, Any]] | None = None, *, per_key: bool = True
    ) -> str:
        """The Prometheus text exposition format, written by ``prometheus_client`` (label values
        escaped: a backend may be named anything). ``fleets``: the ``Fleet.status()`` of each
        backend served by several members. ``per_key``: with each key's series (the admin's)."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(self, backends, fleets or {}, per_key))
        return generate_latest(registry).decode()

    def families(self, backends: list[str], fleets: dict[str, dict[str, Any]] | None = None) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        with self._lock:
            running = GaugeMetricFamily(f"{PREFIX}_requests_running", "Requests in flight", labels=["backend"])
            for b in backends:
                running.add_metric([b], self.running[b])
            requests = CounterMetricFamily(
                f"{PREFIX}_requests", "Requests answered", labels=["backend", "endpoint", "status"]
            )
            for (b, e, st), n in sorted(self.requests.items()):
                requests.add_metric([b, e, str(st)], n)
            stops = CounterMetricFamily(
                f"{PREFIX}_stops", "Generations stopped, by reason", labels=["backend", "reason"]
            )
            for (b, r), n in sorted(self.stops.items()):
                stops.add_metric([b, r], n)
            rejected = CounterMetricFamily(
                f"{PREFIX}_queue_rejected", "Requests refused by a full queue (503)", labels=["backend"]
            )
            for b in backends:
                rejected.add_metric([b], self.rejected[b])
            prompt = CounterMetricFamily(f"{PREFIX}_prompt_tokens", "Prompt tokens of generations", labels=["backend"])
            cached = CounterMetricFamily(
                f"{PREFIX}_prompt_tokens_cached", "Prompt tokens served from a prompt cache", labels=["backend"]
            )
            for b in backends:
                prompt.add_metric([b], self.prompt_tokens[b])
                cached.add_metric([b], self.cached_tokens[b])
            chain = HistogramMetricFamily(
                f"{PREFIX}_stop_to_engine_stopped_seconds", "From the stop seen to the engine stopped"
            )
            cumulative = [(str(bound), n) for bound, n in zip(BUCKETS, self._buckets, strict=True)]
            chain.add_metric([], [*cumulative, ("+Inf", self._count)], sum_value=self._sum)
        return [running, requests, stops, rejected, prompt, cached, chain, *fleet_families(fleets or {})]


def fleet_families(fleets: dict[str, dict[str, Any]]) -> list[Any]:
    """Per fleet member: calls in flight, healthy or not, attempts served/failed/stopped, cooldowns;
    per fleet: hedges sent and won."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    labels = ["backend", "member"]
    in_flight = GaugeMetricFamily(f"{PREFIX}_fleet_member_in_flight", "Fleet member: calls in flight", labels=labels)
    healthy = GaugeMetricFamily(
        f"{PREFIX}_fleet_member_healthy", "Fleet member: 1 healthy, 0 cooling down or awaiting a probe", labels=labels
    )
    counters = {
        key: CounterMetricFamily(f"{PREFIX}_fleet_member_{key}", f"Fleet member: attempts {key}", labels=labels)
        for key in ("served", "failed", "stopped", "cooldowns")
    }
    hedges = CounterMetricFamily(f"{PREFIX}_fleet_hedges", "Hedged attempts", labels=["backend", "outcome"])
    for backend, status in sorted(fleets.items()):
        for m in status["members"]:
            in_flight.add_metric([backend, m["name"]], m["in_flight"])
            healthy.add_metric([backend, m["name"]], 1 if m["state"] == "healthy" else 0)
            for key, family in counters.items():
                family.add_metric([backend, m["name"]], m[key])
        hedges.add_metric([backend, "sent"], status["hedges_sent"])
        hedges.add_metric([backend, "won"], status["hedges_won"])
    return [in_flight, healthy, *counters.values(), hedges] if fleets else []


class _Snapshot:
    """A ``prometheus_client`` collector over the counts above (read under their lock)."""

    def __init__(self, metrics: Metrics, backends: list[str], fleets: dict[str, dict[str, Any]], per_key: bool) -> None:
        self._metrics, self._backends, self._fleets, self._per_key = metrics, backends, fleets, per_key

    def collect(self) -> Iterator[Any]:
        yield from self._metrics.families(self._backends, self._fleets)
        for families in self._metrics.more:
            yield from families(per_key=self._per_key)
