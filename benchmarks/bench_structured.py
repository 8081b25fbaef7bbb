"""Per-token cost of constrained decoding on the MLX lane (llguidance), and the stop inside it.

Runs SmolLM2-135M-Instruct (MLX) on this machine: tokens/s of the same request with and without a
JSON schema, the mask's own time per token, and stop → raise during a constrained decode.
Usage: python benchmarks/bench_structured.py [--runs 3] [--tokens 120]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _tables import pct, print_table

from abstract_client import LLM, GenerationCancelledError, OutputValidationError, create_llm
from abstract_client.app.assets import smollm2_mlx

SCHEMA = {
    "type": "object",
    "properties": {"words": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 500}},
    "required": ["words"],
}
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "List many words."},
]


def decode_rate(llm: LLM, tokens: int, extra: dict[str, Any]) -> float:
    """Chunks per second between the first and the last chunk (one chunk per sampled token;
    a schema answer cut at max_tokens ends in OutputValidationError, which is expected here)."""
    times = []
    try:
        for _ in llm.stream(messages=MESSAGES, max_tokens=tokens, **extra):
            times.append(time.perf_counter())
    except OutputValidationError:
        pass
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--stops", type=int, default=20)
    args = parser.parse_args()
    import abstract_client.providers._shaping as shaping

    mask_ms: list[float] = []
    original = shaping.GrammarProcessor.__call__

    def timed_call(self, tokens, logits):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = original(self, tokens, logits)
        mask_ms.append((time.perf_counter() - t0) * 1000)
        return out

    shaping.GrammarProcessor.__call__ = timed_call  # type: ignore[method-assign]
    import llguidance.numpy as lln

    fill_us: list[float] = []
    original_fill = lln.fill_next_token_bitmask

    def timed_fill(*a, **kw):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = original_fill(*a, **kw)
        fill_us.append((time.perf_counter() - t0) * 1e6)
        return out

    lln.fill_next_token_bitmask = timed_fill
    rows = []
    with create_llm("mlx", str(smollm2_mlx())) as llm:
        decode_rate(llm, 4, {})
        decode_rate(llm, 4, {"response_format": SCHEMA})
        for label, extra in (
            ("plain", {"logit_bias": {2: -1e9}}),
            ("json schema (llguidance)", {"response_format": SCHEMA}),
        ):
            rates = []
            for _ in range(args.runs):
                mask_ms.clear()
                fill_us.clear()
                rates.append(decode_rate(llm, args.tokens, extra))
            row = {
                "decode": label,
                "tokens/s (median)": statistics.median(rates),
                "ms/token": 1000 / statistics.median(rates),
                "processor ms/token p50 (incl. wait for token n)": pct(mask_ms, 50) if mask_ms else 0.0,
                "llguidance mask us/token p50": pct(fill_us, 50) if fill_us else 0.0,
                "p99": pct(fill_us, 99) if fill_us else 0.0,
            }
            rows.append(row)
        print_table(f"MLX SmolLM2-135M, {args.tokens} tokens, {args.runs} runs each", rows)
        latencies = []
        for _ in range(args.stops):
            stop = threading.Event()
            try:
                for i, _chunk in enumerate(
                    llm.stream(messages=MESSAGES, response_format=SCHEMA, max_tokens=2000, cancel_event=stop)
                ):
                    if i == 10:
                        t0 = time.perf_counter()
                        stop.set()
            except GenerationCancelledError:
                latencies.append((time.perf_counter() - t0) * 1000)
        print_table(
            f"stop → raise during a constrained decode (n={len(latencies)})",
            [{"p50 ms": pct(latencies, 50), "p99 ms": pct(latencies, 99), "max ms": max(latencies)}],
        )


if __name__ == "__main__":
    main()
