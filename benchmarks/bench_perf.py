#!/usr/bin/env python3
"""What waiting, streaming and guarding cost. Prints tables; all against a fake server that runs
in its own process (in-process, its threads would compete with the client for the GIL).

    python benchmarks/bench_perf.py                   # all three
    python benchmarks/bench_perf.py --only chunks     # or: waiting, overhead
    python benchmarks/bench_perf.py --json

* waiting: process CPU over 5 s with 1,000 async calls in flight, each with its own
  ``threading.Event`` stop source, all waiting for the server's first byte; then stop → raise
  for one Event-driven call set from another thread (p50/p99 over ``-n`` stops).
* cancel_id: ``cancel(request_id)`` of a call with no stop source of its own: raise, server EOF.
* chunks: one SSE stream of 20,000 chunks, rendered before the request and written in one
  ``sendall`` by its own process (``_prerendered.py``: the server is not the limit): chunks/s for
  raw httpx (``aiter_lines`` + ``json.loads``, the floor), abstract-client ``astream`` and
  openai-python, side by side in one run.
* overhead: a ~1 KB non-streaming answer, per request: the guarded private connection every
  generation uses vs the same call forced onto the pooled client.

The script runs against whichever ``abstract_client`` sits beside it (copy it into an older
checkout to measure "before").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import psutil

from abstract_client import AbortController, GenerationCancelledError, create_llm
from abstract_client.testing import SubprocessFake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import pct, print_table, timed

# -- waiting --------------------------------------------------------------------------------------


def waiting(n_calls: int, n_stops: int, seconds: float = 5.0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with SubprocessFake("openai", prefill_delay=3600) as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0)
        proc = psutil.Process()

        async def in_flight() -> float:
            events = [threading.Event() for _ in range(n_calls)]

            async def one(event: threading.Event) -> None:
                try:
                    await llm.agenerate("x", max_tokens=1, cancel_event=event)
                except GenerationCancelledError:
                    pass

            tasks = [asyncio.create_task(one(e)) for e in events]
            while len(llm.in_flight) < n_calls:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # let connects settle
            cpu0, t0 = proc.cpu_times(), time.monotonic()
            await asyncio.sleep(seconds)
            cpu1, t1 = proc.cpu_times(), time.monotonic()
            for e in events:
                e.set()
            await asyncio.gather(*tasks)
            used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
            return used / (t1 - t0) * 100

        share = asyncio.run(in_flight())
        rows.append({"case": f"{n_calls} Event-driven calls waiting", "value": share, "unit": "% of one core"})

        server.set(prefill_delay=3600)
        raise_ms: list[float] = []
        for _ in range(n_stops):
            event = threading.Event()
            stop_at: list[float] = []

            def stop(ev: threading.Event = event, out: list[float] = stop_at) -> None:
                time.sleep(0.02)
                out.append(time.perf_counter())
                ev.set()

            threading.Thread(target=stop, daemon=True).start()
            try:
                llm.generate("x", max_tokens=1, cancel_event=event)
            except GenerationCancelledError:
                raise_ms.append((time.perf_counter() - stop_at[0]) * 1000)
        rows.append({"case": "Event stop → raise p50 (sync, headers)", "value": pct(raw := raise_ms, 50), "unit": "ms"})
        rows.append({"case": "Event stop → raise p99 (sync, headers)", "value": pct(raw, 99), "unit": "ms"})
        llm.close()
    return rows


def cancel_by_id(n: int) -> list[dict[str, Any]]:
    """``generate(request_id=...)`` with no stop source of its own, stopped by ``cancel(id)``
    from another thread while the server "processes the prompt": raise, and the server's EOF."""
    raise_ms: list[float] = []
    eof_ms: list[float] = []
    with SubprocessFake("openai", prefill_delay=3600) as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0)
        for i in range(n):
            stopped: list[float] = []
            rid = f"req-{i}"

            def stop(rid: str = rid, out: list[float] = stopped, seen: int = i + 1) -> None:
                while len(server.records()) < seen:  # the server holds the request
                    time.sleep(0.001)
                time.sleep(0.02)
                out.append(time.perf_counter())
                llm.cancel(rid)

            threading.Thread(target=stop, daemon=True).start()
            try:
                llm.generate("x", max_tokens=1, request_id=rid)
            except GenerationCancelledError:
                raise_ms.append((time.perf_counter() - stopped[0]) * 1000)
                eof_ms.append((server.wait_for_disconnect() - stopped[0]) * 1000)
        llm.close()
    return [
        {"case": "cancel(id) → raise (sync, no stop source)", "p50_ms": pct(raise_ms, 50), "p99_ms": pct(raise_ms, 99)},
        {"case": "cancel(id) → server EOF", "p50_ms": pct(eof_ms, 50), "p99_ms": pct(eof_ms, 99)},
    ]


