"""Stop → raise, sync and async, on every in-process lane and phase: the caller is released at
once and the engine drains behind it (issue #38: the async caller used to wait for the drain).

For each lane (SmolLM2-135M on MLX serial and batched, transformers and gguf; a tiny LLaVA on
the MLX vision lane) and each phase (during the prefill of a ~600-word prompt, in decode), the
stop is pressed from another thread (a UI's Stop button) once the engine's own record shows the
phase; the table gives stop → raise (the caller released: ``generate`` / ``agenerate``
raising) and stop → engine stopped (the worker saw the flag: its own clock) and stop → engine
idle (the drain done), p50/p99.

The floor, printed beside: how long this harness takes to wake a thread blocked on a
``threading.Event`` (sync) and a task awaiting a future woken from another thread (async) — no
library involved. Stop → raise cannot be lower than that.

Usage: python benchmarks/bench_release.py [-n 10] [--lanes mlx,mlx-batched,mlx-vision,transformers,gguf]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tables import pct, print_table

from abstract_client import LLM, AbortController, GenerationCancelledError, create_llm, image_part

os.environ.setdefault("HF_HUB_OFFLINE", "1")
STORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me a long story about a fox and a crow."},
]
LONG = " ".join(f"item{i}" for i in range(600))


def _png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (80, 60), (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def lane(name: str, tmp: Path) -> tuple[LLM, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(llm, decode request, prefill request, options)."""
    from abstract_client.app.assets import smollm2_gguf, smollm2_hf, smollm2_mlx

    long_messages = {"messages": [{"role": "user", "content": LONG}]}
    if name in ("mlx", "mlx-batched"):
        llm = create_llm("mlx", str(smollm2_mlx()), max_batch_size=4 if name == "mlx-batched" else 1)
        return llm, {"messages": STORY}, long_messages, {"max_tokens": 400, "logit_bias": {2: -1e9}}
    if name == "mlx-vision":
        from abstract_client.testing.tiny_vlm import build_tiny_llava

        llm = create_llm("mlx", str(build_tiny_llava(tmp / "llava")), prefill_step_size=16)
        png = _png()

        def look(text: str) -> dict[str, Any]:
            return {"messages": [{"role": "user", "content": [{"type": "text", "text": text}, image_part(png)]}]}

        return (
            llm,
            look("hello"),
            look(" ".join(f"item{i}" for i in range(1500))),
            {
                "max_tokens": 100_000,
                "logit_bias": {1: -1e9},
            },
        )
    if name == "transformers":
        llm = create_llm("transformers", str(smollm2_hf()), prefill_step_size=128)
        return llm, {"messages": STORY}, long_messages, {"max_tokens": 400}
    if name == "gguf":
        llm = create_llm("gguf", str(smollm2_gguf()), n_ctx=8192, n_batch=512)
        return llm, {"messages": STORY}, long_messages, {"max_tokens": 400}
    raise SystemExit(f"unknown lane {name!r}")


def _when(llm: LLM, rid: str, phase: str, fire: Any) -> threading.Thread:
    provider: Any = llm.provider

    def ready() -> bool:
        s = provider.stats(rid)
        if s is None:
            return False
        return s.tokens >= 3 if phase == "decode" else (s.prefill_done > 0 or s.layers_done > 0)

    def run() -> None:
        deadline = time.monotonic() + 120
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.0005)
        fire()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def stop_once(
    llm: LLM, request: dict[str, Any], options: dict[str, Any], phase: str, mode: str, rid: str
) -> tuple[float, float, float]:
    """One stop: (stop → raise, stop → engine stopped, stop → engine idle) in ms."""
    provider: Any = llm.provider
    raised = float("nan")
    if mode == "sync":
        event = StampedEvent()
        _when(llm, rid, phase, event.set)
        try:
            llm.generate(**request, **options, cancel_event=event, request_id=rid)
        except GenerationCancelledError:
            raised = time.perf_counter()
        stopped_at = event.set_at
    else:
        controller = AbortController()

        async def main() -> float:
            try:
                await llm.agenerate(**request, **options, signal=controller.signal, request_id=rid)
            except GenerationCancelledError:
                return time.perf_counter()
            return float("nan")

        _when(llm, rid, phase, controller.abort)
        raised = asyncio.run(main())
        stopped_at = controller.signal.aborted_at or float("nan")
    provider.thread.wait_idle(60)
    idle = time.perf_counter()
    stats = provider.stats(rid)
    engine = stats.stopped_at if stats is not None and stats.stopped_at is not None else float("nan")
    return (raised - stopped_at) * 1000, (engine - stopped_at) * 1000, (idle - stopped_at) * 1000


class StampedEvent(threading.Event):
    """A Stop button's event that remembers when it was pressed."""

    set_at = float("nan")

    def set(self) -> None:
        self.set_at = time.perf_counter()
        super().set()


def floors(n: int) -> list[dict[str, Any]]:
    """The harness's own wake-up latencies (no library)."""
    sync_ms = []
    for _ in range(n):
        event, woke = threading.Event(), []

        def wait(event: threading.Event = event, woke: list[float] = woke) -> None:
            event.wait()
            woke.append(time.perf_counter())

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.01)
        t0 = time.perf_counter()
        event.set()
        waiter.join()
        sync_ms.append((woke[0] - t0) * 1000)

    async def one() -> float:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()

        def fire() -> None:
            time.sleep(0.01)
            loop.call_soon_threadsafe(future.set_result, time.perf_counter())

        threading.Thread(target=fire).start()
        fired = await future
        return (time.perf_counter() - fired) * 1000

    async_ms = [asyncio.run(one()) for _ in range(n)]
    return [
        {"mode": "floor: thread woken by an Event", "p50 ms": pct(sync_ms, 50), "p99 ms": pct(sync_ms, 99)},
        {"mode": "floor: task woken from a thread", "p50 ms": pct(async_ms, 50), "p99 ms": pct(async_ms, 99)},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--lanes", default="mlx,mlx-batched,mlx-vision,transformers,gguf")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.lanes.split(","):
            llm, decode, prefill, options = lane(name, Path(tmp))
            with llm:
                llm.load_model()
                llm.generate(**decode, **{**options, "max_tokens": 2})  # warm
                for phase, request in (("prefill", prefill), ("decode", decode)):
                    for mode in ("sync", "async"):
                        got = [
                            stop_once(llm, request, options, phase, mode, f"{name}-{phase}-{mode}-{i}")
                            for i in range(args.n)
                        ]
                        raise_ms, engine_ms, idle_ms = ([g[k] for g in got] for k in range(3))
                        rows.append(
                            {
                                "lane": name,
                                "phase": phase,
                                "mode": mode,
                                "n": args.n,
                                "stop→raise p50": pct(raise_ms, 50),
                                "p99": pct(raise_ms, 99),
                                "stop→engine stopped p50": pct(engine_ms, 50),
                                "p99 ": pct(engine_ms, 99),
                                "stop→engine idle p50": pct(idle_ms, 50),
                                "p99  ": pct(idle_ms, 99),
                            }
                        )
                        print(rows[-1], file=sys.stderr, flush=True)
    print_table("Stop → raise: the caller released at once, the engine draining behind it (ms)", rows, digits=2)
    print_table("The floor: the harness's own wake-up (ms)", floors(200), digits=3)


if __name__ == "__main__":
    main()
