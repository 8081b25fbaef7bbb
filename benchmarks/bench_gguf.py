"""The gguf lane (SmolLM2-135M-Instruct Q4_1, llama-cpp-python over llama-server's build, CPU):

* Stop → raise (the caller released) and stop → engine idle (the engine thread's own clock), in
  decode and during a ~3,100-token prompt evaluated in ``n_batch=512`` slices, the stop pressed at
  a random moment inside a slice — with the abort callback (the lane as shipped: the stop lands
  inside ``llama_decode``) and without it (the stop waits for the slice in flight) — beside the
  time of one slice.
* Decode tokens/s: the lane (streaming, every token checked and handed out) vs
  ``Llama.create_completion`` directly on the same ``Llama``, greedy, interleaved runs; and the
  lane without the abort callback (what the per-node ``strlen`` costs).

Usage: python benchmarks/bench_gguf.py [-n 30] [--tokens 128] [--runs 25]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tables import print_table, stop_rows

from abstract_client import LLM, GenerationCancelledError, create_llm
from abstract_client.app.assets import smollm2_gguf
from abstract_client.types import GenerationRequest

STORY = [{"role": "user", "content": "Tell me a long story about a fox and a crow."}]
N_BATCH = 512


def long_prompt(tag: str) -> list[dict[str, str]]:
    # a new opening each run: the context's prefix reuse must not skip the prefill being measured
    return [{"role": "user", "content": f"{tag}: " + " ".join(f"item{i}" for i in range(800))}]


def stop_once(llm: LLM, case: str, rid: str, slice_ms: float, rng: random.Random) -> tuple[float, float, int]:
    """``(stop → raise ms, stop → engine idle ms, tokens counted after the flag)``: the consumer
    waits in the stream (as a UI does) while Stop is pressed from another thread."""
    provider: Any = llm.provider
    event = threading.Event()
    raised: list[float] = []
    messages = STORY if case == "decode" else long_prompt(rid)

    def consume() -> None:
        try:
            for _ in llm.stream(
                messages=messages, max_tokens=400, cancel_event=event, request_id=rid, extra={"logit_bias": {"2": -1e9}}
            ):
                pass
        except GenerationCancelledError:
            raised.append(time.perf_counter())

    thread = threading.Thread(target=consume)
    thread.start()
    deadline = time.monotonic() + 60
    if case == "decode":
        while (s := provider.stats(rid)) is None or s.tokens < 5:
            assert time.monotonic() < deadline, "the engine never got there"
            time.sleep(0.001)
    else:  # inside slice 2, at a random point of it
        while (s := provider.stats(rid)) is None or s.prefill_done < (s.cached_tokens or 0) + N_BATCH:
            assert time.monotonic() < deadline, "the engine never got there"
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.05, 0.9) * slice_ms / 1000)
    stopped = time.perf_counter()
    event.set()
    thread.join(60)
    assert provider.thread.wait_idle(60) and raised
    stats = provider.stats(rid)
    assert case == "decode" or stats.stopped_in == "prefill", stats
    idle_at = stats.stopped_at if stats.stopped_at is not None else float("nan")
    return (raised[0] - stopped) * 1000, (idle_at - stopped) * 1000, stats.tokens - (stats.tokens_at_stop or 0)


def stops(llm: LLM, n: int, label: str, slice_ms: float) -> list[dict[str, Any]]:
    rng = random.Random(1)
    return stop_rows(label, n, lambda case, rid: stop_once(llm, case, rid, slice_ms, rng))


def slice_time(llm: LLM) -> float:
    """One 512-token slice's evaluation, ms (median of 5, each from an empty context)."""
    provider: Any = llm.provider
    handle = provider.handle
    ids = list(range(1000, 1000 + N_BATCH))

    def once() -> float:
        handle.llm.n_tokens = 0
        handle.llm._ctx.kv_cache_seq_rm(-1, 0, -1)  # an empty context each time
        t0 = time.perf_counter()
        handle.decode(ids)
        return (time.perf_counter() - t0) * 1000

    return statistics.median(provider.thread.submit(once).result() for _ in range(5))


def throughput(model: str, tokens: int, runs: int) -> list[dict[str, Any]]:
    bias = {"2": -1e9}  # no EOS: every run decodes exactly `tokens`
    with create_llm("gguf", model) as llm, create_llm("gguf", model, abort_callback=False) as bare:
        llm.load_model()
        bare.load_model()
        provider: Any = llm.provider
        request = GenerationRequest(messages=STORY, model=None)  # type: ignore[arg-type]
        ids = provider.thread.submit(lambda: provider.handle.prompt_ids(request)).result()

        def direct() -> float:
            """Decode tokens/s of ``create_completion``: a full run minus a 1-token run."""
            engine = provider.handle.llm
            engine.reset()
            t0 = time.perf_counter()
            engine.create_completion(ids, max_tokens=1, temperature=0.0, logit_bias={2: -1e9})
            t1 = time.perf_counter()
            engine.reset()
            out = engine.create_completion(ids, max_tokens=tokens, temperature=0.0, logit_bias={2: -1e9})
            t2 = time.perf_counter()
            engine.reset()
            return float(out["usage"]["completion_tokens"] - 1) / ((t2 - t1) - (t1 - t0))

        def ours(client: LLM) -> float:
            p: Any = client.provider
            p.thread.submit(lambda: p.handle.llm.reset()).result()  # no prefix reuse: the same work
            result = client.generate(messages=STORY, max_tokens=tokens, temperature=0, extra={"logit_bias": bias})
            assert result.timings.tokens_per_s is not None and result.usage is not None
            assert result.usage.completion_tokens == tokens
            return result.timings.tokens_per_s

        names = ("Llama.create_completion directly", "abstract-client stream", "  ... without the abort callback")
        rates: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(runs):  # interleaved: all see the same machine state
            rates[names[0]].append(provider.thread.submit(direct).result())
            rates[names[1]].append(ours(llm))
            rates[names[2]].append(ours(bare))
    floor = statistics.median(rates[names[0]])
    return [
        {
            "decode": name,
            "tokens": tokens,
            "tokens_per_s": statistics.median(v),
            "vs create_completion": f"{statistics.median(v) / floor:.1%}",
        }
        for name, v in rates.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=25)  # short runs scatter by ±5 % on a shared machine
    args = parser.parse_args()
    model = str(smollm2_gguf())
    rows = []
    for label, abort in (("with the abort callback", True), ("between slices only", False)):
        with create_llm("gguf", model, n_ctx=8192, n_batch=N_BATCH, abort_callback=abort) as llm:
            llm.load_model()
            one_slice = slice_time(llm)
            rows += stops(llm, args.n, label, one_slice)
    print_table("Stop on the gguf lane (ms)", rows, digits=1)
    print(f"\none {N_BATCH}-token prompt slice (one llama_decode): {one_slice:.0f} ms")
    print_table("Decode throughput, greedy", throughput(model, args.tokens, args.runs), digits=1)


if __name__ == "__main__":
    main()
