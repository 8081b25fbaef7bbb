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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from abstract_client import AbortController, GenerationCancelledError, create_llm
from abstract_client.testing import SubprocessFake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import pct, print_table, timed


def row(name: str, values: list[float]) -> dict[str, Any]:
    return {
        "case": name,
        "n": len(values),
        "p50_ms": pct(values, 50),
        "p99_ms": pct(values, 99),
        "max_ms": max(values) if values else float("nan"),
    }


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
    """One whole request without and with a stop source of its own. Every generation now runs on
    a guarded private connection either way; ``bench_perf.py --only overhead`` compares the guard
    with the pooled client."""

    plain = timed(lambda: llm.generate("x", max_tokens=1), n)
    with_signal = timed(lambda: llm.generate("x", max_tokens=1, signal=AbortController().signal), n)
    return [
        {**row("request, no stop source", plain), "eof_p50_ms": "", "eof_p99_ms": ""},
        {**row("request, with an AbortSignal", with_signal), "eof_p50_ms": "", "eof_p99_ms": ""},
    ]


# -- real llama-server ---------------------------------------------------------------------------


def llamacpp_cases(n: int) -> list[dict[str, Any]]:
    """Real llama-server: our stop vs openai-python and plain httpx, side by side in one run.

    Each client runs its whole series on one event loop with one client object (as an app
    would). Async clients are stopped from their loop (``abort()`` for us, ``task.cancel()`` for
    all, ours included); the sync openai-python stream is closed from another thread, which is
    all it offers — a read blocked in prefill does not wake until the next byte arrives.
    """
    from abstract_client.testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        raise SystemExit("llama-server or the model is missing: run scripts/get_llama_server.sh, scripts/get_model.py")
    server = LlamaServer.launch(binary, model, log_path=Path("/tmp/abstract-client-bench-llama.log"))
    long_prompt = "Summarise: " + " ".join(f"word{i % 97}" for i in range(2000))
    clients = (
        "abstract-client abort()",
        "abstract-client task.cancel()",
        "openai-python task.cancel()",
        "httpx task.cancel()",
        "openai-python sync stream.close()",
    )
    rows: list[dict[str, Any]] = []
    try:
        for stage in ("stream", "non-stream", "prefill"):
            prompt = long_prompt if stage == "prefill" else "Write a very long story about a dragon."
            delay = 0.5 if stage == "prefill" else 0.3
            ours: dict[str, float] = {}
            for client in clients:
                if client.endswith("stream.close()") and stage == "non-stream":
                    continue  # a sync non-streaming openai-python call has no way to be stopped
                raise_ms, cancel_ms = run_series(client, server, prompt, stage != "non-stream", delay, n)
                r50, c50 = pct(raise_ms, 50), pct(cancel_ms, 50)
                if not ours:
                    ours = {"raise": r50, "cancel": c50}
                rows.append(
                    {
                        **row(f"{stage}: {client}", raise_ms),
                        "cancel_task_p50_ms": c50,
                        "cancel_task_p99_ms": pct(cancel_ms, 99),
                        "raise_vs_ours": f"{r50 / ours['raise']:.1f}x",
                        "cancel_vs_ours": f"{c50 / ours['cancel']:.1f}x",
                    }
                )
    finally:
        server.stop()
    return rows


