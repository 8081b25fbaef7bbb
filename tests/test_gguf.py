"""The gguf lane on a REAL model (the SmolLM2-135M-Instruct GGUF, llama-cpp-python over the same
llama.cpp build llama-server runs). The stop is judged by the engine's own evidence: its
per-request counters (tokens counted, prefill tokens done, where it saw the flag), its count of
``llama_decode`` calls and of those the abort callback ended, and the process's RSS."""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from abstract_client import (
    LLM,
    ContextOverflowError,
    GenerationCancelledError,
    ModelBusyError,
    ProviderAPIError,
    create_llm,
)

from .helpers import launch_llama_server, stream_in_threads, wait_until

if os.environ.get("ABSTRACT_CLIENT_REQUIRE_ENGINES") != "1" and importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is missing: scripts/get_llama_cpp_python.sh", allow_module_level=True)
from abstract_client.providers._gguf import model as gguf_model
from abstract_client.providers._gguf.model import import_llama_cpp
from abstract_client.providers.gguf import GGUFProvider

import_llama_cpp()  # a missing engine fails here, with the reason, under the test command

# SmolLM2's template adds its own default system prompt when none is given, and with that one the
# 135M model rambles in French (on llama-server too); a plain system prompt gets "Paris".
CAPITAL = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
STORY = "Tell me a long story about a fox and a crow."


@pytest.fixture(scope="module")
def model_path() -> str:
    from abstract_client.app.assets import smollm2_gguf

    return str(smollm2_gguf())


@pytest.fixture(scope="module")
def llm(model_path: str) -> Iterator[LLM]:
    client = create_llm("gguf", model_path, n_ctx=8192, n_batch=512)
    client.load_model()
    yield client
    client.close()


def provider(llm: LLM) -> GGUFProvider:
    assert isinstance(llm.provider, GGUFProvider)
    return llm.provider


def long_prompt(words: int = 800, tag: str = "") -> str:
    return tag + " ".join(f"item{i}" for i in range(words))  # > 3,000 tokens


def test_paris_greedy_stream_equals_generate_and_usage(llm: LLM) -> None:
    result = llm.generate(messages=CAPITAL, max_tokens=20, temperature=0)  # type: ignore[arg-type]
    assert "Paris" in result.content
    assert result.finish_reason == "stop" and "<|im_end|>" not in result.content
    n_prompt = llm.count_tokens(messages=CAPITAL)  # type: ignore[arg-type]
    assert result.usage is not None and result.usage.prompt_tokens == n_prompt
    assert result.usage.completion_tokens is not None and 0 < result.usage.completion_tokens <= 20
    assert result.timings.tokens_per_s is not None and result.timings.tokens_per_s > 0
    streamed = "".join(c.delta for c in llm.stream(messages=CAPITAL, max_tokens=20, temperature=0))  # type: ignore[arg-type]
    assert streamed == result.content


