"""The mlx lane's vision models: where a stop lands in each phase (vision encode, prefill,
decode), on a small random-weight LLaVA built locally (CLIP tower at 336 px = 576 image tokens).

For each phase, Stop is pressed from another thread at a random moment inside it (the engine
reports its phase); the table prints stop → raise (the caller released) and stop → engine
stopped (the engine thread's own clock), beside the duration of the phase's one uninterruptible
call (one encoder layer of the vision tower; one prefill chunk; one decode step). Then the whole
vision encode with and without the per-layer checks (their cost), and the floor a stop checked
only between tokens would have: mlx-vlm's own loop (default prefill step 2,048) — its time to the
first token, i.e. vision + the whole prefill in one native call.

Usage: python benchmarks/bench_vision.py [-n 15] [--step 32]
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tables import pct, print_table

from abstract_client import LLM, GenerationCancelledError, create_llm, image_part
from abstract_client.testing.tiny_vlm import build_tiny_llava

NO_EOS = {"logit_bias": {1: -1e9}}


def picture() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.radial_gradient("L").convert("RGB").resize((400, 300)).save(buffer, "PNG")
    return buffer.getvalue()


def durations(llm: LLM, png: bytes) -> dict[str, float]:
    """Milliseconds: the whole vision encode with the per-layer stop checks and without them
    (interleaved runs on the engine thread), one encoder layer, one prefill chunk, one decode
    step (from a real request's phase timestamps and tokens/s)."""
    import mlx.core as mx

    from abstract_client.types import GenerationRequest

    provider: Any = llm.provider
    handle = provider.handle
    result = llm.generate(messages=ask(png), max_tokens=32, request_id="durations", **NO_EOS)
    stats = provider.stats("durations")
    started = stats.phase_started
    chunks = -(-(stats.prefill_total - 1) // args.step)

    def encode(checked: bool) -> float:  # on the engine thread: MLX streams are bound to it
        ids, pixels, extra = handle.inputs(GenerationRequest(messages=ask(png), model=None))
        handle.stop_cell.check = (lambda: None) if checked else None
        t0 = time.perf_counter()
        mx.eval(handle.model.get_input_embeddings(mx.array([ids]), pixels, mask=None, **extra).inputs_embeds)
        handle.stop_cell.check = None
        return (time.perf_counter() - t0) * 1000

    on, off = [], []
    for _ in range(3):
        on.append(provider.thread.submit(lambda: encode(True)).result())
        off.append(provider.thread.submit(lambda: encode(False)).result())
    vision_ms = statistics.median(on)
    return {
        "vision total": vision_ms,
        "vision unchecked": statistics.median(off),
        "vision": vision_ms / max(handle.checked_layers, 1),
        "prefill": (started["decode"] - started["prefill"]) * 1000 / chunks,
        "decode": 1000 / result.timings.tokens_per_s if result.timings.tokens_per_s else float("nan"),
        "layers": handle.checked_layers,
    }


def ask(png: bytes) -> list[Any]:
    return [{"role": "user", "content": [image_part(png), {"type": "text", "text": "Describe this picture. " * 8}]}]


def stop_once(
    llm: LLM, png: bytes, phase: str, within_ms: float, rid: str, rng: random.Random
) -> tuple[float, float, str]:
    provider: Any = llm.provider
    event = threading.Event()
    pressed: list[float] = []

    def press() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = provider.stats(rid)
            if stats is not None and stats.phase == phase and (phase != "decode" or stats.tokens >= 3):
                break
            time.sleep(0.0002)
        time.sleep(rng.uniform(0, within_ms / 1000))
        pressed.append(time.perf_counter())
        event.set()

    threading.Thread(target=press, daemon=True).start()
    try:
        for _ in llm.stream(messages=ask(png), max_tokens=100_000, cancel_event=event, request_id=rid, **NO_EOS):
            pass
    except GenerationCancelledError:
        raised = time.perf_counter()
    else:
        raise AssertionError("the generation ended without the stop")
    provider.thread.wait_idle(60)
    stats = provider.stats(rid)
    assert stats is not None and stats.stopped_at is not None
    return (raised - pressed[0]) * 1000, (stats.stopped_at - pressed[0]) * 1000, stats.stopped_in


def mlx_vlm_first_token(llm: LLM, png: bytes) -> float:
    """mlx-vlm's own loop (``generate_step``, which its ``stream_generate`` runs, at its default
    prefill step): milliseconds to the first token — vision + the whole prefill in one
    evaluation, what a stop checked only between tokens waits. (``stream_generate`` itself
    cannot run this model here: its input preparation passes ``padding=`` to transformers 5's
    image processor.)"""
    import mlx.core as mx
    from mlx_vlm.generate import generate_step

    from abstract_client.types import GenerationRequest

    provider: Any = llm.provider
    handle = provider.handle

    def first_token() -> float:  # on the engine thread: MLX streams are bound to their thread
        ids, pixels, _ = handle.inputs(GenerationRequest(messages=ask(png), model=None))
        t0 = time.perf_counter()
        steps = generate_step(mx.array([ids]), handle.model, pixels, None, max_tokens=2)
        next(steps)
        took = (time.perf_counter() - t0) * 1000
        steps.close()
        return took

    return sorted(provider.thread.submit(first_token).result() for _ in range(3))[1]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_llava(
            Path(tmp) / "llava", hidden=256, layers=4, vision_hidden=512, vision_layers=12, image_size=336
        )
        png = picture()
        rng = random.Random(7)
        llm = create_llm("mlx", str(path), prefill_step_size=args.step)
        llm.load_model()
        took = durations(llm, png)
        rows = []
        for phase in ("vision", "prefill", "decode"):
            raise_ms, engine_ms, where = [], [], set()
            for i in range(args.n):
                r, e, stopped_in = stop_once(llm, png, phase, took[phase], f"{phase}-{i}", rng)
                raise_ms.append(r)
                engine_ms.append(e)
                where.add(stopped_in)
            rows.append(
                {
                    "phase": phase,
                    "n": args.n,
                    "uninterruptible call ms": took[phase],
                    "stop→raise p50": pct(raise_ms, 50),
                    "p99": pct(raise_ms, 99),
                    "stop→engine stopped p50": pct(engine_ms, 50),
                    "p99 ": pct(engine_ms, 99),
                    "stopped in": "/".join(sorted(where)),
                }
            )
        floor = mlx_vlm_first_token(llm, png)
        llm.close()
    print_table(
        f"vision lane stop per phase (LLaVA: CLIP 12x512 at 336 px, llama 4x256; prefill step {args.step})", rows, 1
    )
    print(
        f"\nthe vision encode: {took['vision total']:.0f} ms with a stop check before each of its "
        f"{took['layers']} encoder layers, {took['vision unchecked']:.0f} ms as one evaluation (no checks)"
    )
    print(f"mlx-vlm's own loop, time to the first token (vision + whole prefill, one call): {floor:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=15)
    parser.add_argument("--step", type=int, default=32)
    args = parser.parse_args()
    main()
