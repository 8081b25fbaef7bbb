"""The gateway's Prometheus text: requests running, stops by reason, and the stop chain's
latency (the stop seen → the engine stopped: upstream socket severed and the call unwound, or
the in-process engine's worker drained)."""

from __future__ import annotations

import threading
from collections import defaultdict, deque

BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PREFIX = "abstract_client_gateway"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running: dict[str, int] = defaultdict(int)
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.stops: dict[tuple[str, str], int] = defaultdict(int)
        self.rejected: dict[str, int] = defaultdict(int)
        self._buckets = [0] * len(BUCKETS)
        self._count = 0
        self._sum = 0.0
        self.chain_ms: deque[float] = deque(maxlen=10_000)  # the latest stop chains, for benchmarks

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

    def queue_rejected(self, backend: str) -> None:
        with self._lock:
            self.rejected[backend] += 1

    def render(self, backends: list[str]) -> str:
        with self._lock:
            lines = [f"# TYPE {PREFIX}_requests_running gauge"]
            lines += [f'{PREFIX}_requests_running{{backend="{b}"}} {self.running[b]}' for b in backends]
            lines.append(f"# TYPE {PREFIX}_requests_total counter")
            lines += [
                f'{PREFIX}_requests_total{{backend="{b}",endpoint="{e}",status="{s}"}} {n}'
                for (b, e, s), n in sorted(self.requests.items())
            ]
            lines.append(f"# TYPE {PREFIX}_stops_total counter")
            lines += [
                f'{PREFIX}_stops_total{{backend="{b}",reason="{r}"}} {n}' for (b, r), n in sorted(self.stops.items())
            ]
            lines.append(f"# TYPE {PREFIX}_queue_rejected_total counter")
            lines += [f'{PREFIX}_queue_rejected_total{{backend="{b}"}} {self.rejected[b]}' for b in backends]
            lines.append(f"# TYPE {PREFIX}_stop_to_engine_stopped_seconds histogram")
            for bound, n in zip(BUCKETS, self._buckets, strict=True):
                lines.append(f'{PREFIX}_stop_to_engine_stopped_seconds_bucket{{le="{bound}"}} {n}')
            lines.append(f'{PREFIX}_stop_to_engine_stopped_seconds_bucket{{le="+Inf"}} {self._count}')
            lines.append(f"{PREFIX}_stop_to_engine_stopped_seconds_sum {self._sum:.6f}")
            lines.append(f"{PREFIX}_stop_to_engine_stopped_seconds_count {self._count}")
        return "\n".join(lines) + "\n"