def test_the_same_answer_as_llama_server(llm: LLM, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same GGUF, the same llama.cpp build, greedy: the same text as llama-server's."""
    server = launch_llama_server(tmp_path_factory, "gguf-vs-server")
    try:
        remote = create_llm("llamacpp", "smollm2", base_url=server.url, max_retries=0)
        for messages in (CAPITAL, [{"role": "user", "content": STORY}]):
            theirs = remote.generate(messages=messages, max_tokens=40, temperature=0)  # type: ignore[arg-type]
            ours = llm.generate(messages=messages, max_tokens=40, temperature=0)  # type: ignore[arg-type]
            assert ours.content == theirs.content
            assert ours.usage is not None and theirs.usage is not None
            assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
        assert "Paris" in ours.content or "Paris" in llm.generate(messages=CAPITAL, max_tokens=20).content  # type: ignore[arg-type]
        remote.close()
    finally:
        server.stop()


def test_the_same_answer_as_create_completion_on_the_same_llama(llm: LLM) -> None:
    """Our decode loop answers exactly what llama-cpp-python's own completion answers (greedy)."""
    p = provider(llm)
    from abstract_client.types import GenerationRequest

    ids = p.handle.prompt_ids(GenerationRequest(messages=CAPITAL, model=None))  # type: ignore[arg-type]

    def reference() -> str:
        p.handle.llm.reset()
        out = p.handle.llm.create_completion(ids, max_tokens=24, temperature=0.0, top_k=1)
        p.handle.llm.reset()
        return str(out["choices"][0]["text"])

    expected = p.thread.submit(reference).result(120)
    ours = llm.generate(messages=CAPITAL, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    assert ours.content == expected.strip() or ours.content == expected


def flag_at_sample(p: GGUFProvider, n: int, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The next request's sampler sets the returned event (its stop) while it samples token n, on
    the engine thread: after the lane's check before the step, before its check after sampling."""
    chains = type(p.handle).sampler.__get__(p.handle)  # the real one, never a previous wrapper
    event = threading.Event()

    def sampler(*args: Any) -> Any:
        chain = chains(*args)
        picks = 0

        class Flagging:
            def sample(self, ctx: Any, idx: int) -> int:
                nonlocal picks
                picks += 1
                chosen = int(chain.sample(ctx, idx))
                if picks == n:
                    event.set()
                return chosen

        return Flagging()

    monkeypatch.setattr(p.handle, "sampler", sampler)
    return event


def test_the_token_sampled_under_the_flag_is_never_counted(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flag goes up while token n is being sampled: n is dropped, n-1 were counted."""
    p = provider(llm)
    for n in (1, 4, 9):
        event = flag_at_sample(p, n, monkeypatch)
        with pytest.raises(GenerationCancelledError):
            for _ in llm.stream(STORY, max_tokens=200, cancel_event=event, request_id=f"g-pick-{n}", temperature=0):
                pass
        assert p.thread.wait_idle(10)
        stats = p.stats(f"g-pick-{n}")
        assert stats is not None and stats.stopped_in == "decode"
        assert stats.tokens == n - 1 == stats.tokens_at_stop, (n, stats)


class FlagInSlice:
    """Wraps the model's ``decode``: sets the stop flag as evaluation ``k`` (counted from the
    wrap) begins, on the engine thread — after the lane's own check between slices, so only the
    abort callback can stop that evaluation."""

    def __init__(self, p: GGUFProvider, k: int, event: threading.Event) -> None:
        self.real, self.k, self.event, self.calls = p.handle.decode, k, event, 0

    def __call__(self, tokens: list[int]) -> None:
        self.calls += 1
        if self.calls == self.k:
            self.event.set()
        self.real(tokens)


def _stop_in_slice(llm: LLM, prompt: str, k: int, request_id: str) -> Any:
    p = provider(llm)
    llm.generate("an unrelated prompt", max_tokens=1)  # the context holds something else
    event = threading.Event()
    p.handle.decode = FlagInSlice(p, k, event)  # type: ignore[method-assign]
    try:
        with pytest.raises(GenerationCancelledError):
            llm.generate(prompt, max_tokens=4, cancel_event=event, request_id=request_id)
        assert p.thread.wait_idle(60)
    finally:
        del p.handle.decode
    stats = p.stats(request_id)
    assert stats is not None and stats.stopped_in == "prefill" and stats.tokens == 0
    return stats


def test_a_stop_inside_a_prefill_slice_is_aborted_there(llm: LLM) -> None:
    """The flag goes up as slice k of a > 3,000-token prompt (n_batch 512) begins: the abort
    callback ends that very evaluation (llama_decode returns 2) — slice k never completes."""
    p = provider(llm)
    assert llm.count_tokens(long_prompt()) >= 3000
    for k in (1, 2, 4):
        aborted = p.handle.aborted
        stats = _stop_in_slice(llm, long_prompt(), k, f"g-abort-{k}")
        assert p.handle.aborted == aborted + 1, k  # ended inside llama_decode, by the callback
        # slices of 512 after what the context already held (the chat template's opening)
        assert stats.prefill_done == (stats.cached_tokens or 0) + (k - 1) * 512, (k, stats)


def test_llama_cpps_own_lines_go_to_logging_at_debug(
    llm: LLM, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """An aborted evaluation makes llama.cpp log (at its WARN level) "decode: removing memory
    module entries ...": a library's engine chatter goes to ``logging`` at DEBUG, never to the
    terminal and never at a level an app's WARNING handler (or Python's last resort) prints."""
    name = "abstract_client.providers.gguf.llama_cpp"
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG, logger=name):
        _stop_in_slice(llm, long_prompt(), 2, "g-log")
    lines = [r for r in caplog.records if r.name == name]
    assert any("removing memory module entries" in r.getMessage() for r in lines), [r.getMessage() for r in lines]
    assert {r.levelno for r in lines} == {logging.DEBUG}
    out, err = capfd.readouterr()
    assert "removing memory module entries" not in out + err


def test_without_the_abort_callback_the_stop_waits_for_the_slice(model_path: str) -> None:
    llm = create_llm("gguf", model_path, n_ctx=8192, n_batch=512, abort_callback=False)
    try:
        stats = _stop_in_slice(llm, long_prompt(), 2, "g-noabort")
        assert provider(llm).handle.aborted == 0
        assert stats.prefill_done == (stats.cached_tokens or 0) + 2 * 512  # slice 2 ran to its end
    finally:
        llm.close()


def test_after_an_abort_the_context_answers_as_a_fresh_one(llm: LLM, model_path: str) -> None:
    """A stop inside a slice leaves the KV consistent: it holds exactly the positions the
    context counts (none of the aborted slice), and the next request answers exactly what a
    fresh instance answers."""
    p = provider(llm)
    llama_cpp = import_llama_cpp()
    _stop_in_slice(llm, long_prompt(300, "What is the first item? "), 2, "g-abort-kv")

    def held() -> tuple[int, int]:
        memory = llama_cpp.llama_get_memory(p.handle.llm.ctx)
        return int(llama_cpp.llama_memory_seq_pos_max(memory, 0)), int(p.handle.llm.n_tokens)

    pos_max, n_tokens = p.thread.submit(held).result(30)
    assert pos_max == n_tokens - 1, (pos_max, n_tokens)  # nothing past what the context counts
    after = llm.generate(messages=CAPITAL, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    fresh = create_llm("gguf", model_path, n_ctx=8192, n_batch=512)
    try:
        assert fresh.generate(messages=CAPITAL, max_tokens=16, temperature=0).content == after.content  # type: ignore[arg-type]
    finally:
        fresh.close()


def test_regenerate_after_a_stop_reuses_the_prompt(llm: LLM) -> None:
    ask = [{"role": "user", "content": STORY}]
    event = threading.Event()
    with pytest.raises(GenerationCancelledError):
        for i, _ in enumerate(llm.stream(messages=ask, max_tokens=200, cancel_event=event), 1):  # type: ignore[arg-type]
            if i == 3:
                event.set()
    again = llm.generate(messages=ask, max_tokens=5)  # type: ignore[arg-type]
    assert again.usage is not None and again.usage.cached_tokens == again.usage.prompt_tokens - 1


def test_typed_failures_keep_the_partial_text_and_the_lane_serves_on(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    p = provider(llm)
    real = p.handle.decode
    calls = 0

    def failing(tokens: list[int]) -> None:
        nonlocal calls
        calls += 1
        if calls == 8:
            raise RuntimeError("llama_decode returned -3 (injected)")
        real(tokens)

    monkeypatch.setattr(p.handle, "decode", failing)
    with pytest.raises(ProviderAPIError) as info:
        for _ in llm.stream(STORY, max_tokens=40, temperature=0):
            pass
    monkeypatch.setattr(p.handle, "decode", real)
    err = info.value
    assert "injected" in str(err) and err.partial_text and not isinstance(err, GenerationCancelledError)
    with pytest.raises(ContextOverflowError) as overflow:
        llm.generate(long_prompt(3000), max_tokens=4)
    assert overflow.value.n_ctx == 8192 and (overflow.value.n_prompt_tokens or 0) > 8192
    assert "Paris" in llm.generate(messages=CAPITAL, max_tokens=20, temperature=0).content  # type: ignore[arg-type]


def test_eject_during_generation_frees_the_memory_and_reloads(
    model_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    llm = create_llm("gguf", model_path, n_ctx=8192)
    llm.load_model()
    p = provider(llm)
    baseline = p.handle.rss_baseline
    threads, errors = stream_in_threads(llm, 2, STORY, max_tokens=100_000)
    assert wait_until(lambda: len(llm.in_flight) == 2, 10)
    time.sleep(0.3)
    report = llm.unload_model(drain_timeout=30)
    for t in threads:
        t.join(30)
    assert [type(e) for e in errors] == [GenerationCancelledError] * 2
    assert {e.reason for e in errors if isinstance(e, GenerationCancelledError)} == {"model_eject"}
    assert report.stopped_requests == 2 and not p.loaded
    assert baseline is not None and report.memory_before is not None and report.memory_after is not None
    assert report.memory_before - baseline > 60 * 2**20  # weights (mapped) and the 8k context's KV
    assert report.memory_after < baseline + 25 * 2**20, (
        baseline >> 20,
        report.memory_before >> 20,
        report.memory_after >> 20,
    )
    caplog.set_level(logging.WARNING)
    assert "Paris" in llm.generate(messages=CAPITAL, max_tokens=20, temperature=0).content  # type: ignore[arg-type]
    assert "reloading" in caplog.text
    llm.close()


def test_unload_refuses_to_free_under_a_running_evaluation(llm: LLM) -> None:
    p = provider(llm)
    p.thread.submit(lambda: time.sleep(1.5))  # an evaluation that ignores every flag
    with pytest.raises(ModelBusyError):
        llm.unload_model(drain_timeout=0.2)
    assert p.thread.wait_idle(10) and p.loaded


CLOSE_DURING_DECODE = r"""
import sys, threading, time
from abstract_client import create_llm
llm = create_llm("gguf", sys.argv[1], n_ctx=8192, n_batch=2048)
p = llm.provider
llm.load_model()
prompt = " ".join(f"item{i}" for i in range(1500))
started = threading.Event()
real = p.handle.decode
def decode(tokens):
    started.set()
    real(tokens)
p.handle.decode = decode
def run():
    try:
        llm.generate(prompt, max_tokens=2)
    except Exception as exc:
        print("call ended:", type(exc).__name__, str(exc)[:80], flush=True)
t = threading.Thread(target=run); t.start()
started.wait(60)
time.sleep(0.05)
t0 = time.perf_counter()
p.handle.close()  # from another thread, mid-evaluation: abort it, wait for the request, then free
print(f"closed after {time.perf_counter() - t0:.3f}s", flush=True)
t.join(60)
print("survived", flush=True)
"""


def test_close_from_another_thread_aborts_the_evaluation_then_frees(model_path: str) -> None:
    """llama-cpp-python's close() under a running llama_decode frees the context it computes on
    (a crash). Ours aborts the evaluation through the request's flag, waits for the request to let
    go of the model, then frees: the call ends typed, the close returns within a node or so. In a
    child process: a crash must not end the suite."""
    out = subprocess.run(
        [sys.executable, "-c", CLOSE_DURING_DECODE, model_path], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "survived" in out.stdout, (out.returncode, out.stdout, out.stderr[-2000:])
    assert "call ended: ProviderAPIError" in out.stdout and "closed during the request" in out.stdout, out.stdout
    waited = float(out.stdout.split("closed after ")[1].split("s")[0])
    assert waited < 5  # the 2,048-token slice was aborted, not waited out (it takes seconds here)


EJECT_STORM = r"""
import random, sys, threading, time
from abstract_client import create_llm, GenerationCancelledError
llm = create_llm("gguf", sys.argv[1], n_ctx=4096, n_batch=256)
p = llm.provider
rng = random.Random(7)
long = " ".join(f"item{i}" for i in range(600))
untyped, rss = [], []
for i in range(50):
    errors = []
    def run(prompt):
        try:
            llm.generate(prompt, max_tokens=200)
        except GenerationCancelledError as exc:
            errors.append(exc.reason)
        except BaseException as exc:
            untyped.append(repr(exc))
    t = threading.Thread(target=run, args=(long if i % 2 else "Tell me a story.",))
    t.start()
    time.sleep(rng.uniform(0.0, 0.3))
    report = llm.unload_model(drain_timeout=60)
    t.join(60)
    rss.append((report.memory_after or 0) - (p.handle.rss_baseline or 0))
print("untyped", untyped)
print("max_rss_over_baseline_mib", max(rss) / 2**20)
print("survived")
"""


def test_fifty_ejects_at_random_moments_never_crash(model_path: str) -> None:
    out = subprocess.run([sys.executable, "-c", EJECT_STORM, model_path], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0 and "survived" in out.stdout, (out.returncode, out.stdout, out.stderr[-2000:])
    assert "untyped []" in out.stdout, out.stdout
    over = float(out.stdout.split("max_rss_over_baseline_mib ")[1].split()[0])
    assert over < 25, out.stdout  # memory back each time (within 25 MiB of the pre-load RSS)


def test_the_abort_callback_is_libc_strlen_over_the_flag() -> None:
    """No Python per graph node: the callback is a C function reading the request's flag."""
    import ctypes

    llama_cpp = import_llama_cpp()
    callback = gguf_model._abort_callback(llama_cpp)
    flag = ctypes.create_string_buffer(2)
    assert callback(ctypes.addressof(flag)) is False
    ctypes.memset(flag, 1, 1)
    assert callback(ctypes.addressof(flag)) is True
    assert random is not None


def test_a_stops_partial_text_is_every_counted_tokens_text_held_back_included(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop-string matcher holds text back while it could still become a stop string; a stop
    then must not lose it: the error's partial text is the text of every token the engine
    counted — exactly what the same greedy answer cut at that many tokens says."""
    p = provider(llm)
    full = llm.generate(messages=CAPITAL, max_tokens=12, temperature=0).content  # type: ignore[arg-type]
    hold = full[4:] + "QQQ"  # never completed: from character 4 on, everything is held back
    for n in (4, 8):
        expected = llm.generate(messages=CAPITAL, max_tokens=n - 1, temperature=0, stop=[hold]).content  # type: ignore[arg-type]
        assert len(expected) > 4
        event = flag_at_sample(p, n, monkeypatch)
        with pytest.raises(GenerationCancelledError) as info:
            llm.generate(messages=CAPITAL, max_tokens=12, temperature=0, stop=[hold], cancel_event=event)  # type: ignore[arg-type]
        assert info.value.partial_text == expected, (n, info.value.partial_text, expected)
        assert info.value.usage is not None and info.value.usage.completion_tokens == n - 1
