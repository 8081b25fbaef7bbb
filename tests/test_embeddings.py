"""Embeddings and token counting through the contract, on every HTTP lane's fake: results in
input order, client-side batching, a stop between batches keeping the finished vectors, a stop
inside a batch severing that request (the server's own disconnect record)."""

from __future__ import annotations

import math
import threading
import time

import anyio
import pytest

from abstract_client import (
    LLM,
    AbortController,
    EmbeddingResult,
    GenerationCancelledError,
    GenerationTimeoutError,
    ModelNotFoundError,
    NotSupportedError,
    ProviderProtocolError,
)
from abstract_client.testing import FakeServer

from .helpers import loop_settled, press_when

TEXTS = [f"text number {i}" for i in range(10)]


def embed_path(lane: str) -> str:
    return "/api/embed" if lane == "ollama" else "/v1/embeddings"


def test_vectors_in_input_order_across_batches(server: FakeServer, llm: LLM, lane: str) -> None:
    result = llm.embed(TEXTS, batch_size=3)
    assert isinstance(result, EmbeddingResult)
    assert len(result.vectors) == 10 and all(len(v) == 8 for v in result.vectors)
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-6) for v in result.vectors)
    # in order: each vector is the one the same text gets alone
    assert [llm.embed(t).vectors[0] for t in TEXTS[:4]] == result.vectors[:4]
    assert result.vectors[0] != result.vectors[1]
    batches = [r.body["input"] for r in server.requests(embed_path(lane))[:4]]
    assert batches == [TEXTS[0:3], TEXTS[3:6], TEXTS[6:9], TEXTS[9:10]]  # 4 requests of <= 3
    assert result.usage is not None and result.usage.prompt_tokens == 30
    assert llm.in_flight == []


@pytest.mark.anyio
async def test_async_embed_and_dimensions(server: FakeServer, llm: LLM, anyio_backend: str) -> None:
    result = await llm.aembed(["a", "b"], dimensions=4)
    assert [len(v) for v in result.vectors] == [4, 4]
    assert server.last.body.get("dimensions") == 4


def test_stop_between_batches_keeps_the_finished_vectors(server: FakeServer, llm: LLM, lane: str) -> None:
    server.behavior.embed_delay = 0.02  # 3 inputs a batch: ~60 ms a batch
    controller = AbortController()
    # pressed once the server has answered two batches: between batches or inside the third
    press = press_when(lambda: len([r for r in server.requests() if r.completed]) >= 2, controller.abort)
    with pytest.raises(GenerationCancelledError) as info:
        llm.embed([f"t{i}" for i in range(300)], batch_size=3, signal=controller.signal)
    press.wait()
    err = info.value
    done = err.partial_embeddings
    assert done is not None and 0 < len(done) < 300 and len(done) % 3 == 0  # whole batches only
    assert done == llm.embed([f"t{i}" for i in range(len(done))], batch_size=50).vectors  # in order
    requests = server.requests(embed_path(lane))
    severed = [r for r in requests if r.disconnected_at is not None]
    sent_after_stop = [r for r in requests if r.received_at > (controller.signal.aborted_at or 0) + 0.05]
    assert len(severed) <= 1  # the batch in flight, if any, was severed (the server saw it go)
    assert len([r for r in requests if r.completed]) >= len(done) // 3
    assert not [r for r in sent_after_stop if r not in requests[-1:]], "a batch was sent after the stop"
    assert llm.in_flight == [] and loop_settled(llm)  # the loop releases right behind the raise


def test_stop_inside_one_big_batch_severs_it(server: FakeServer, llm: LLM, lane: str) -> None:
    server.behavior.embed_delay = 0.01
    event = threading.Event()
    t0 = time.perf_counter()
    press = press_when(lambda: server.last.tokens_sent >= 5, event.set)  # inside the batch, by the server's count
    with pytest.raises(GenerationCancelledError) as info:
        llm.embed([f"t{i}" for i in range(2000)], batch_size=2000, cancel_event=event)
    assert time.perf_counter() - press.wait() < 5  # not the 20 s the batch would take
    assert info.value.partial_embeddings == []  # the one batch was in flight: nothing finished
    record = server.requests(embed_path(lane))[-1]
    seen = server.wait_for_disconnect(record)
    assert 0 < record.tokens_sent < 2000  # the server stopped "computing" mid-batch
    assert seen - t0 < 5


def test_preset_stop_sends_nothing(server: FakeServer, llm: LLM, lane: str) -> None:
    event = threading.Event()
    event.set()
    with pytest.raises(GenerationCancelledError) as info:
        llm.embed(TEXTS, cancel_event=event)
    assert info.value.partial_embeddings == []
    assert server.requests(embed_path(lane)) == []


def test_errors_are_typed_and_keep_the_finished_vectors(server: FakeServer, llm: LLM, lane: str) -> None:
    with pytest.raises(ModelNotFoundError):
        llm.embed("x", model="no-such-model")
    # batch 1 succeeds, batch 2 gets a body that is no embeddings answer: batch 1's vectors stay
    before = len(server.requests(embed_path(lane)))
    real = server.route

    def flaky(method: str, path: str):  # type: ignore[no-untyped-def]
        handler = real(method, path)
        if path == embed_path(lane) and len(server.requests(path)) > before + 1:
            return lambda conn, record: conn.send_json(200, {"unexpected": True})
        return handler

    server.route = flaky  # type: ignore[method-assign]
    with pytest.raises(ProviderProtocolError) as info:
        llm.embed(["a", "b", "c", "d"], batch_size=2)
    assert info.value.partial_embeddings is not None and len(info.value.partial_embeddings) == 2


def test_deadline_covers_every_batch(server: FakeServer, llm: LLM) -> None:
    server.behavior.embed_delay = 0.05
    with pytest.raises(GenerationTimeoutError) as info:
        llm.embed([f"t{i}" for i in range(100)], batch_size=2, timeout=0.5)
    assert info.value.kind == "total"
    assert info.value.partial_embeddings is not None and len(info.value.partial_embeddings) < 100


def test_count_tokens_without_a_tokenize_route_is_not_supported(server: FakeServer, llm: LLM, lane: str) -> None:
    if lane == "openai-compatible":
        with pytest.raises(NotSupportedError):
            llm.count_tokens("hello")
        return
    with pytest.raises(NotSupportedError):  # Ollama and LM Studio have no tokenize route
        llm.count_tokens(messages=[{"role": "user", "content": "hello"}])


def test_embed_input_validation(llm: LLM) -> None:
    with pytest.raises(TypeError):
        llm.embed([1, 2])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        llm.embed("x", batch_size=0)
    with pytest.raises(ValueError):
        llm.count_tokens()


@pytest.mark.anyio
async def test_framework_cancellation_of_an_embed(server: FakeServer, llm: LLM, anyio_backend: str) -> None:
    server.behavior.embed_delay = 0.05  # 100 inputs: 5 s of "compute"
    before = len(server.records)
    scope = anyio.CancelScope()

    async def embed() -> None:
        with scope:
            await llm.aembed([f"t{i}" for i in range(100)], batch_size=100)

    async with anyio.create_task_group() as tg:
        tg.start_soon(embed)
        while len(server.records) <= before:  # the server holds the request (not a timer: load)
            await anyio.sleep(0.005)
        scope.cancel()
    assert scope.cancelled_caught
    server.wait_for_disconnect(server.records[before])
    assert llm.in_flight == []
