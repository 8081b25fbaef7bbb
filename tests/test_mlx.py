"""The mlx lane on REAL mlx-lm: a tiny random-weight llama for the stop path, SmolLM2-135M for
real answers. The stop is judged by MLX's own evidence: the provider's per-request token counter
(sampled on the MLX thread), the prefill progress it reached, and ``mx.get_active_memory()``."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from abstract_client import (
    LLM,
    AbortController,
    GenerationCancelledError,
    ModelBusyError,
    ModelNotFoundError,
    create_llm,
)

from .helpers import press_when, require_module, stream_in_threads

mx = require_module("mlx.core", "mlx")
from abstract_client.providers.mlx import MLXProvider  # noqa: E402

NO_EOS = {"logit_bias": {1: -1e9}}  # the tiny model's EOS id: generations run until max_tokens


@pytest.fixture
def tiny(tiny_dir: Path) -> Iterator[LLM]:
    llm = create_llm("mlx", str(tiny_dir), prefill_step_size=64)
    yield llm
    llm.close()


def provider(llm: LLM) -> MLXProvider:
    assert isinstance(llm.provider, MLXProvider)
    return llm.provider


def long_prompt(n: int = 700) -> str:
    return " ".join(["The quick brown fox jumps over the lazy dog."] * (n // 10))


def test_missing_path_is_a_clear_error_not_a_hub_lookup(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="never downloads"):
        create_llm("mlx", str(tmp_path / "nope"))
    with pytest.raises(ModelNotFoundError):
        create_llm("mlx", "HuggingFaceTB/SmolLM2-135M-Instruct")


def test_real_answer_from_smollm2() -> None:
    from abstract_client.app.assets import smollm2_mlx

    question = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    with create_llm("mlx", str(smollm2_mlx())) as llm:
        result = llm.generate(
            messages=question,  # type: ignore[arg-type]
            max_tokens=20,
            temperature=0,
        )
        assert "Paris" in result.content
        assert result.finish_reason == "stop"  # EOS, never emitted as text
        assert "<|im_end|>" not in result.content
        assert result.usage is not None and result.usage.prompt_tokens == llm.count_tokens(messages=question)
        assert result.usage.completion_tokens is not None and 0 < result.usage.completion_tokens <= 20
        assert result.timings.tokens_per_s is not None and result.timings.tokens_per_s > 0


def test_stop_mid_decode_within_two_tokens_of_the_flag(tiny: LLM) -> None:
    event = threading.Event()
    request_id = "decode-stop"
    with pytest.raises(GenerationCancelledError) as info:
        for i, _ in enumerate(
            tiny.stream("hello", max_tokens=100_000, cancel_event=event, request_id=request_id, **NO_EOS)
        ):
            if i == 20:
                at_flag = provider(tiny).stats(request_id).tokens  # type: ignore[union-attr]
                event.set()
    # The sync caller is released the moment it stops; the MLX thread drains right behind it.
    assert provider(tiny).thread.wait_idle(2)
    stats = provider(tiny).stats(request_id)
    assert stats is not None and stats.stopped_in == "decode"
    assert stats.tokens_at_stop is not None and stats.tokens_at_stop - at_flag <= 2
    assert info.value.partial_text and info.value.generated_tokens >= 20


def test_stop_during_prefill_raises_before_the_first_token(tiny: LLM) -> None:
    event = threading.Event()
    request_id = "prefill-stop"
    p = provider(tiny)

    def press_stop_once_prefill_started() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stats = p.stats(request_id)
            if stats is not None and stats.prefill_done > 0:
                event.set()
                return
            time.sleep(0.0005)

    threading.Thread(target=press_stop_once_prefill_started, daemon=True).start()
    with pytest.raises(GenerationCancelledError) as info:
        for _ in tiny.stream(long_prompt(3000), max_tokens=10, cancel_event=event, request_id=request_id):
            pytest.fail("a token arrived after a stop during prefill")
    assert p.thread.wait_idle(2)
    stats = p.stats(request_id)
    assert stats is not None and stats.stopped_in == "prefill"
    assert 0 < stats.prefill_done < stats.prefill_total and stats.tokens == 0
    assert info.value.partial_text == ""


def test_non_streaming_stop_keeps_partial_text(tiny: LLM) -> None:
    controller = AbortController()
    press = press_when(lambda: provider(tiny).stats("ns").tokens >= 5, controller.abort)  # type: ignore[union-attr]
    with pytest.raises(GenerationCancelledError) as info:
        tiny.generate("hello", max_tokens=1_000_000, signal=controller.signal, request_id="ns", **NO_EOS)
    press.wait()
    assert provider(tiny).thread.wait_idle(2)
    assert info.value.generated_tokens > 0 and info.value.partial_text
    assert provider(tiny).stats("ns").stopped_in == "decode"  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_abort_controller_async(tiny: LLM, anyio_backend: str) -> None:
    controller = AbortController()
    with pytest.raises(GenerationCancelledError):
        async with tiny.astream("hi", max_tokens=100_000, signal=controller.signal, **NO_EOS) as stream:
            n = 0
            async for _ in stream:
                n += 1
                if n == 10:
                    controller.abort()
    # released at once, the engine draining behind (tests/test_engine_contract.py proves the order)
    assert await anyio.to_thread.run_sync(provider(tiny).thread.wait_idle, 10)


@pytest.mark.anyio
async def test_task_cancellation_reraises_and_the_engine_drains(tiny: LLM, anyio_backend: str) -> None:
    with anyio.move_on_after(0.3) as scope:
        await tiny.agenerate("hi", max_tokens=1_000_000, request_id="cancelled-task", **NO_EOS)
    assert scope.cancelled_caught  # the framework's own cancellation came through
    assert await anyio.to_thread.run_sync(provider(tiny).thread.wait_idle, 10)
    assert provider(tiny).stats("cancelled-task").stopped_in == "decode"  # type: ignore[union-attr]


def test_eos_never_emitted_and_stop_strings(tiny: LLM) -> None:
    result = tiny.generate("hi", max_tokens=50, logit_bias={1: 1e9})
    assert result.content == "" and result.finish_reason == "stop"
    full = tiny.generate("hello", max_tokens=40, **NO_EOS).content
    cut = full[10:14]
    stopped = tiny.generate("hello", max_tokens=40, stop=[cut], **NO_EOS)
    assert stopped.content == full[: full.index(cut)] and stopped.finish_reason == "stop"


def test_eject_during_generation_frees_memory_and_reloads(tiny_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    import gc

    gc.collect()
    mx.clear_cache()
    baseline = mx.get_active_memory()
    llm = create_llm("mlx", str(tiny_dir))
    threads, errors = stream_in_threads(llm, 3, "hello", max_tokens=1_000_000, **NO_EOS)
    deadline = time.monotonic() + 10
    while len(llm.in_flight) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    report = llm.unload_model(drain_timeout=10)
    for t in threads:
        t.join(10)
    assert [type(e) for e in errors] == [GenerationCancelledError] * 3
    assert {e.reason for e in errors if isinstance(e, GenerationCancelledError)} == {"model_eject"}
    assert report.stopped_requests == 3
    assert report.memory_before is not None and report.memory_after is not None
    assert report.memory_before > report.memory_after
    errors.clear()  # drop the exceptions (and their tracebacks) before measuring
    gc.collect()
    assert mx.get_active_memory() - baseline < 16 * 1024, (mx.get_active_memory(), baseline)
    assert mx.get_cache_memory() == 0
    caplog.set_level(logging.WARNING)
    assert llm.generate("again", max_tokens=3).usage is not None  # reloads on demand
    assert "reloading" in caplog.text
    llm.close()


def test_unload_refuses_to_free_under_a_running_decode(tiny: LLM) -> None:
    tiny.load_model()
    p = provider(tiny)
    p.thread.submit(lambda: time.sleep(1.5))  # a decode that ignores every flag
    with pytest.raises(ModelBusyError):
        tiny.unload_model(drain_timeout=0.2)
    assert p.loaded  # nothing was freed
    p.thread.wait_idle(5)
    assert tiny.unload_model().server_unloaded


def test_process_that_generates_and_exits_returns_0_five_times(tiny_dir: Path) -> None:
    script = textwrap.dedent(f"""
        import threading
        from abstract_client import create_llm, GenerationCancelledError
        llm = create_llm("mlx", {str(tiny_dir)!r})
        print(llm.generate("hi", max_tokens=5).content is not None)
        ev = threading.Event()
        try:
            for i, _ in enumerate(llm.stream("hi", max_tokens=10000, cancel_event=ev, logit_bias={{1: -1e9}})):
                if i == 3:
                    ev.set()
        except GenerationCancelledError:
            pass
    """)
    for _ in range(5):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "Exception ignored" not in proc.stderr
        assert "Destroyed in a different thread" not in proc.stderr


@pytest.mark.parametrize("max_batch_size", [1, 2], ids=["serial", "batched"])
def test_a_stops_partial_text_keeps_what_the_detokenizer_held_back(tiny_dir: Path, max_batch_size: int) -> None:
    """Every sampled token is byte 0xE2 (an unfinished UTF-8 sequence): the streaming
    detokenizer holds all of it back and no chunk ever arrives. A stop still reports every
    counted token — in its usage and, as the replacement characters they decode to, in its
    partial text."""
    lead_byte = 161  # the tiny tokenizer's byte-level token for 0xE2
    llm = create_llm("mlx", str(tiny_dir), max_batch_size=max_batch_size)
    p = provider(llm)
    event = threading.Event()
    request_id = f"held-{max_batch_size}"
    # the flag goes up on the engine thread, inside the sampler (draw 14): every count is final
    real_sampler = type(p.handle).sampler.__get__(p.handle)

    def sampler(request: Any) -> Any:
        sample, draws = real_sampler(request), [0]

        def drawing(logprobs: Any) -> Any:
            draws[0] += 1
            if draws[0] == 14:
                event.set()
            return sample(logprobs)

        return drawing

    p.handle.sampler = sampler  # type: ignore[method-assign]
    with pytest.raises(GenerationCancelledError) as info:
        for _ in llm.stream(
            "hello", max_tokens=100_000, cancel_event=event, request_id=request_id, logit_bias={lead_byte: 1e9}
        ):
            pytest.fail("held-back text arrived as a chunk")
    assert p.thread.wait_idle(10)
    stats = p.stats(request_id)
    assert stats is not None and stats.stopped_in == "decode" and stats.tokens_at_stop is not None
    assert stats.tokens_at_stop >= 10
    assert info.value.usage is not None and info.value.usage.completion_tokens == stats.tokens_at_stop
    assert info.value.partial_text == "\ufffd" * stats.tokens_at_stop
    llm.close()
