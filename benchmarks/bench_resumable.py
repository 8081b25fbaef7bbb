"""Resumable generations on a real llama-server (issue #42): resumed through random cuts, and the stop.

* Resume: ``runs`` greedy streams of 200 tokens through ``tests/cutting_proxy.py``, each cut
  ``cuts`` times at random bytes (seeded); each compared delta by delta with an uninterrupted
  run: tokens lost and tokens repeated (a diff of the two delta lists), and the wall time beside
  the uninterrupted one.
* Stop: ``n`` stops pressed after 5 chunks, plain (the sever) vs ``resumable=True`` (its
  ``DELETE /v1/stream``, then the sever): stop → raise, and stop → engine stopped (``/slots``
  idle, polled every 2 ms: the engine's own word), p50/p99 in ms. Beside them, what a sever alone
  does to a resumable stream: the engine keeps decoding.

Usage: python benchmarks/bench_resumable.py [--runs 10 --cuts 5 -n 20]
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _tables import pct, print_table

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.testing.processes import LlamaServer, llama_server_binary, smollm2_gguf
from tests.cutting_proxy import CuttingProxy

STORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a long story about a dragon."},
]
GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 7, "max_tokens": 200, "ignore_eos": True}


def deltas(url: str, **options: Any) -> tuple[list[str], float]:
    with create_llm("llamacpp", "smollm2", base_url=url, max_retries=0) as llm:
        t0 = time.perf_counter()
        with llm.stream(messages=STORY, **{**GREEDY, **options}) as stream:
            out = [c.delta for c in stream if c.delta]
        return out, time.perf_counter() - t0


def resume_rows(server: LlamaServer, runs: int, cuts: int) -> list[dict[str, Any]]:
    reference, plain_s = deltas(server.url)
    lost = repeated = cut_total = 0
    took = []
    for seed in range(runs):
        proxy = CuttingProxy(server.port, seed=seed, cuts=cuts)
        try:
            got, seconds = deltas(proxy.url, resumable=True)
        finally:
            proxy.close()
        cut_total += len(proxy.cut_at)
        took.append(seconds)
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=reference, b=got, autojunk=False).get_opcodes():
            if op in ("delete", "replace"):
                lost += i2 - i1
            if op in ("insert", "replace"):
                repeated += j2 - j1
    return [
        {
            "runs": runs,
            "cuts made": cut_total,
            "tokens per run": len(reference),
            "tokens lost": lost,
            "tokens repeated": repeated,
            "uninterrupted s": plain_s,
            "resumed s p50": pct(took, 50),
            "resumed s max": max(took),
        }
    ]


def idle(server: LlamaServer) -> bool:
    try:
        return not any(s.get("is_processing") for s in server.slots())
    except (OSError, ValueError, httpx.HTTPError):
        return False


def stop_once(server: LlamaServer, resumable: bool) -> tuple[float, float]:
    """(stop → raise ms, stop → /slots idle ms) of one stop after 5 chunks."""
    event = threading.Event()
    with create_llm("llamacpp", "smollm2", base_url=server.url, max_retries=0) as llm:
        stream = llm.stream(messages=STORY, max_tokens=2000, ignore_eos=True, resumable=resumable, cancel_event=event)
        stopped_at = raised_at = 0.0
        try:
            for i, _ in enumerate(stream):
                if i == 5:
                    stopped_at = time.perf_counter()
                    event.set()
        except GenerationCancelledError:
            raised_at = time.perf_counter()
        while not idle(server):
            if time.perf_counter() - stopped_at > 30:
                return (raised_at - stopped_at) * 1000, float("nan")
            time.sleep(0.002)
        idle_at = time.perf_counter()
    while not idle(server):
        time.sleep(0.01)
    return (raised_at - stopped_at) * 1000, (idle_at - stopped_at) * 1000


def sever_only(server: LlamaServer) -> float:
    """A resumable stream's connection closed with no DELETE: how many tokens it decodes on in 2 s."""
    body = {"messages": STORY, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": "bench-sever-only"}
    ) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 10:
                break
    before = server.n_decoded()
    time.sleep(2)
    after = server.n_decoded()
    httpx.delete(server.url + "/v1/stream", params={"conv_id": "bench-sever-only"})
    while not idle(server):
        time.sleep(0.01)
    return after - before


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cuts", type=int, default=5)
    parser.add_argument("-n", type=int, default=20)
    args = parser.parse_args()
    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        sys.exit("llama-server or the SmolLM2 GGUF is missing: scripts/get_llama_server.sh, scripts/get_model.py")
    with tempfile.TemporaryDirectory() as tmp:
        server = LlamaServer.launch(binary, model, log_path=Path(tmp) / "server.log")
        try:
            print_table(
                f"Resume through random cuts ({args.cuts} per run; llama-server, SmolLM2, greedy)",
                resume_rows(server, args.runs, args.cuts),
            )
            rows = []
            for label, resumable in (("plain stream (sever)", False), ("resumable=True (DELETE + sever)", True)):
                raised, stopped = zip(*(stop_once(server, resumable) for _ in range(args.n)), strict=True)
                rows.append(
                    {
                        "path": label,
                        "n": args.n,
                        "stop→raise p50": pct(list(raised), 50),
                        "p99": pct(list(raised), 99),
                        "stop→engine stopped p50": pct(list(stopped), 50),
                        "p99 ": pct(list(stopped), 99),
                    }
                )
            print_table("Stop (ms; engine stopped = /slots idle)", rows, digits=1)
            print(f"\na resumable stream severed with no DELETE decoded {sever_only(server)} more tokens in 2 s")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
