"""The MLX lane's prompt cache, as a person chatting sees it: time to first token (TTFT) for

* **cold** — a new prompt;
* **after a completion** — the same prompt again (a repeat, or Regenerate after an answer);
* **after a Stop** — Regenerate after pressing Stop two chunks into the answer;
* **next turn after a Stop** — the history plus the partial answer plus a new message;

for both engines (serial ``max_batch_size=1``, batched ``4``), with the prompt cache off
(``prompt_cache_bytes=0``: the serial engine as it was before the cache) and on (the default).
Before this cache existed the batched engine had one for completed answers only: its "before"
is the "on" row for a repeat and the "off" row after a Stop.

Usage: python benchmarks/bench_prompt_cache.py [--prompt-words 150] [--tiny]
(SmolLM2-135M MLX by default; ``--tiny`` a random-weight model, for a quick look.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _tables import print_table

from abstract_client import LLM, GenerationCancelledError, create_llm


def ttft(llm: LLM, messages: list[Any], *, stop_after: int | None = None) -> tuple[float, Any, str]:
    """Seconds to the first chunk; ``(ttft, usage, text)``. With ``stop_after``, Stop is pressed
    after that many chunks (the text is the partial answer)."""
    event = threading.Event()
    t0 = time.perf_counter()
    first = None
    try:
        with llm.stream(messages=messages, max_tokens=24, temperature=0, cancel_event=event) as stream:
            for i, _ in enumerate(stream):
                if first is None:
                    first = time.perf_counter() - t0
                if stop_after is not None and i + 1 == stop_after:
                    event.set()
            result = stream.result()
            return first or float("nan"), result.usage, result.content
    except GenerationCancelledError as err:
        return first or float("nan"), err.usage, err.partial_text


def run(model: str, engine: int, cache_bytes: int, words: int) -> list[dict[str, Any]]:
    story = " ".join(f"The fox number {i} jumped over the fence." for i in range(words // 8))
    first_q = [{"role": "user", "content": f"Here are some notes. {story} Summarise them."}]
    second_q = [{"role": "user", "content": f"Some other notes. {story} What is the last number?"}]
    rows = []
    with create_llm("mlx", model, max_batch_size=engine, prompt_cache_bytes=cache_bytes) as llm:
        llm.load_model()
        label = f"{'serial' if engine == 1 else 'batched'} / cache {'on' if cache_bytes else 'off'}"

        def row(case: str, seconds: float, usage: Any) -> None:
            prompt = usage.prompt_tokens if usage else None
            cached = usage.cached_tokens if usage else None
            rows.append({"engine / cache": label, "case": case, "prompt": prompt, "cached": cached, "ttft_s": seconds})

        seconds, usage, _ = ttft(llm, first_q)
        row("cold", seconds, usage)
        seconds, usage, _ = ttft(llm, first_q)
        row("same prompt after a completion", seconds, usage)
        _, _, partial = ttft(llm, second_q, stop_after=2)  # a new prompt, stopped two chunks in
        seconds, usage, _ = ttft(llm, second_q)
        row("Regenerate after a Stop", seconds, usage)
        _, _, partial = ttft(llm, second_q, stop_after=2)
        turn = [*second_q, {"role": "assistant", "content": partial}, {"role": "user", "content": "Go on."}]
        seconds, usage, _ = ttft(llm, turn)
        row("next turn after a Stop", seconds, usage)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-words", type=int, default=150, help="about 1.3 tokens per word")
    parser.add_argument("--tiny", action="store_true", help="a tiny random-weight model instead of SmolLM2")
    args = parser.parse_args()
    if args.tiny:
        from abstract_client.testing.tiny_mlx import build_tiny_llama

        model = str(build_tiny_llama(Path(tempfile.mkdtemp())))
    else:
        from abstract_client.app.assets import smollm2_mlx

        model = str(smollm2_mlx())
    rows: list[dict[str, Any]] = []
    for engine in (1, 4):
        for cache_bytes in (0, 256 * 2**20):
            rows += run(model, engine, cache_bytes, args.prompt_words)
    print_table(f"Time to first token, {Path(model).name} on MLX ({args.prompt_words}-word notes)", rows, digits=2)


if __name__ == "__main__":
    main()
