#!/usr/bin/env python3
"""Soak: thousands of random stops, then prove nothing leaked and nothing was lost.

    python benchmarks/soak.py                  # 10,000 stops + 1,000 concurrent streams (~5-10 min)
    python benchmarks/soak.py --stops 1000     # what CI runs (tests/test_soak.py)

Each generation (sync or async, streaming or not) is stopped at a random moment: before it
starts (pre-set), while waiting for headers, mid-stream, racing completion, or during a retry
backoff. The fake server runs in its own process and counts every request it received.
Afterwards: open fds, threads, ESTABLISHED/CLOSE_WAIT sockets and in-flight entries are back to
baseline; the pooled client still serves; zero stops were retried; zero stopped generations came
back as complete; every stop raised exactly one typed error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from abstract_client import (
    LLM,
    AbortController,
    AbortSignal,
    GenerationCancelledError,
    create_llm,
)
from abstract_client.testing import SubprocessFake

MOMENTS = ("preset", "headers", "mid_stream", "racing_completion", "retry_backoff")


@dataclass
class SoakReport:
    stops: int = 0
    cancelled: int = 0
    completed_before_stop: int = 0
    by_moment: Counter[str] = field(default_factory=Counter)
    cancelled_by_moment: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    requests_sent: int = 0
    requests_seen_by_server: int = 0
    baseline: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    pooled_client_ok: bool = False
    seconds: float = 0.0


def resources() -> dict[str, int]:
    proc = psutil.Process()
    conns = proc.net_connections(kind="tcp")
    return {
        "fds": proc.num_fds(),
        "threads": threading.active_count(),
        "established": sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED),
        "close_wait": sum(1 for c in conns if c.status == psutil.CONN_CLOSE_WAIT),
    }


def _one(
    llm: LLM, server: SubprocessFake, rng: random.Random, i: int, loop: asyncio.AbstractEventLoop, report: SoakReport
) -> None:
    moment = MOMENTS[i % len(MOMENTS)]
    mode = ("sync", "async")[(i // len(MOMENTS)) % 2]
    streaming = (i // (2 * len(MOMENTS))) % 2 == 0
    max_tokens = rng.randint(3, 12)
    controller = AbortController()
    expect_request = True
    if moment == "preset":
        controller.abort()
        expect_request = False
    elif moment == "headers":
        server.set(prefill_delay=0.05)
        threading.Timer(rng.uniform(0.005, 0.03), controller.abort).start()
    elif moment == "mid_stream":
        threading.Timer(rng.uniform(0.005, 0.02), controller.abort).start()
    elif moment == "racing_completion":
        # the answer takes ~max_tokens * 2 ms: stop right around its end
        threading.Timer(rng.uniform(0.8, 1.2) * max_tokens * 0.002, controller.abort).start()
    else:  # retry_backoff: a 503 with Retry-After, and the stop lands during the wait
        server.inject("loading_503")
        threading.Timer(rng.uniform(0.01, 0.05), controller.abort).start()
    report.requests_sent += int(expect_request)
    report.by_moment[moment] += 1
    report.stops += 1
    errors: list[BaseException] = []
    completed_at: float | None = None
    try:
        if mode == "sync":
            if streaming:
                stream = llm.stream("x", max_tokens=max_tokens, signal=controller.signal)
                for _ in stream:
                    pass
                completed_at = stream.result().completed_at
            else:
                completed_at = llm.generate("x", max_tokens=max_tokens, signal=controller.signal).completed_at
        else:

            async def go() -> float | None:
                if streaming:
                    async with llm.astream("x", max_tokens=max_tokens, signal=controller.signal) as s:
                        async for _ in s:
                            pass
                    return s.result().completed_at
                return (await llm.agenerate("x", max_tokens=max_tokens, signal=controller.signal)).completed_at

            completed_at = asyncio.run_coroutine_threadsafe(go(), loop).result()
    except GenerationCancelledError as err:
        errors.append(err)
    except Exception as err:
        errors.append(err)
    if moment == "headers":
        server.set(prefill_delay=0.0)
    if not errors:
        report.completed_before_stop += 1
        # Rule 7, judged exactly: the result says when it was judged complete, the signal says
        # when it aborted (its flag goes up before that time is taken). An abort before the
        # judgement must have won; no timing slack.
        deadline = time.monotonic() + 2
        while controller.signal.aborted_at is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        aborted = controller.signal.aborted_at
        if completed_at is None:
            report.violations.append(f"#{i} {moment}/{mode}: a complete result without completed_at")
        elif aborted is not None and aborted < completed_at:
            report.violations.append(f"#{i} {moment}/{mode}: judged complete {completed_at - aborted:.6f}s after stop")
    elif len(errors) != 1 or not isinstance(errors[0], GenerationCancelledError):
        report.violations.append(f"#{i} {moment}/{mode}: raised {[type(e).__name__ for e in errors]}")
    else:
        report.cancelled += 1
        report.cancelled_by_moment[moment] += 1


def soak(stops: int, seed: int = 1) -> SoakReport:
    rng = random.Random(seed)
    report = SoakReport()
    t0 = time.monotonic()
    with SubprocessFake("openai", token_delay=0.002) as server:
        loop = asyncio.new_event_loop()
        loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
        loop_thread.start()
        server.set(retry_after=1.0)  # injected 503s say "come back in 1 s": the stop lands in that backoff
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=3)
        llm.generate("warm up", max_tokens=2)
        asyncio.run_coroutine_threadsafe(llm.agenerate("warm up", max_tokens=2), loop).result()
        time.sleep(0.2)
        base_requests = len(server.records())
        report.baseline = resources()
        for i in range(stops):
            _one(llm, server, rng, i, loop, report)
        time.sleep(0.5)  # let the last severed sockets finish closing
        report.requests_seen_by_server = len(server.records()) - base_requests
        report.after = resources()
        report.pooled_client_ok = llm.generate("still there?", max_tokens=3).content == "tok0 tok1 tok2 "
        if llm.in_flight:
            report.violations.append(f"in-flight registry not empty: {llm.in_flight}")
        llm.close()
        loop.call_soon_threadsafe(loop.stop)
    report.seconds = time.monotonic() - t0
    return report


@dataclass
class ConcurrencyReport:
    streams: int = 0
    stopped: int = 0
    completed: int = 0
    other_errors: list[str] = field(default_factory=list)
    threads_before: int = 0
    threads_peak: int = 0
    fds_before: int = 0
    fds_after: int = 0
    established_after: int = 0
    seconds: float = 0.0


async def concurrent_streams(n: int = 1000, seed: int = 2) -> ConcurrencyReport:
    rng = random.Random(seed)
    report = ConcurrencyReport(streams=n)
    t0 = time.monotonic()
    with SubprocessFake("openai", token_delay=0.02) as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0)
        await llm.agenerate("warm", max_tokens=1)
        report.threads_before = threading.active_count()
        report.fds_before = psutil.Process().num_fds()
        peak = report.threads_before

        async def one(i: int) -> None:
            controller = AbortController()
            stop_after = rng.randint(0, 15) if i % 2 == 0 else None
            signal: AbortSignal = controller.signal
            try:
                async with llm.astream("x", max_tokens=20, signal=signal) as stream:
                    k = 0
                    async for _ in stream:
                        if k == stop_after:
                            controller.abort()
                        k += 1
                report.completed += 1
            except GenerationCancelledError:
                report.stopped += 1
            except Exception as err:
                report.other_errors.append(f"{type(err).__name__}: {err}")

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        while not all(t.done() for t in tasks):
            peak = max(peak, threading.active_count())
            await asyncio.sleep(0.01)
        report.threads_peak = peak
        await llm.aclose()
        await asyncio.sleep(0.5)
        report.fds_after = psutil.Process().num_fds()
        report.established_after = sum(
            1 for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_ESTABLISHED
        )
    report.seconds = time.monotonic() - t0
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stops", type=int, default=10_000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    soak_report = soak(args.stops)
    conc = asyncio.run(concurrent_streams(args.streams))
    if args.json:
        print(json.dumps({"soak": asdict(soak_report), "concurrent": asdict(conc)}, indent=2, default=str))
        return
    r = soak_report
    print(f"Soak: {r.stops} stops in {r.seconds:.0f} s ({dict(r.by_moment)})")
    print(
        f"  raised GenerationCancelledError: {r.cancelled}; finished before the stop landed: "
        f"{r.completed_before_stop}; violations: {len(r.violations)} {r.violations[:5]}"
    )
    print(
        f"  requests sent {r.requests_sent}, seen by the server {r.requests_seen_by_server} "
        f"(a retried stop would make the server see more than was sent: "
        f"{max(0, r.requests_seen_by_server - r.requests_sent)})"
    )
    print(f"  resources before {r.baseline} after {r.after}; pooled client still serves: {r.pooled_client_ok}")
    print(
        f"Concurrency: {conc.streams} async streams, {conc.stopped} stopped, {conc.completed} completed, "
        f"other errors {len(conc.other_errors)}; threads {conc.threads_before} → peak {conc.threads_peak}; "
        f"fds {conc.fds_before} → {conc.fds_after}; ESTABLISHED after {conc.established_after}; "
        f"{conc.seconds:.1f} s"
    )
    os._exit(0)


if __name__ == "__main__":
    main()
