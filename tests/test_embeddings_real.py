"""Embeddings and token counting on REAL engines: llama-server (started with ``--embeddings
--pooling mean``) and mlx-lm, both with SmolLM2-135M-Instruct (hidden size 576). The stop is
proven by each engine's evidence: llama-server's log of the tasks it processed, MLX's own count
of inputs embedded after the flag."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import pytest

from abstract_client import LLM, GenerationCancelledError, create_llm
from abstract_client.testing.processes import LlamaServer

from .helpers import launch_llama_server, needs_mlx, press_when, wait_until

HIDDEN = 576
CAPITAL = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
CAT, KITTEN, MONEY = (
    "The cat sat on the mat.",
    "A cat was sitting on the mat.",
    "Quarterly revenue rose four percent on strong bond trading.",
)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def same_vectors(a: list[list[float]], b: list[list[float]], tol: float) -> bool:
    pairs = zip(a, b, strict=False)
    return len(a) == len(b) and all(
        len(u) == len(v) and all(abs(x - y) <= tol for x, y in zip(u, v, strict=True)) for u, v in pairs
    )


def check_vectors(llm: LLM) -> None:
    result = llm.embed([CAT, KITTEN, MONEY, CAT])
    assert [len(v) for v in result.vectors] == [HIDDEN] * 4
    assert result.vectors[0] == pytest.approx(result.vectors[3], abs=1e-5)  # identical texts
    assert cosine(result.vectors[0], result.vectors[1]) > cosine(result.vectors[0], result.vectors[2])
    assert result.usage is not None and result.usage.prompt_tokens


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = launch_llama_server(
        tmp_path_factory,
        "llama-embed",
        batch=512,
        threads=1,  # ggml's 2-thread barriers crawl when other work holds the 2 cores
        extra=["--embeddings", "--pooling", "mean"],
    )
    yield server
    server.stop()


@pytest.mark.llamacpp
def test_llamacpp_vectors(embedder: LlamaServer) -> None:
    with create_llm("llamacpp", "smollm2", base_url=embedder.url) as llm:
        check_vectors(llm)


@pytest.mark.llamacpp
def test_llamacpp_stop_during_a_2000_text_embed(embedder: LlamaServer) -> None:
    """This llama-server build keeps computing every queued embedding task of a request after
    its client has gone (llama.cpp #6421 still reproduces for ``/v1/embeddings``), so the
    server-side proof is the bound that client-side batching gives: after the stop the server
    computes at most the rest of the batch in flight, and no later batch is ever sent. Its own
    log counts the tasks it processed."""
    texts = [f"Sentence number {i} about topic {i % 17}." for i in range(2000)]
    size = 16
    with create_llm("llamacpp", "smollm2", base_url=embedder.url, max_retries=0) as llm:
        first = llm.embed(texts[:size], batch_size=size)
        assert embedder.wait_idle(30)
        mark = embedder.log_text().count("processing task")
        event = threading.Event()

        def into_the_third_batch() -> bool:  # batches go one after another: two came back
            return embedder.log_text().count("processing task") - mark > 2 * size

        # pressed by the server's own progress, not a timer (on a loaded machine a timer can fire
        # before the first batch is back: a stop then rightly keeps nothing)
        threading.Thread(
            target=lambda: wait_until(into_the_third_batch, 120, interval=0.01) and event.set(), daemon=True
        ).start()
        with pytest.raises(GenerationCancelledError) as info:
            llm.embed(texts, batch_size=size, cancel_event=event)
    done = info.value.partial_embeddings
    assert done is not None and 0 < len(done) < 2000 and len(done) % size == 0
    assert same_vectors(done[:size], first.vectors, 1e-4)  # the finished vectors, in order
    assert embedder.wait_idle(60), "the server never drained the batch in flight"
    time.sleep(1.0)
    processed = embedder.log_text().count("processing task") - mark
    assert len(done) <= processed <= len(done) + size, (processed, len(done))


@needs_mlx
def test_mlx_vectors_count_tokens_and_stop() -> None:
    from abstract_client.app.assets import smollm2_mlx
    from abstract_client.providers.mlx import MLXProvider

    with create_llm("mlx", str(smollm2_mlx())) as llm:
        check_vectors(llm)
        # token counts agree with what a generation reports
        result = llm.generate(messages=CAPITAL, max_tokens=2)
        assert result.usage is not None
        assert llm.count_tokens(messages=CAPITAL) == result.usage.prompt_tokens
        raw = llm.generate("The capital of France is", raw=True, max_tokens=2)
        assert raw.usage is not None and llm.count_tokens("The capital of France is") == raw.usage.prompt_tokens
        # a stop during a 2,000-text embed: the finished batches come back, in order; the engine
        # embeds nothing after it sees the flag (its own count of inputs embedded)
        texts = [f"Sentence number {i}." for i in range(2000)]
        first = llm.embed(texts[:8], batch_size=8)
        provider = llm.provider
        assert isinstance(provider, MLXProvider)
        event = threading.Event()

        def past_the_first_batch() -> bool:  # the engine is into batch 2: batch 1 came back
            stats = provider.stats("emb")
            return stats is not None and stats.tokens > 8

        # pressed by the engine's own progress, not a timer: on a loaded machine a timer can fire
        # before the first batch is back, and a stop then rightly keeps nothing
        threading.Thread(target=lambda: wait_until(past_the_first_batch, 120) and event.set(), daemon=True).start()
        with pytest.raises(GenerationCancelledError) as info:
            llm.embed(texts, batch_size=8, cancel_event=event, request_id="emb")
        done = info.value.partial_embeddings
        assert done is not None and 8 <= len(done) < 2000 and len(done) % 8 == 0
        assert same_vectors(done[:8], first.vectors, 1e-5)
        stats = provider.stats("emb")
        assert stats is not None
        assert provider.thread.wait_idle(30)
        assert len(done) <= stats.tokens < len(done) + 8  # the finished batches, and at most the one cut
        # the flag seen between inputs: nothing embedded after it (or the stop came between batches)
        assert stats.tokens_at_stop is None or stats.tokens == stats.tokens_at_stop
        assert len(done) <= stats.tokens < len(done) + 8  # at most the batch in flight went unreturned


@pytest.mark.vllm
@pytest.mark.timeout(600)  # it starts vLLM's pooling runner: ~90 of its 107 s on a quiet machine
def test_vllm_pooling_runner_vectors_and_stop(tmp_path_factory: pytest.TempPathFactory) -> None:
    """vLLM serves SmolLM2 as an embedding model with its pooling runner (``--runner pooling
    --convert embed``, mean pooling) on the CPU."""
    from abstract_client.testing.processes import VLLMServer, vllm_environment

    env = vllm_environment()
    if env is None:
        pytest.fail("the vLLM venv or the SmolLM2 HF model is missing: run scripts/get_vllm.sh (.ci/run does)")
    server = VLLMServer.launch(
        env[0],
        env[1],
        log_path=tmp_path_factory.mktemp("vllm-embed") / "server.log",
        max_model_len=512,
        # pooling runs without chunked prefill: a whole input must fit one scheduler step
        extra=[
            *("--max-num-batched-tokens", "512", "--runner", "pooling", "--convert", "embed"),
            *("--pooler-config", '{"pooling_type": "MEAN"}'),
        ],
    )
    try:
        with create_llm("vllm", "smollm2", base_url=server.url, max_retries=0) as llm:
            check_vectors(llm)
            event = threading.Event()
            succeeded = server.metrics().get("vllm:request_success_total", 0.0)
            # pressed once vLLM has answered two batches (its own count), whatever the load
            press = press_when(
                lambda: server.metrics().get("vllm:request_success_total", 0.0) >= succeeded + 2, event.set
            )
            with pytest.raises(GenerationCancelledError) as info:
                llm.embed([f"Sentence number {i}." for i in range(2000)], batch_size=8, cancel_event=event)
            press.wait()
            done = info.value.partial_embeddings
            assert done is not None and len(done) < 2000 and len(done) % 8 == 0
            # vLLM's own evidence: nothing running (the batch in flight was aborted or done),
            # and no request arrives after the stop
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and server.running() > 0:
                time.sleep(0.05)
            assert server.running() == 0
            seen = server.metrics().get("vllm:request_success_total", 0.0)
            time.sleep(1.0)
            assert server.metrics().get("vllm:request_success_total", 0.0) == seen
    finally:
        server.stop()