def remote_cancel(n: int) -> list[dict[str, Any]]:
    """The ``remote`` lane's ``cancel(id)``: the stop severs our connection, and the gateway's
    cancel route is told too (``POST /v1/requests/{id}/cancel``): cancel → the server received
    that POST (its own clock; a fake gateway in this process)."""
    from abstract_client.testing import FakeOpenAIServer

    told_ms: list[float] = []
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=100_000) as server:
        llm = create_llm("remote", "fake-model", base_url=server.url + "/v1", max_retries=0)
        for i in range(n):
            stream = llm.stream("x", request_id=f"remote-{i}")
            next(iter(stream))
            pressed = time.perf_counter()
            llm.cancel(stream.request_id)
            path = f"/v1/requests/{stream.request_id}/cancel"
            while not server.requests(path):
                time.sleep(0.0002)
            told_ms.append((server.requests(path)[0].received_at - pressed) * 1000)
            stream.close()
        llm.close()
    return [
        {
            "case": "remote cancel(id) → the gateway's cancel route",
            "p50_ms": pct(told_ms, 50),
            "p99_ms": pct(told_ms, 99),
        }
    ]


# -- chunks ---------------------------------------------------------------------------------------


@contextmanager
def prerendered(n_chunks: int) -> Iterator[str]:
    """A server that writes its whole answer, rendered in advance, in one ``sendall`` (its own
    process): the floor it sets is the kernel's copy, not a fake's generation rate."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_prerendered.py")), str(n_chunks)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()


def chunks(n_chunks: int, repeats: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with prerendered(n_chunks) as base:  # .../v1
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": True}
        body["max_tokens"] = n_chunks
        llm = create_llm("openai-compatible", "fake-model", base_url=base, max_retries=0)

        async def raw_httpx() -> int:
            count = 0
            async with httpx.AsyncClient(base_url=base, timeout=None) as client:
                async with client.stream("POST", "/chat/completions", json=body) as resp:
                    async for line in resp.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            json.loads(line[6:])
                            count += 1
            return count

        async def ours() -> int:
            count = 0
            async with llm.astream("x", max_tokens=n_chunks) as stream:
                async for _ in stream:
                    count += 1
            return count

        async def openai_python() -> int:
            from openai import AsyncOpenAI

            count = 0
            async with AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client:
                stream = await client.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=n_chunks
                )
                async for _ in stream:
                    count += 1
            return count

        clients: dict[str, Callable[[], Any]] = {
            "raw httpx aiter_lines + json.loads": raw_httpx,
            "abstract-client astream": ours,
            "openai-python AsyncOpenAI stream": openai_python,
        }
        rates: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(repeats):  # interleaved, so each client sees the same machine state
            for name, fn in clients.items():
                t0 = time.perf_counter()
                count = asyncio.run(fn())
                rates[name].append(count / (time.perf_counter() - t0))
        floor = statistics.median(rates["raw httpx aiter_lines + json.loads"])
        for name, values in rates.items():
            rate = statistics.median(values)
            rows.append({"client": name, "chunks_per_s": round(rate), "vs_raw_httpx": f"{rate / floor:.0%}"})
        llm.close()
    return rows


# -- overhead -------------------------------------------------------------------------------------


def overhead(n: int) -> list[dict[str, Any]]:
    answer = " ".join(f"w{i:03d}" for i in range(205))  # ~1 KB of content
    with SubprocessFake("openai", token_delay=0.0, answer=answer) as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0)

        guarded = timed(lambda: llm.generate("x", signal=AbortController().signal), n, warm=20)
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": False}
        with httpx.Client(base_url=server.base_url, trust_env=False) as plain:  # httpcore's pool: the floor
            pooled = timed(lambda: plain.post("/v1/chat/completions", json=body).json(), n, warm=20)
        llm.close()
    rows = []
    for name, values in (("plain httpx.Client POST (floor)", pooled), ("llm.generate (guarded connection)", guarded)):
        rows.append({"case": name, "n": n, "p50_ms": pct(values, 50), "p99_ms": pct(values, 99)})
    rows.append({"case": "library overhead p50", "n": n, "p50_ms": pct(guarded, 50) - pct(pooled, 50), "p99_ms": ""})
    rows[-1]["p99_ms"] = f"{(pct(guarded, 50) / pct(pooled, 50) - 1):+.1%}"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["waiting", "cancel_id", "remote_cancel", "chunks", "overhead"])
    parser.add_argument("-n", type=int, default=200, help="samples per latency/overhead case")
    parser.add_argument("--calls", type=int, default=1000, help="Event-driven calls in flight")
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict[str, list[dict[str, Any]]] = {}
    if args.only in (None, "waiting"):
        out["waiting"] = waiting(args.calls, args.n)
        if not args.json:
            print_table("Waiting: CPU with Event-driven calls in flight, and their stop latency", out["waiting"])
    if args.only in (None, "cancel_id"):
        out["cancel_id"] = cancel_by_id(args.n)
        if not args.json:
            print_table("cancel(request_id) on a call without a stop source of its own", out["cancel_id"])
    if args.only in (None, "remote_cancel"):
        out["remote_cancel"] = remote_cancel(min(args.n, 50))
        if not args.json:
            print_table("The remote lane's cancel(request_id), told to the gateway", out["remote_cancel"])
    if args.only in (None, "chunks"):
        out["chunks"] = chunks(args.chunks, args.repeats)
        if not args.json:
            print_table(f"Per-chunk cost: one SSE stream of {args.chunks} chunks (median of runs)", out["chunks"])
    if args.only in (None, "overhead"):
        out["overhead"] = overhead(args.n)
        if not args.json:
            print_table("Guard overhead: ~1 KB non-streaming answer", out["overhead"])
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
