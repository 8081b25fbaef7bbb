"""The MLX lane's prompt cache on REAL mlx-lm, for both engines (serial and batched): a repeat, a
Regenerate after a Stop (in decode and in prefill) and the next turn after a Stop start from the
KV already computed — and answer exactly what a cold engine answers. The evidence is the
engine's own: ``usage.cached_tokens``, the prompt cache's ``last_kept`` (how many tokens the KV
it stored holds) and the per-request counters of what was sampled and prefilled."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from abstract_client import LLM, GenerationCancelledError, create_llm

from .helpers import require_module, wait_until

mx = require_module("mlx.core", "mlx")
from abstract_client.providers._mlx.prompt_cache import PromptCache  # noqa: E402
from abstract_client.providers.mlx import MLXProvider  # noqa: E402

ENGINES = [pytest.param(1, id="serial"), pytest.param(4, id="batched")]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def llm(tiny_dir: Path, engine: int) -> Iterator[LLM]:
    client = create_llm("mlx", str(tiny_dir), max_batch_size=engine, prefill_step_size=16)
    yield client
    client.close()


def provider(llm: LLM) -> MLXProvider:
    assert isinstance(llm.provider, MLXProvider)
    return llm.provider


def cache_of(llm: LLM) -> PromptCache:
    return provider(llm).handle.prompt_cache


def words(tag: str, n: int = 100) -> str:
    return tag + " " + " ".join(f"w{i}" for i in range(n))


def cold_answer(tiny_dir: Path, max_tokens: int, **kwargs: Any) -> str:
    """What the serial engine answers with no prompt cache at all (the reference)."""
    with create_llm("mlx", str(tiny_dir), prefill_step_size=16, prompt_cache_bytes=0) as cold:
        result = cold.generate(max_tokens=max_tokens, **kwargs)
        assert result.usage is not None and result.usage.cached_tokens == 0
        assert len(cache_of(cold)) == 0
        return result.content


def stop_after_chunks(llm: LLM, k: int, request_id: str, **kwargs: Any) -> GenerationCancelledError:
    event = threading.Event()
    with pytest.raises(GenerationCancelledError) as info:
        for i, _ in enumerate(llm.stream(max_tokens=300, cancel_event=event, request_id=request_id, **kwargs)):
            if i == k:
                event.set()
    assert provider(llm).thread.wait_idle(10), "the MLX engine is still working"
    return info.value


def test_a_repeat_is_served_from_the_cache_and_answers_the_same(llm: LLM, tiny_dir: Path) -> None:
    prompt = words("repeat")
    first = llm.generate(prompt, max_tokens=24)
    second = llm.generate(prompt, max_tokens=24)
    assert first.usage is not None and second.usage is not None
    assert first.usage.cached_tokens == 0  # a fresh engine: nothing cached yet
    assert first.usage.prompt_tokens is not None
    # all but the last prompt token (its logits start the answer; a cache keeps none)
    assert second.usage.cached_tokens == first.usage.prompt_tokens - 1
    assert second.content == first.content == cold_answer(tiny_dir, 24, prompt=prompt)


def test_a_stop_in_decode_keeps_the_prompt_and_exactly_the_tokens_handed_out(llm: LLM, tiny_dir: Path) -> None:
    prompt = words("decode")
    err = stop_after_chunks(llm, 5, "decode-1", prompt=prompt)
    stats = provider(llm).stats("decode-1")
    assert stats is not None and stats.stopped_in == "decode" and stats.tokens_at_stop is not None
    # the stop's partial usage has the prompt's size and the cache's share
    assert err.usage is not None and err.usage.prompt_tokens is not None and err.usage.cached_tokens == 0
    # the engine's own count of what it sampled, not the chunks that reached the caller
    assert err.usage.completion_tokens == stats.tokens_at_stop == err.generated_tokens
    n = err.usage.prompt_tokens
    # mlx-lm had already fed one more token to the model when the flag was seen: trimmed away
    assert cache_of(llm).last_kept == n + stats.tokens_at_stop
    regenerate = llm.generate(prompt, max_tokens=24)
    assert regenerate.usage is not None and regenerate.usage.cached_tokens == n - 1
    assert regenerate.content == cold_answer(tiny_dir, 24, prompt=prompt)


def test_a_stop_in_prefill_keeps_the_chunks_that_completed(llm: LLM, tiny_dir: Path) -> None:
    prompt = words("prefill", 600)  # ~2,900 tokens: ~180 chunks of 16
    p = provider(llm)
    event = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            llm.generate(prompt, max_tokens=8, cancel_event=event, request_id="prefill-1")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert wait_until(lambda: (s := p.stats("prefill-1")) is not None and s.prefill_done >= 160, timeout=60)
    event.set()
    thread.join(30)
    assert [type(e) for e in errors] == [GenerationCancelledError]
    assert p.thread.wait_idle(10)
    stats = p.stats("prefill-1")
    assert stats is not None and stats.stopped_in == "prefill" and stats.tokens == 0
    assert 160 <= stats.prefill_done < stats.prefill_total
    kept = cache_of(llm).last_kept
    assert kept == stats.prefill_done  # every chunk that completed, nothing more (a fresh cache)
    again = llm.generate(prompt, max_tokens=8)
    assert again.usage is not None and again.usage.cached_tokens == kept
    assert again.content == cold_answer(tiny_dir, 8, prompt=prompt)


def test_a_regenerate_sent_at_once_after_a_stop_in_prefill_finds_its_chunks(tiny_dir: Path) -> None:
    """Stop during a long prompt, then Regenerate at once: the batched engine admitted the new
    request (and looked its prompt up) before it kept the stopped one's prefill, which found
    nothing (0 of 1,503 tokens; the serial engine, one request at a time, 1,344). Made
    deterministic: the engine is held after a step while the stop lands and the Regenerate
    queues, then let go."""
    with create_llm("mlx", str(tiny_dir), max_batch_size=4, prefill_step_size=16) as llm:
        p = provider(llm)
        llm.generate("warm up", max_tokens=2)
        engine = p.batch
        assert engine is not None
        generator = engine._generator
        real_next = generator.next
        hold, held, armed = threading.Event(), threading.Event(), threading.Event()

        def next_step() -> Any:
            out = real_next()
            if armed.is_set():
                armed.clear()
                held.set()
                assert hold.wait(30)
            return out

        generator.next = next_step
        prompt = words("regenerate", 300)
        event = threading.Event()
        errors: list[BaseException] = []
        answers: list[Any] = []

        def first() -> None:
            try:
                llm.generate(prompt, max_tokens=8, cancel_event=event, request_id="first")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=first)]
        threads[0].start()
        assert wait_until(lambda: (s := p.stats("first")) is not None and s.prefill_done >= 320, timeout=60)
        armed.set()
        assert held.wait(30)  # the engine is inside its loop, between two steps
        event.set()  # Stop ...
        threads.append(threading.Thread(target=lambda: answers.append(llm.generate(prompt, max_tokens=8))))
        threads[1].start()  # ... and Regenerate at once
        assert wait_until(lambda: len(engine._pending) == 1, timeout=30)
        hold.set()
        for thread in threads:
            thread.join(60)
        assert [type(e) for e in errors] == [GenerationCancelledError]
        stats = p.stats("first")
        assert stats is not None and stats.stopped_in == "prefill" and stats.prefill_done >= 320
        assert answers and answers[0].usage is not None
        kept = stats.cached_tokens + stats.prefill_done  # what it started from, and every chunk it completed
        assert answers[0].usage.cached_tokens == kept, (answers[0].usage, stats)
        assert answers[0].content == cold_answer(tiny_dir, 8, prompt=prompt)


def test_the_next_turn_after_a_stop_reuses_the_first_turn(llm: LLM, tiny_dir: Path) -> None:
    history: list[Any] = [{"role": "user", "content": words("turn")}]
    err = stop_after_chunks(llm, 5, "turn-1", messages=history)
    assert err.usage is not None and err.usage.prompt_tokens is not None
    history += [{"role": "assistant", "content": err.partial_text}, {"role": "user", "content": "and then?"}]
    second = llm.generate(messages=history, max_tokens=12)
    assert second.usage is not None and second.usage.cached_tokens is not None
    assert second.usage.cached_tokens >= err.usage.prompt_tokens  # the first turn's whole prompt, at least
    assert second.content == cold_answer(tiny_dir, 12, messages=history)


def test_eject_drops_every_entry_and_a_reload_starts_cold(llm: LLM) -> None:
    llm.generate(words("eject"), max_tokens=8)
    cache = cache_of(llm)
    assert len(cache) == 1 and cache.nbytes > 0
    report = llm.unload_model(drain_timeout=10)
    assert report.memory_before is not None and report.memory_after is not None
    assert report.memory_before > report.memory_after
    assert (len(cache), cache.nbytes) == (0, 0)
    again = llm.generate(words("eject"), max_tokens=8)  # reloads: new weights, a new cache key
    assert again.usage is not None and again.usage.cached_tokens == 0


def test_the_cache_is_bounded_in_bytes(tiny_dir: Path, engine: int) -> None:
    bound = 300_000  # about one entry of these prompts
    with create_llm("mlx", str(tiny_dir), max_batch_size=engine, prompt_cache_bytes=bound) as llm:
        for i in range(8):
            llm.generate(f"conversation number {i} " * 20, max_tokens=8)
            assert cache_of(llm).nbytes <= bound
        assert cache_of(llm).nbytes > 0
        assert 0 < len(cache_of(llm)) < 8  # older entries were evicted


def test_prompt_cache_bytes_zero_turns_it_off_and_negative_is_refused(tiny_dir: Path) -> None:
    with create_llm("mlx", str(tiny_dir), prompt_cache_bytes=0) as llm:
        llm.generate("hello there", max_tokens=4)
        again = llm.generate("hello there", max_tokens=4)
        assert again.usage is not None and again.usage.cached_tokens == 0
        assert len(cache_of(llm)) == 0
    with pytest.raises(ValueError, match="prompt_cache_bytes"):
        create_llm("mlx", str(tiny_dir), prompt_cache_bytes=-1)


def test_smollm2_regenerate_after_a_stop_answers_what_a_cold_engine_answers() -> None:
    """The real model: a greedy answer after a cache hit (the KV a stop left) is the same text."""
    from abstract_client.app.assets import smollm2_mlx

    question: list[Any] = [{"role": "user", "content": "Name three colours of the rainbow."}]
    with create_llm("mlx", str(smollm2_mlx()), prompt_cache_bytes=0) as cold:
        reference = cold.generate(messages=question, max_tokens=16, temperature=0)
    with create_llm("mlx", str(smollm2_mlx())) as llm:
        err = stop_after_chunks(llm, 3, "smol-1", messages=question, temperature=0)
        assert err.partial_text and reference.content.startswith(err.partial_text)
        again = llm.generate(messages=question, max_tokens=16, temperature=0)
    assert reference.usage is not None and again.usage is not None
    assert again.usage.cached_tokens == reference.usage.prompt_tokens - 1  # type: ignore[operator]
    assert again.content == reference.content
