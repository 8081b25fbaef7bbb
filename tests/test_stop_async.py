"""The stop contract through the async API, on asyncio and trio."""

from __future__ import annotations

import gc
import threading
import time

import anyio
import pytest

from abstract_client import (
    LLM,
    AbortController,
    AbortSignal,
    GenerationCancelledError,
)
from abstract_client.testing import FakeServer

from .helpers import press_when

pytestmark = pytest.mark.anyio
SERVER_SEES_EOF_S = 1.0


async def test_preset_signal_sends_nothing(server: FakeServer, llm: LLM) -> None:
    with pytest.raises(GenerationCancelledError):
        await llm.agenerate("x", signal=AbortSignal.abort())
    with pytest.raises(GenerationCancelledError):
        async with llm.astream("x", signal=AbortSignal.abort()) as stream:
            async for _ in stream:
                pass
    await anyio.sleep(0.05)
    assert server.connections == 0


async def test_abort_controller_while_waiting_for_headers(server: FakeServer, llm: LLM) -> None:
    server.behavior.prefill_delay = 30
    controller = AbortController()
    async with anyio.create_task_group() as tg:

        async def stop() -> None:
            await anyio.sleep(0.2)
            controller.abort()

        tg.start_soon(stop)
        with pytest.raises(GenerationCancelledError) as info:
            await llm.agenerate("x", signal=controller.signal)
    assert info.value.reason == "user"
    seen = server.wait_for_disconnect(server.last)
    assert seen - (controller.signal.aborted_at or 0) < SERVER_SEES_EOF_S


async def test_abort_from_another_thread_mid_stream(server: FakeServer, llm: LLM) -> None:
    controller = AbortController()
    got = []
    with pytest.raises(GenerationCancelledError) as info:
        async with llm.astream("x", max_tokens=10_000, signal=controller.signal) as stream:
            async for chunk in stream:
                got.append(chunk.delta)
                if len(got) == 4:
                    threading.Thread(target=controller.abort).start()
    assert info.value.partial_text.startswith("".join(got))
    record = server.last
    seen = server.wait_for_disconnect(record)
    assert record.tokens_sent_after(seen) == 0


async def test_threading_event_in_async_code(server: FakeServer, llm: LLM) -> None:
    server.behavior.prefill_delay = 30
    event = threading.Event()
    press = press_when(lambda: server.requests(), event.set)  # the server holds it, in its prompt
    with pytest.raises(GenerationCancelledError):
        await llm.agenerate("x", cancel_event=event)
    server.wait_for_disconnect(server.last)
    press.wait()


async def test_framework_cancellation_is_reraised_unchanged(server: FakeServer, llm: LLM) -> None:
    """An enclosing cancel scope (trio) / task cancel (asyncio, via anyio) severs the connection
    and its own cancellation exception propagates; it is never turned into our error."""
    server.behavior.prefill_delay = 30
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def stop() -> None:
                await anyio.sleep(0.2)
                scope.cancel()

            tg.start_soon(stop)
            await llm.agenerate("x")
            pytest.fail("not reached")  # pragma: no cover
    assert scope.cancelled_caught  # the framework's exception reached its own scope
    record = server.last
    server.wait_for_disconnect(record)  # raises unless the server saw the connection close
    assert record.headers_sent_at is None  # it was still "processing the prompt"
    assert llm.in_flight == []


async def test_framework_cancellation_mid_stream(server: FakeServer, llm: LLM) -> None:
    with anyio.move_on_after(0.3) as scope:
        async with llm.astream("x", max_tokens=10_000) as stream:
            async for _ in stream:
                pass
    assert scope.cancelled_caught
    server.wait_for_disconnect(server.last)


async def test_break_out_of_async_for_closes_at_once_without_gc(server: FakeServer, llm: LLM) -> None:
    gc.disable()
    try:
        i = 0
        async for _ in llm.astream("x", max_tokens=10_000):
            i += 1
            if i == 3:
                stop_at = time.perf_counter()
                break
        seen = server.wait_for_disconnect(server.last, timeout=2)
        assert seen - stop_at < SERVER_SEES_EOF_S
        assert llm.in_flight == []
    finally:
        gc.enable()


async def test_cancel_all_and_request_ids(server: FakeServer, llm: LLM) -> None:
    server.behavior.prefill_delay = 30
    outcomes: list[str] = []

    async def one(i: int) -> None:
        try:
            await llm.agenerate("x", request_id=f"r{i}")
        except GenerationCancelledError as exc:
            outcomes.append(f"{exc.request_id}:{exc.reason}")

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(one, i)
        while len(llm.in_flight) < 5:
            await anyio.sleep(0.01)
        with pytest.raises(ValueError):
            await llm.agenerate("dup", request_id="r0")  # a duplicate in-flight id is refused
        assert llm.cancel_all("shutdown") == 5
    assert sorted(outcomes) == [f"r{i}:shutdown" for i in range(5)]


async def test_signal_wait_async(anyio_backend: str) -> None:
    controller = AbortController()
    threading.Timer(0.05, controller.abort, args=("done",)).start()
    with anyio.fail_after(5):
        await controller.signal.wait_async()
    assert controller.signal.reason == "done"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_asyncio_task_cancel_propagates_cancelled_error(server: FakeServer, llm: LLM) -> None:
    import asyncio

    server.behavior.prefill_delay = 30
    task = asyncio.ensure_future(llm.agenerate("x"))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()  # the task ends cancelled, not with our error
    server.wait_for_disconnect(server.last)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_move_on_after(server: FakeServer, llm: LLM) -> None:
    import trio

    server.behavior.prefill_delay = 30
    with trio.move_on_after(0.2) as scope:
        await llm.agenerate("x")
    assert scope.cancelled_caught
    server.wait_for_disconnect(server.last)


async def test_a_close_from_another_task_during_a_pull_closes_the_lanes_stream_in_order(
    server: FakeServer, llm: LLM, caplog: pytest.LogCaptureFixture
) -> None:
    """Task A waits on the stream's next chunk (the lane's generator is running); task B stops
    the stream and closes it at once — a sync caller's ``close()`` after its stop was handed
    over does this, while the loop still unwinds the pull it left. The lane's generator was
    closed under A's feet — ``aclose(): asynchronous generator is already running``, swallowed —
    and stayed open, its connection unreleased. Now B's close waits for A's pull to end (the stop
    ended it), and the generator is closed once, in order."""
    caplog.set_level("DEBUG", "abstract_client")
    server.behavior.token_delay = 0.3
    pulling = anyio.Event()
    outcome: list[BaseException] = []
    stream = llm.astream("x", max_tokens=10_000)
    await stream.__anext__()
    source = stream._source
    assert source is not None

    async def pull() -> None:
        # B runs once A waits inside the lane's read (chunks already buffered come first)
        pulling.set()
        try:
            while True:
                await stream.__anext__()
        except BaseException as exc:  # what A sees is asserted below
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(pull)
        await pulling.wait()
        stream.cancel()  # the caller's stop: it severs at once, A's read has yet to see it
        await stream.aclose()
    assert outcome and isinstance(outcome[0], GenerationCancelledError), outcome
    assert source.ag_frame is None, "the lane's stream was never closed"
    assert not [r for r in caplog.records if "already running" in r.getMessage() + str(r.exc_info)]
    assert server.wait_for_disconnect(server.last) > 0
    assert stream.state == "done"
