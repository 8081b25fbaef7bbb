"""Helpers the benchmark scripts share: percentiles, timing a call, printing a table."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def pct(values: list[float], q: float) -> float:
    ordered = sorted(v for v in values if v == v)  # NaN (no evidence) is left out
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def timed(fn: Callable[[], object], n: int, warm: int = 0) -> list[float]:
    """Milliseconds per call of ``fn``, ``n`` times (after ``warm`` untimed calls)."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def stop_rows(label: str, n: int, once: Callable[[str, str], tuple[float, float, float]]) -> list[dict[str, Any]]:
    """The stop table of an in-process lane: ``once(case, request_id)`` stops one request and
    returns (stop → raise ms, stop → engine stopped ms, tokens counted after the flag); ``n`` of
    each case, decode and prefill."""
    rows = []
    for case in ("decode", "prefill"):
        raise_ms, idle_ms, after = [], [], []
        for i in range(n):
            r, d, a = once(case, f"{label.replace(' ', '-')}-{case}-{i}")
            raise_ms.append(r)
            idle_ms.append(d)
            after.append(a)
        rows.append(
            {
                "lane": label,
                "case": case,
                "n": n,
                "stop→raise p50": pct(raise_ms, 50),
                "p99": pct(raise_ms, 99),
                "stop→engine stopped p50": pct(idle_ms, 50),
                "p99 ": pct(idle_ms, 99),
                "tokens after flag": max(after),
            }
        )
    return rows


def print_table(title: str, rows: list[dict[str, Any]], digits: int = 3) -> None:
    print(f"\n{title}")
    cols = list(rows[0])
    cells = [[f"{r[c]:.{digits}f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
