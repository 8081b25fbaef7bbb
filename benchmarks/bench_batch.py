"""Continuous batching on the MLX lane: aggregate tokens/s at 1, 2, 4 and 8 concurrent requests
vs the serial engine, and the stop inside a batch (stop requested → the sequence removed by the
MLX worker, from the worker's own timestamp).

Usage: python benchmarks/bench_batch.py [--tokens 32] [--stops 10] [--tiny]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _tables import pct, print_table

from abstract_client import LLM, GenerationCancelledError, create_llm

PROMPTS = [f"Write a short poem about the number {i}." for i in range(8)]


def aggregate(llm: LLM, n: int, tokens: int) -> float:
    """Tokens per second over n concurrent requests (the tokens each answer really has)."""
    counts = [0] * n

    def run(i: int) -> None:
        result = llm.generate(PROMPTS[i], max_tokens=tokens)
        counts[i] = result.usage.completion_tokens if result.usage and result.usage.completion_tokens else 0

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def stop_in_batch(llm: LLM, stops: int) -> list[float]:
    provider = llm.provider
    out = []
    for k in range(stops):
        stop = threading.Event()
        others = [threading.Thread(target=lambda i=i: llm.generate(PROMPTS[i], max_tokens=24)) for i in range(1, 4)]
        for t in others:
            t.start()
        rid = f"bench-stop-{k}"
        try:
            for i, _ in enumerate(llm.stream(PROMPTS[0], max_tokens=500, cancel_event=stop, request_id=rid)):
                if i == 4:
                    t_set = time.perf_counter()
                    stop.set()
        except GenerationCancelledError:
            pass
        for t in others:
            t.join()
        stats = provider.stats(rid)  # type: ignore[attr-defined]
        if stats is not None and stats.stopped_at is not None:
            out.append((stats.stopped_at - t_set) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--stops", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead of SmolLM2")
    args = parser.parse_args()
    if args.tiny:
        from abstract_client.testing.tiny_mlx import build_tiny_llama

        model = str(build_tiny_llama(Path(tempfile.mkdtemp())))
    else:
        from abstract_client.app.assets import smollm2_mlx

        model = str(smollm2_mlx())
    rows = []
    with create_llm("mlx", model) as serial:
        serial.generate("warm up", max_tokens=2)
        serial_rates = {n: aggregate(serial, n, args.tokens) for n in (1, 2, 4, 8)}
    with create_llm("mlx", model, max_batch_size=8) as batched:
        batched.generate("warm up", max_tokens=2)
        for n in (1, 2, 4, 8):
            rate = aggregate(batched, n, args.tokens)
            rows.append(
                {
                    "concurrent": n,
                    "serial tokens/s": serial_rates[n],
                    "batched tokens/s": rate,
                    "speed-up": rate / serial_rates[n],
                }
            )
        print_table(f"{Path(model).name}: aggregate decode, {args.tokens} tokens per request", rows, digits=2)
        latencies = stop_in_batch(batched, args.stops)
    print_table(
        f"stop one of 4 in a batch → the MLX worker removes it (worker's timestamp), n={len(latencies)} (ms)",
        [{"p50": pct(latencies, 50), "p99": pct(latencies, 99), "max": max(latencies) if latencies else float("nan")}],
    )


if __name__ == "__main__":
    main()
