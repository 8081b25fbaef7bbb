"""The MLX lane's continuous batching (real mlx-lm ``BatchGenerator``; a tiny random Llama for
speed, SmolLM2 for one real case). The stop is proven by the MLX side's own per-request counter
(``RequestStats``): what it sampled, where it saw the flag."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from abstract_client import LLM, GenerateResult, GenerationCancelledError, create_llm

from .helpers import require_module, wait_until

mx = require_module("mlx.core", "mlx")
from abstract_client.providers.mlx import MLXProvider  # noqa: E402

NO_EOS = {"logit_bias": {1: -1e9}}  # only for the serial reference runs (the tiny model's EOS id)
PROMPTS = ["hello world", "the quick brown fox", "one two three four five six", "abc"]


@pytest.fixture
def batched(tiny_dir: Path) -> Iterator[LLM]:
    llm = create_llm("mlx", str(tiny_dir), max_batch_size=8, prefill_step_size=16)
    yield llm
    llm.close()


def provider(llm: LLM) -> MLXProvider:
    assert isinstance(llm.provider, MLXProvider) and llm.provider.batch is not None
    return llm.provider


def in_threads(fns: list[Any]) -> list[Any]:
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_four_concurrent_greedy_requests_equal_each_run_alone(tiny_dir: Path, batched: LLM) -> None:
    with create_llm("mlx", str(tiny_dir)) as serial:
        alone = [serial.generate(p, max_tokens=40).content for p in PROMPTS]
    together = in_threads([lambda p=p: batched.generate(p, max_tokens=40).content for p in PROMPTS])
    assert together == alone
    assert all(len(t) > 0 for t in together)


def test_stop_one_of_four_mid_decode(batched: LLM) -> None:
    p = provider(batched)
    stop = threading.Event()
    at_flag: dict[str, int] = {}

    def stopper() -> None:
        assert wait_until(lambda: (p.stats("d0") or p.stats("d1")) is not None and (p.stats("d0").tokens >= 20), 60)  # type: ignore[union-attr]
        at_flag["d0"] = p.stats("d0").tokens  # type: ignore[union-attr]
        stop.set()

    watcher = threading.Thread(target=stopper)
    watcher.start()
    results = in_threads(
        [
            lambda i=i: batched.generate(
                PROMPTS[i], max_tokens=300, request_id=f"d{i}", cancel_event=stop if i == 0 else None
            )
            for i in range(4)
        ]
    )
    watcher.join()
    assert isinstance(results[0], GenerationCancelledError) and results[0].partial_text
    assert p.thread.wait_idle(10)
    stats = p.stats("d0")
    assert stats is not None and stats.stopped_in == "decode" and not stats.finished
    # nothing counted once the worker saw the flag; and it saw it within a step or two of the
    # test reading the counter and setting the flag (two statements apart on a loaded machine)
    assert stats.tokens_at_stop == stats.tokens
    assert stats.tokens_at_stop is not None and stats.tokens_at_stop - at_flag["d0"] <= 2
    for i in (1, 2, 3):
        result = results[i]
        assert isinstance(result, GenerateResult), result
        assert p.stats(f"d{i}").finished  # type: ignore[union-attr]
        assert result.usage is not None and result.usage.completion_tokens == p.stats(f"d{i}").tokens  # type: ignore[union-attr]


def test_stop_one_during_its_prefill(batched: LLM) -> None:
    p = provider(batched)
    stop = threading.Event()
    # ~4,000 tokens in 16-token chunks: ~250 batch steps of prefill, polled every 0.5 ms
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 300)

    def stopper() -> None:
        assert wait_until(lambda: p.stats("pf") is not None and p.stats("pf").prefill_done > 0, 60, interval=0.0005)  # type: ignore[union-attr]
        stop.set()

    watcher = threading.Thread(target=stopper)
    watcher.start()
    results = in_threads(
        [lambda: batched.generate(long_prompt, max_tokens=50, request_id="pf", cancel_event=stop)]
        + [lambda i=i: batched.generate(PROMPTS[i], max_tokens=60) for i in (1, 2, 3)]
    )
    watcher.join()
    assert isinstance(results[0], GenerationCancelledError)
    assert p.thread.wait_idle(10)
    stats = p.stats("pf")
    assert stats is not None and stats.stopped_in == "prefill" and stats.tokens == 0
    assert stats.prefill_done < stats.prefill_total
    assert all(isinstance(r, GenerateResult) and r.content for r in results[1:])


def test_eject_under_a_batch_of_four(tiny_dir: Path) -> None:
    with create_llm("mlx", str(tiny_dir), max_batch_size=8) as llm:
        p = provider(llm)
        llm.generate("warm", max_tokens=2)
        report_box: dict[str, Any] = {}

        def eject() -> None:
            assert wait_until(
                lambda: all(p.stats(f"e{i}") is not None and p.stats(f"e{i}").tokens > 3 for i in range(4)), 60
            )  # type: ignore[union-attr]
            report_box["report"] = llm.unload_model()

        ejector = threading.Thread(target=eject)
        ejector.start()
        results = in_threads(
            [lambda i=i: llm.generate(PROMPTS[i], max_tokens=5000, request_id=f"e{i}") for i in range(4)]
        )
        ejector.join(60)
        assert all(isinstance(r, GenerationCancelledError) and r.reason == "model_eject" for r in results), results
        report = report_box["report"]
        assert report.stopped_requests == 4
        baseline = report.extra["memory_baseline"]
        assert report.memory_before > baseline and report.memory_after <= baseline + 64 * 1024
        assert p.batch._generator is None and len(p.handle.prompt_cache) == 0  # type: ignore[union-attr]
        assert not p.loaded
        assert llm.generate("again", max_tokens=4).content  # the next call reloads
        assert p.loaded


def test_a_seeded_sampling_request_runs_alone_and_is_reproducible(batched: LLM) -> None:
    def sampled() -> str:
        return batched.generate("seeded", max_tokens=30, temperature=1.0, seed=1234).content

    first = sampled()
    results = in_threads([sampled, *[lambda p=p: batched.generate(p, max_tokens=30).content for p in PROMPTS]])
    assert results[0] == first  # the batch did not change the seeded answer
    assert all(isinstance(r, str) and r for r in results)


def test_smollm2_two_concurrent_greedy_answers_equal_alone() -> None:
    from abstract_client.app.assets import smollm2_mlx

    question = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    other = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name a colour."},
    ]
    with create_llm("mlx", str(smollm2_mlx())) as serial:
        alone = [serial.generate(messages=m, max_tokens=12).content for m in (question, other)]  # type: ignore[arg-type]
    with create_llm("mlx", str(smollm2_mlx()), max_batch_size=4) as llm:
        t0 = time.perf_counter()
        together = in_threads([lambda m=m: llm.generate(messages=m, max_tokens=12).content for m in (question, other)])  # type: ignore[misc]
        assert together == alone and "Paris" in together[0]
        assert time.perf_counter() - t0 < 120
