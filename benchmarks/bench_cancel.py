#!/usr/bin/env python3
"""Stop → raise latency, server-side stop evidence, and guard overhead. Prints tables.

    python benchmarks/bench_cancel.py                 # fake server lanes (always available)
    python benchmarks/bench_cancel.py --llamacpp      # plus a real llama-server, vs openai-python and httpx
    python benchmarks/bench_cancel.py -n 200 --json

"stop → raise": from ``abort()``/``set()`` in the stopping thread to the moment the caller
holds ``GenerationCancelledError``. "stop → EOF": from the stop to the fake server seeing the
connection close (its own timestamp). For llama-server, "stop → cancel task": until the
server's log shows ``cancel task`` (log polled every 1 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from abstract_client import AbortController, GenerationCancelledError, create_llm
from abstract_client.testing import SubprocessFake


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def row(name: str, values: list[float]) -> dict[str, Any]:
    return {
        "case": name,
        "n": len(values),
        "p50_ms": pct(values, 50),
        "p99_ms": pct(values, 99),
        "max_ms": max(values) if values else float("nan"),
    }


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    cols = list(rows[0])
    widths = [max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(_fmt(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


# -- fake-server lane ---------------------------------------------------------------------------


def fake_cases(n: int) -> list[dict[str, Any]]:
    rows = []
    # The server runs in its own process: in-process, its threads would compete with the client
    # for the GIL and the figures would measure that instead.
    with SubprocessFake("openai", token_delay=0.002) as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0)
        llm.generate("warm", max_tokens=2)

        def measure(stage: str, mode: str) -> tuple[list[float], list[float]]:
            raise_ms: list[float] = []
            eof_ms: list[float] = []
            server.set(prefill_delay=30 if stage == "headers" else 0)

            def record(controller: AbortController, raised: float) -> None:
                assert controller.signal.aborted_at is not None
                raise_ms.append((raised - controller.signal.aborted_at) * 1000)
                eof_ms.append((server.wait_for_disconnect() - controller.signal.aborted_at) * 1000)

            if mode == "sync":
                for _ in range(n):
                    controller = AbortController()
                    threading.Timer(0.02, controller.abort).start()  # the "UI thread" presses Stop
                    try:
                        if stage == "stream":
                            for _c in llm.stream("x", max_tokens=100_000, signal=controller.signal):
                                pass
                        else:
                            llm.generate("x", max_tokens=100_000, signal=controller.signal)
                    except GenerationCancelledError:
                        record(controller, time.perf_counter())
                return raise_ms, eof_ms

            async def run_all() -> None:  # one event loop for the whole series, as in an app
                for _ in range(n):
                    controller = AbortController()
                    threading.Timer(0.02, controller.abort).start()
                    try:
                        if stage == "stream":
                            async with llm.astream("x", max_tokens=100_000, signal=controller.signal) as st:
                                async for _c in st:
                                    pass
                        else:
                            await llm.agenerate("x", max_tokens=100_000, signal=controller.signal)
                    except GenerationCancelledError:
                        raised = time.perf_counter()
                        await asyncio.to_thread(record, controller, raised)

            asyncio.run(run_all())
            return raise_ms, eof_ms

        for stage, label in (
            ("headers", "(a) waiting for headers"),
            ("body", "(b) non-streaming body"),
            ("stream", "(c) mid-stream"),
        ):
            for mode in ("sync", "async"):
                r, e = measure(stage, mode)
                rows.append({**row(f"{label} {mode}", r), "eof_p50_ms": pct(e, 50), "eof_p99_ms": pct(e, 99)})
        server.set(prefill_delay=0)
        rows_overhead = overhead(llm, n)
        llm.close()
    return rows + rows_overhead


def overhead(llm: Any, n: int) -> list[dict[str, Any]]:
    """Guard overhead: a guarded (private connection) call vs a pooled call, same server."""

    def timed(fn: Callable[[], object]) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1000)
        return out

    pooled = timed(lambda: llm.generate("x", max_tokens=1))
    guarded = timed(lambda: llm.generate("x", max_tokens=1, signal=AbortController().signal))
    return [
        {**row("request, pooled (no stop source)", pooled), "eof_p50_ms": "", "eof_p99_ms": ""},
        {**row("request, guarded (private conn.)", guarded), "eof_p50_ms": "", "eof_p99_ms": ""},
    ]


# -- real llama-server ---------------------------------------------------------------------------


def llamacpp_cases(n: int) -> list[dict[str, Any]]:
    from abstract_client.testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        raise SystemExit("llama-server or the model is missing: run scripts/get_llama_server.sh, scripts/get_model.py")
    log = Path("/tmp/abstract-client-bench-llama.log")
    server = LlamaServer.launch(binary, model, log_path=log)
    rows: list[dict[str, Any]] = []
    long_prompt = "Summarise: " + " ".join(f"word{i % 97}" for i in range(2000))
    try:
        for stage in ("stream", "non-stream", "prefill"):
            ours: dict[str, float] = {}
            for client in ("abstract-client", "openai-python", "httpx"):
                raise_ms, cancel_ms = [], []
                for _ in range(n):
                    server.wait_idle(10)
                    before = len(server.cancelled_tasks())
                    prompt = long_prompt if stage == "prefill" else "Write a very long story about a dragon."
                    delay = 0.5 if stage == "prefill" else 0.3
                    stopped_at, raised_at = run_client(client, server.url, prompt, stage != "non-stream", delay)
                    raise_ms.append((raised_at - stopped_at) * 1000)
                    deadline = time.monotonic() + 5
                    while len(server.cancelled_tasks()) <= before and time.monotonic() < deadline:
                        time.sleep(0.001)
                    cancel_ms.append(
                        (time.perf_counter() - stopped_at) * 1000
                        if len(server.cancelled_tasks()) > before
                        else float("nan")
                    )
                r50, c50 = pct(raise_ms, 50), pct(cancel_ms, 50)
                if client == "abstract-client":
                    ours = {"raise": r50, "cancel": c50}
                rows.append(
                    {
                        **row(f"{stage}: {client}", raise_ms),
                        "cancel_task_p50_ms": c50,
                        "cancel_task_p99_ms": pct(cancel_ms, 99),
                        "raise_vs_ours": f"{r50 / ours['raise']:.1f}x" if ours["raise"] else "-",
                        "cancel_vs_ours": f"{c50 / ours['cancel']:.1f}x" if ours["cancel"] else "-",
                    }
                )
    finally:
        server.stop()
    return rows


def run_client(client: str, url: str, prompt: str, stream: bool, delay: float) -> tuple[float, float]:
    """Start one generation, stop it after ``delay``; return (stop time, raise time)."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 2000, "stream": stream}

    async def ours() -> tuple[float, float]:
        llm = create_llm("llamacpp", "m", base_url=url, max_retries=0)
        controller = AbortController()
        asyncio.get_running_loop().call_later(delay, controller.abort)
        try:
            if stream:
                async with llm.astream(prompt, max_tokens=2000, signal=controller.signal) as s:
                    async for _ in s:
                        pass
            else:
                await llm.agenerate(prompt, max_tokens=2000, signal=controller.signal)
        except GenerationCancelledError:
            raised = time.perf_counter()
        await llm.aclose()
        assert controller.signal.aborted_at is not None
        return controller.signal.aborted_at, raised

    async def by_task_cancel(coro_fn: Callable[[], Any]) -> tuple[float, float]:
        task = asyncio.ensure_future(coro_fn())
        await asyncio.sleep(delay)
        stopped = time.perf_counter()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return stopped, time.perf_counter()

    async def openai_python() -> tuple[float, float]:
        import openai

        oc = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)

        async def run() -> None:
            if stream:
                s = await oc.chat.completions.create(model="m", messages=body["messages"], max_tokens=2000, stream=True)
                async for _ in s:
                    pass
            else:
                await oc.chat.completions.create(model="m", messages=body["messages"], max_tokens=2000)

        try:
            return await by_task_cancel(run)
        finally:
            await oc.close()

    async def plain_httpx() -> tuple[float, float]:
        import httpx

        async with httpx.AsyncClient(base_url=url, timeout=None) as hc:

            async def run() -> None:
                async with hc.stream("POST", "/v1/chat/completions", json=body) as resp:
                    async for _ in resp.aiter_bytes():
                        pass

            return await by_task_cancel(run)

    fn = {"abstract-client": ours, "openai-python": openai_python, "httpx": plain_httpx}[client]
    return asyncio.run(fn())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=100, help="stops per case (fake lane)")
    parser.add_argument("--llamacpp", action="store_true", help="also run the real llama-server lane")
    parser.add_argument("--llama-n", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"fake": fake_cases(args.n)}
    if args.llamacpp:
        results["llamacpp"] = llamacpp_cases(args.llama_n)
    if args.json:
        print(json.dumps(results, indent=2, default=str))
        return
    print_table(f"Fake OpenAI server on loopback: stop → raise and stop → server EOF (ms), n={args.n}", results["fake"])
    if "llamacpp" in results:
        print_table(
            f"Real llama-server + SmolLM2-135M: stop → raise and stop → 'cancel task' (ms), n={args.llama_n}",
            results["llamacpp"],
        )


if __name__ == "__main__":
    main()
