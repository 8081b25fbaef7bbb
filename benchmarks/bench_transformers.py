"""The transformers lane (SmolLM2-135M-Instruct, torch on the CPU):

* Stop → raise (the caller released) and stop → engine idle (the engine thread's own clock), in
  decode and during a ~2,400-token prompt — with the layer hooks (the lane as shipped) and
  without them (the stop then waits for the prefill chunk in flight), beside the time of one
  chunk and of the whole prefill.
* Decode tokens/s: the lane (streaming, every token checked and handed out) vs calling
  ``model.generate()`` directly on the same weights, greedy, interleaved runs.

Usage: python benchmarks/bench_transformers.py [-n 20] [--tokens 64]
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

from _tables import print_table, stop_rows

from abstract_client import LLM, GenerationCancelledError, create_llm
from abstract_client.app.assets import smollm2_hf
from abstract_client.types import GenerationRequest

STORY = [{"role": "user", "content": "Tell me a long story about a fox and a crow."}]
LONG = [{"role": "user", "content": " ".join(f"item{i}" for i in range(600))}]  # ~2,600 tokens


def stop_once(llm: LLM, case: str, rid: str) -> tuple[float, float, float]:
    """``(stop → raise ms, stop → engine idle ms, tokens counted after the flag)``: the consumer
    waits in the stream (as a UI does) while Stop is pressed from another thread."""
    provider: Any = llm.provider
    event = threading.Event()
    raised: list[float] = []
    messages = STORY if case == "decode" else LONG

    def consume() -> None:
        try:
            for _ in llm.stream(messages=messages, max_tokens=400, cancel_event=event, request_id=rid):
                pass
        except GenerationCancelledError:
            raised.append(time.perf_counter())

    thread = threading.Thread(target=consume)
    thread.start()
    deadline = time.monotonic() + 60
    while (s := provider.stats(rid)) is None or (s.tokens < 5 if case == "decode" else s.prefill_done < 256):
        assert time.monotonic() < deadline, "the engine never got there"
        time.sleep(0.001)
    stopped = time.perf_counter()
    event.set()
    thread.join(60)
    assert provider.thread.wait_idle(60) and raised
    stats = provider.stats(rid)
    idle_at = stats.stopped_at if stats.stopped_at is not None else float("nan")
    return (raised[0] - stopped) * 1000, (idle_at - stopped) * 1000, stats.tokens - (stats.tokens_at_stop or 0)


def stops(llm: LLM, n: int, label: str) -> list[dict[str, Any]]:
    return stop_rows(label, n, lambda case, rid: stop_once(llm, case, rid))


def throughput(llm: LLM, tokens: int, runs: int) -> list[dict[str, Any]]:
    import torch

    provider: Any = llm.provider
    request = GenerationRequest(messages=STORY, model=None)  # type: ignore[arg-type]
    ids = provider.thread.submit(lambda: provider.handle.prompt_ids(request)).result()

    def direct() -> float:
        """Decode tokens/s of ``generate()``: a full run minus a prefill-and-first-token run."""
        model = provider.handle.model
        prompt = torch.tensor([ids])
        with torch.inference_mode():
            t0 = time.perf_counter()
            model.generate(prompt, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            t1 = time.perf_counter()
            out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
            t2 = time.perf_counter()
        return (out.shape[1] - len(ids) - 1) / ((t2 - t1) - (t1 - t0))

    def ours() -> float:
        result = llm.generate(messages=STORY, max_tokens=tokens, temperature=0, extra={"logit_bias": {"2": -1e9}})
        assert result.timings.tokens_per_s is not None and result.usage is not None
        return result.timings.tokens_per_s

    rates: dict[str, list[float]] = {"model.generate() directly": [], "abstract-client stream": []}
    for _ in range(runs):  # interleaved: both see the same machine state
        rates["model.generate() directly"].append(provider.thread.submit(direct).result())
        rates["abstract-client stream"].append(ours())
    floor = statistics.median(rates["model.generate() directly"])
    return [
        {
            "decode": name,
            "tokens": tokens,
            "tokens_per_s": statistics.median(v),
            "vs generate()": f"{statistics.median(v) / floor:.1%}",
        }
        for name, v in rates.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    model = str(smollm2_hf())
    with create_llm("transformers", model, prefill_step_size=128) as llm:
        llm.load_model()
        provider: Any = llm.provider
        t0 = time.perf_counter()
        long_answer = llm.generate(messages=LONG, max_tokens=1)
        full_prefill = (time.perf_counter() - t0) * 1000
        chunks = -(-(long_answer.usage.prompt_tokens or 0) // 128)
        rows = stops(llm, args.n, "with layer hooks")
        hooks = [h for layer in provider.handle.model.model.layers for h in list(layer._forward_pre_hooks)]
        for layer in provider.handle.model.model.layers:
            layer._forward_pre_hooks.clear()  # the stop now lands between passes only
        rows += stops(llm, args.n, "between passes only")
        assert hooks
        print_table("Stop on the transformers lane (ms)", rows, digits=1)
        print(
            f"\nthe whole prefill ({long_answer.usage.prompt_tokens} tokens): {full_prefill:.0f} ms; "
            f"one 128-token chunk: ~{full_prefill / chunks:.0f} ms on average"
        )
    with create_llm("transformers", model) as llm:
        llm.load_model()
        print_table("Decode throughput, greedy", throughput(llm, args.tokens, args.runs), digits=1)


if __name__ == "__main__":
    main()
