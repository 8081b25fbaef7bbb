"""Where the MLX engines check the stop: every token and every prefill chunk, exactly.

A stop set from another thread lands at whatever token the engine happens to be on, so "within
two tokens of the flag" cannot tell a check every token from a check every 8th. Here the flag is
set by the engine's own thread at a chosen point — inside ``stream_generate`` between two
tokens, inside the model's forward pass of a prefill chunk, inside ``BatchGenerator.next`` — and
the engine's counters must show that it stopped exactly there, at 5+ random positions (the seed
is printed in every assertion message).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from abstract_client import LLM, GenerationCancelledError, create_llm

from .helpers import require_module, stream_in_threads, wait_until

mx = require_module("mlx.core", "mlx")
import importlib  # noqa: E402

import mlx_lm  # noqa: E402

from abstract_client.providers.mlx import MLXProvider  # noqa: E402

# ``mlx_lm.generate`` is also the name of a function in ``mlx_lm``: fetch the module itself
BatchGenerator = importlib.import_module("mlx_lm.generate").BatchGenerator
NO_EOS = {"logit_bias": {1: -1e9}}  # the tiny model's EOS id: generations run until max_tokens
SEED = random.randrange(2**32)


def positions(lo: int, hi: int, k: int = 5) -> list[int]:
    """``k`` distinct random positions in [lo, hi), not all multiples of one stride (so a check
    every Nth step cannot pass by luck)."""
    rng = random.Random(SEED)
    picked = sorted(rng.sample(range(lo, hi), k))
    if all(p % 2 == 0 for p in picked):
        picked[0] += 1
    return sorted(set(picked))


@pytest.fixture
def serial(tiny_dir: Path) -> Iterator[LLM]:
    llm = create_llm("mlx", str(tiny_dir), prefill_step_size=16)
    yield llm
    llm.close()


@pytest.fixture
def batched(tiny_dir: Path) -> Iterator[LLM]:
    llm = create_llm("mlx", str(tiny_dir), max_batch_size=4, prefill_step_size=16)
    yield llm
    llm.close()


def provider(llm: LLM) -> MLXProvider:
    assert isinstance(llm.provider, MLXProvider)
    return llm.provider


def stop_on_this_thread(event: threading.Event, log: list[str]) -> None:
    log.append(threading.current_thread().name)
    event.set()


def run_until_stopped(llm: LLM, event: threading.Event, request_id: str, prompt: str = "hello") -> str:
    kwargs: dict[str, Any] = {} if provider(llm).batch is not None else dict(NO_EOS)
    with pytest.raises(GenerationCancelledError) as info:
        for _ in llm.stream(prompt, max_tokens=100_000, cancel_event=event, request_id=request_id, **kwargs):
            pass
    # The sync caller is released at once (and the call is no longer in flight); the engine
    # drains behind it: its record is final once its thread is idle.
    assert llm.in_flight == []
    assert provider(llm).thread.wait_idle(30)
    return info.value.partial_text


# -- the serial engine ----------------------------------------------------------------------------


def flag_after_token(real: Any, n: int, event: threading.Event, where: list[str]) -> Any:
    """``stream_generate`` that sets the stop on the engine's thread once ``n`` tokens were
    handed out, while token ``n + 1`` is already computed."""

    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        gen = real(*args, **kwargs)
        try:
            for i, resp in enumerate(gen):
                if i == n:
                    stop_on_this_thread(event, where)
                yield resp
        finally:
            gen.close()

    return wrapper


def test_serial_decode_stops_at_exactly_the_token_where_the_flag_was_set(
    serial: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = mlx_lm.stream_generate
    for n in positions(1, 60):
        event, where = threading.Event(), []
        monkeypatch.setattr(mlx_lm, "stream_generate", flag_after_token(real, n, event, where))
        rid = f"serial-{n}"
        run_until_stopped(serial, event, rid)
        stats = provider(serial).stats(rid)
        assert stats is not None and where and where[0].startswith("abstract-client-mlx")
        msg = f"seed {SEED}, flag after token {n}"
        assert stats.stopped_in == "decode", msg
        assert stats.tokens_at_stop == n, msg  # the token computed under the flag was not counted
        assert stats.tokens == n, msg  # and nothing after it


class PrefillFlag:
    """The loaded model, wrapped: sets the stop inside the forward pass of prefill chunk ``k``
    and counts the forward passes made after it."""

    def __init__(self, model: Any, k: int, event: threading.Event) -> None:
        self._model, self._k, self._event = model, k, event
        self.prefill_calls = 0
        self.calls_after_flag = 0

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if self._event.is_set():
            self.calls_after_flag += 1
        elif inputs.shape[-1] > 1:
            self.prefill_calls += 1
            if self.prefill_calls == self._k:
                self._event.set()
        return self._model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def test_serial_prefill_stops_at_exactly_the_chunk_where_the_flag_was_set(serial: LLM) -> None:
    p = provider(serial)
    serial.load_model()
    model = p.handle.model
    prompt = " ".join(f"w{i}" for i in range(400))  # well over 20 chunks of 16 tokens
    try:
        for k in positions(1, 20):
            event = threading.Event()
            wrapped = PrefillFlag(model, k, event)
            p.handle.model = wrapped
            rid = f"prefill-{k}"
            assert run_until_stopped(serial, event, rid, prompt) == ""
            stats = p.stats(rid)
            msg = f"seed {SEED}, flag in prefill chunk {k}"
            assert stats is not None and stats.stopped_in == "prefill", msg
            assert stats.prefill_done == k * 16, msg  # stopped at the end of chunk k
            assert wrapped.calls_after_flag == 0, msg  # no forward pass after the flag
            assert stats.tokens == 0, msg
    finally:
        p.handle.model = model


# -- the batched engine ---------------------------------------------------------------------------


class FlagInStep:
    """``BatchGenerator.next`` that sets the stop on the engine's thread inside a chosen step:
    the one that computed token ``token`` (decode), or prefill step ``chunk``."""

    def __init__(self, real: Any, event: threading.Event, *, token: int = 0, chunk: int = 0) -> None:
        self.real, self.event, self.token, self.chunk = real, event, token, chunk
        self.generated = self.chunks = 0
        self.progress_at_flag: tuple[int, int] = (0, 0)
        self.where: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        me = self

        def next_step(generator: Any) -> Any:
            return me.step(generator)

        monkeypatch.setattr(BatchGenerator, "next", next_step)

    def step(self, generator: Any) -> Any:
        prompt_responses, generated = self.real(generator)
        if not self.event.is_set():
            self.generated += len(generated)
            if self.token and self.generated >= self.token:
                stop_on_this_thread(self.event, self.where)
            if self.chunk and prompt_responses:
                self.chunks += 1
                if self.chunks == self.chunk:
                    self.progress_at_flag = tuple(prompt_responses[0].progress)
                    stop_on_this_thread(self.event, self.where)
        return prompt_responses, generated


def test_batched_decode_drops_the_token_computed_under_the_flag(batched: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    real = BatchGenerator.next
    for n in positions(1, 40):
        event = threading.Event()
        flag = FlagInStep(real, event, token=n + 1)
        flag.install(monkeypatch)
        rid = f"batch-{n}"
        run_until_stopped(batched, event, rid)
        stats = provider(batched).stats(rid)
        msg = f"seed {SEED}, flag in the step that computed token {n + 1}"
        assert stats is not None and flag.where, msg
        assert stats.stopped_in == "decode", msg
        assert stats.tokens_at_stop == n and stats.tokens == n, msg


def test_batched_prefill_stops_at_the_next_step(batched: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    real = BatchGenerator.next
    prompt = " ".join(f"w{i}" for i in range(400))
    for k in positions(1, 20):
        event = threading.Event()
        flag = FlagInStep(real, event, chunk=k)
        flag.install(monkeypatch)
        rid = f"batch-prefill-{k}"
        assert run_until_stopped(batched, event, rid, prompt) == ""
        stats = provider(batched).stats(rid)
        msg = f"seed {SEED}, flag after prefill step {k} at {flag.progress_at_flag}"
        assert stats is not None and stats.stopped_in == "prefill", msg
        done, total = flag.progress_at_flag
        assert 0 < done < total and stats.prefill_done == done, msg  # not one chunk more
        assert stats.tokens == 0, msg


def test_batched_request_stopped_while_queued_computes_nothing(batched: LLM) -> None:
    """Four streams fill the batch; a fifth is stopped while it waits: it is never prefilled."""
    p = provider(batched)
    everyone = threading.Event()
    threads, errors = stream_in_threads(batched, 4, "hello", max_tokens=100_000, cancel_event=everyone)
    assert wait_until(lambda: len(batched.in_flight) == 4, 30)
    assert wait_until(lambda: all((s := p.stats(r)) is not None and s.tokens > 0 for r in batched.in_flight), 30)
    queued = threading.Event()
    fifth, fifth_errors = stream_in_threads(batched, 1, "world", max_tokens=100_000, cancel_event=queued)
    assert wait_until(lambda: len(batched.in_flight) == 5, 30)
    (rid,) = set(batched.in_flight) - {r for r in batched.in_flight if (s := p.stats(r)) and s.tokens > 0}
    queued.set()
    everyone.set()
    for t in [*threads, *fifth]:
        t.join(30)
    assert [type(e) for e in errors + fifth_errors] == [GenerationCancelledError] * 5
    assert batched.in_flight == [] and p.thread.wait_idle(30)
    stats = p.stats(rid)
    assert stats is not None and stats.stopped_in == "queue"
    assert stats.prefill_done == 0 and stats.tokens == 0
