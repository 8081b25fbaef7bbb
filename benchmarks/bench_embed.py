#!/usr/bin/env python3
"""Embeddings throughput: texts/s per lane, through abstract-client vs a direct HTTP loop
(httpx posting the same batches), and the stop → raise latency of an embed in flight.

    python benchmarks/bench_embed.py                       # fake servers (own process)
    python benchmarks/bench_embed.py --llamacpp --mlx      # plus real llama-server / mlx-lm
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.testing import SubprocessFake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import print_table


def texts(n: int) -> list[str]:
    return [f"Sentence number {i} about topic {i % 17}." for i in range(n)]


def rate(fn: Callable[[], int], repeats: int = 3) -> float:
    values = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = fn()
        values.append(n / (time.perf_counter() - t0))
    return statistics.median(values)


def direct_loop(url: str, path: str, model: str, inputs: list[str], batch: int, native_ollama: bool) -> int:
    with httpx.Client(base_url=url, timeout=None) as client:
        count = 0
        for start in range(0, len(inputs), batch):
            body = {"model": model, "input": inputs[start : start + batch]}
            answer = client.post(path, json=body).json()
            count += len(answer["embeddings"] if native_ollama else answer["data"])
        return count


def stop_latency(llm: Any, inputs: list[str], batch: int, after: float) -> float:
    event = threading.Event()
    stopped: list[float] = []

    def stop() -> None:
        time.sleep(after)
        stopped.append(time.perf_counter())
        event.set()

    threading.Thread(target=stop, daemon=True).start()
    try:
        llm.embed(inputs, batch_size=batch, cancel_event=event)
    except GenerationCancelledError:
        return (time.perf_counter() - stopped[0]) * 1000
    return float("nan")


def lane_row(name: str, llm: Any, inputs: list[str], batch: int, direct: Callable[[], int] | None) -> dict[str, Any]:
    ours = rate(lambda: len(llm.embed(inputs, batch_size=batch).vectors))
    theirs = rate(direct) if direct is not None else float("nan")
    return {
        "lane": name,
        "texts": len(inputs),
        "batch": batch,
        "ours_texts_per_s": ours,
        "direct_http_texts_per_s": theirs,
        "stop_to_raise_ms": stop_latency(llm, inputs * 20, batch, 0.05),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llamacpp", action="store_true")
    parser.add_argument("--mlx", action="store_true")
    parser.add_argument("-n", type=int, default=512, help="texts per run (fake lanes)")
    args = parser.parse_args()
    rows = []
    inputs = texts(args.n)
    for kind, provider, path in (
        ("openai", "openai-compatible", "/v1/embeddings"),
        ("ollama", "ollama", "/api/embed"),
        ("lmstudio", "lmstudio", "/v1/embeddings"),
    ):
        with SubprocessFake(kind, embed_delay=0.0) as server:
            llm = create_llm(provider, "fake-model", base_url=server.base_url, max_retries=0)
            native = kind == "ollama"

            def direct(url: str = server.url, path: str = path, native: bool = native) -> int:
                return direct_loop(url, path, "fake-model", inputs, 64, native)

            rows.append(lane_row(f"fake {kind}", llm, inputs, 64, direct))
            llm.close()
    if args.llamacpp:
        from abstract_client.testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

        server = LlamaServer.launch(
            llama_server_binary(),
            smollm2_gguf(),
            log_path=Path("/tmp/abstract-client-bench-embed.log"),
            batch=512,
            threads=2,
            extra=["--embeddings", "--pooling", "mean"],
        )
        try:
            llm = create_llm("llamacpp", "smollm2", base_url=server.url, max_retries=0)
            few = inputs[:64]
            direct = lambda: direct_loop(server.url, "/v1/embeddings", "smollm2", few, 16, False)  # noqa: E731
            rows.append(lane_row("llama-server (real)", llm, few, 16, direct))
            llm.close()
        finally:
            server.stop()
    if args.mlx:
        from abstract_client.app.assets import smollm2_mlx

        with create_llm("mlx", str(smollm2_mlx())) as llm:
            llm.embed("warm up")
            rows.append(lane_row("mlx (real, in-process)", llm, inputs[:32], 8, None))
    print_table("Embeddings: texts/s (median of 3) and stop → raise during an embed", rows, digits=1)


if __name__ == "__main__":
    main()