def run_series(
    client: str, server: Any, prompt: str, stream: bool, delay: float, n: int
) -> tuple[list[float], list[float]]:
    """``n`` generations stopped after ``delay`` s; stop → raise and stop → 'cancel task' (ms)."""
    raise_ms: list[float] = []
    cancel_ms: list[float] = []
    messages = [{"role": "user", "content": prompt}]

    def cancel_seen(before: int, stopped: float) -> None:
        deadline = time.monotonic() + 5
        while len(server.cancelled_tasks()) <= before and time.monotonic() < deadline:
            time.sleep(0.001)
        seen = len(server.cancelled_tasks()) > before
        cancel_ms.append((time.perf_counter() - stopped) * 1000 if seen else float("nan"))

    if client == "openai-python sync stream.close()":
        import openai

        oc = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        for _ in range(n):
            server.wait_idle(10)
            before = len(server.cancelled_tasks())
            s = oc.chat.completions.create(model="m", messages=messages, max_tokens=2000, stream=True)  # type: ignore[arg-type]
            stopped_at: list[float] = []

            def close(s: Any = s, stopped_at: list[float] = stopped_at) -> None:
                stopped_at.append(time.perf_counter())
                s.close()

            threading.Timer(delay, close).start()
            try:
                for _c in s:
                    pass
            except Exception:
                pass
            raise_ms.append((time.perf_counter() - stopped_at[0]) * 1000)
            cancel_seen(before, stopped_at[0])
        oc.close()
        return raise_ms, cancel_ms

    async def series() -> None:
        import httpx
        import openai

        llm = create_llm("llamacpp", "m", base_url=server.url, max_retries=0)
        oc = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        hc = httpx.AsyncClient(base_url=server.url, timeout=None)
        body = {"model": "m", "messages": messages, "max_tokens": 2000, "stream": stream}

        async def ours(signal: Any = None) -> None:
            if stream:
                async with llm.astream(prompt, max_tokens=2000, signal=signal) as st:
                    async for _ in st:
                        pass
            else:
                await llm.agenerate(prompt, max_tokens=2000, signal=signal)

        async def theirs() -> None:
            if stream:
                st = await oc.chat.completions.create(
                    model="m",
                    messages=messages,
                    max_tokens=2000,  # type: ignore[arg-type]
                    stream=True,
                )
                async for _ in st:
                    pass
            else:
                await oc.chat.completions.create(model="m", messages=messages, max_tokens=2000)  # type: ignore[arg-type]

        async def plain() -> None:
            async with hc.stream("POST", "/v1/chat/completions", json=body) as resp:
                async for _ in resp.aiter_bytes():
                    pass

        for _ in range(n):
            await asyncio.to_thread(server.wait_idle, 10)
            before = len(server.cancelled_tasks())
            if client == "abstract-client abort()":
                controller = AbortController()
                asyncio.get_running_loop().call_later(delay, controller.abort)
                try:
                    await ours(controller.signal)
                except GenerationCancelledError:
                    raised = time.perf_counter()
                assert controller.signal.aborted_at is not None
                stopped = controller.signal.aborted_at
            else:
                fn = {
                    "abstract-client task.cancel()": ours,
                    "openai-python task.cancel()": theirs,
                    "httpx task.cancel()": plain,
                }[client]
                task = asyncio.ensure_future(fn())
                await asyncio.sleep(delay)
                stopped = time.perf_counter()
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                raised = time.perf_counter()
            raise_ms.append((raised - stopped) * 1000)
            await asyncio.to_thread(cancel_seen, before, stopped)
        await llm.aclose()
        await oc.close()
        await hc.aclose()

    asyncio.run(series())
    return raise_ms, cancel_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=100, help="stops per case (fake lane)")
    parser.add_argument("--llamacpp", action="store_true", help="also run the real llama-server lane")
    parser.add_argument("--llama-n", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"fake": fake_cases(args.n)}
    if not args.json:  # print as soon as a table is ready: the real-server lane takes minutes
        print_table(
            f"Fake OpenAI server on loopback: stop → raise and stop → server EOF (ms), n={args.n}", results["fake"]
        )
        sys.stdout.flush()
    if args.llamacpp:
        results["llamacpp"] = llamacpp_cases(args.llama_n)
        if not args.json:
            print_table(
                f"Real llama-server + SmolLM2-135M: stop → raise and stop → 'cancel task' (ms), n={args.llama_n}",
                results["llamacpp"],
            )
    if args.json:
        print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
