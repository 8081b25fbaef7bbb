"""The stop's MECHANISM, not only its result (bounded, never timed tightly).

A stop could end in the right error for the wrong reason: the loop unwinding a read some time
later, a socket closed by GC, a retry that happened to fail. These tests hold the event loop that
carries the call (``LoopHold``: a callback that sleeps on it) and stop from another thread. Then
only the stopping thread can be doing the work, and we check what it did:

* the kernel's TCP state of the call's socket right after ``set()``/``abort()`` returns: our FIN
  is already sent (``shutdown()`` ran in the stopping thread, synchronously);
* the server saw EOF while the loop was still held;
* a blocked sync caller raised while the loop was still held (the stop woke it itself).

"Never retried" counts the provider's attempts and the server's connections, not only requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import httpx
import pytest

from abstract_client import (
    LLM,
    AbortController,
    GenerationCancelledError,
    ServerUnavailableError,
    create_llm,
)
from abstract_client.contract.call import Call, CallSpec
from abstract_client.contract.retry import RetryPolicy
from abstract_client.contract.run import with_retries
from abstract_client.stopping.loop import loop_caller
from abstract_client.stopping.token import InflightRegistry, StopToken
from abstract_client.testing import FakeServer
from abstract_client.types import GenerationRequest, Timeout

from .helpers import FIN_SENT, LoopHold, guard_of, loop_settled, press_when, tcp_state, wait_until

HOLD_S = 1.5  # how long the loop is held: every ordering below has this much margin
ANSWER = "".join(f"tok{i} " for i in range(1000))  # the fake's endless answer: partial text is a prefix


class Stopper(threading.Thread):
    """Waits for the call to be streaming at the server, holds the loop, then stops from here."""

    def __init__(self, llm: LLM, server: FakeServer, request_id: str, stop: Any, call_soon: Any) -> None:
        super().__init__(daemon=True)
        self.llm, self.server, self.request_id, self.stop_fn, self.call_soon = llm, server, request_id, stop, call_soon
        self.hold = LoopHold(HOLD_S)
        self.state: int | None = None
        self.stopped_at = 0.0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            assert wait_until(lambda: self.request_id in self.llm.in_flight, 10)
            record = self.server.wait_for_request(timeout=10)
            assert wait_until(lambda: record.tokens_sent >= 3, 10)  # the answer is flowing
            sock = guard_of(self.llm, self.request_id)._sock
            assert sock is not None
            self.call_soon(self.hold)
            assert self.hold.started.wait(10)
            self.stopped_at = time.perf_counter()
            self.stop_fn()
            self.state = tcp_state(sock)  # the loop is held: nobody else can have touched it
        except BaseException as exc:
            self.failure = exc
            self.stop_fn()  # let the caller go: check() reports the failure

    def check(self, server: FakeServer) -> float:
        """Assert the mechanism; return when the loop was let go."""
        self.join(30)
        assert self.failure is None, self.failure
        free_at = self.hold.wait_free()
        assert self.state in FIN_SENT, f"TCP state {self.state} right after the stop: not severed by the stopper"
        seen = server.wait_for_disconnect(server.records[0], timeout=10)
        assert self.stopped_at <= seen < free_at, "the server saw EOF only after the loop was free"
        return free_at


@pytest.mark.parametrize("how", ["generate", "stream"])
@pytest.mark.parametrize("source", ["event", "abort"])
def test_sync_stop_with_the_loop_held_severs_and_wakes_from_the_stopping_thread(
    server: FakeServer, llm: LLM, how: str, source: str
) -> None:
    server.behavior.token_delay = 0.01
    event, controller = threading.Event(), AbortController()
    stop = event.set if source == "event" else controller.abort
    kwargs: dict[str, Any] = {"cancel_event": event} if source == "event" else {"signal": controller.signal}
    portal_loop = llm._portal.loop
    stopper = Stopper(llm, server, "held", stop, portal_loop.call_soon_threadsafe)
    stopper.start()
    with pytest.raises(GenerationCancelledError) as info:
        if how == "generate":
            llm.generate("x", max_tokens=100_000, request_id="held", **kwargs)
        else:
            for _ in llm.stream("x", max_tokens=100_000, request_id="held", **kwargs):
                pass
    raised_at = time.perf_counter()
    free_at = stopper.check(server)
    assert raised_at < free_at, "the sync caller waited for the loop instead of being woken by the stop"
    assert info.value.__cause__ is None  # rule 4: woken by the stop itself, before anything failed
    assert info.value.reason == "user" and ANSWER.startswith(info.value.partial_text)
    assert llm.in_flight == [] and loop_settled(llm)  # the loop closed up behind the caller


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["generate", "stream"])
async def test_async_stop_with_the_loop_held_severs_from_the_stopping_thread(
    server: FakeServer, llm: LLM, how: str
) -> None:
    server.behavior.token_delay = 0.01
    event = threading.Event()
    stopper = Stopper(llm, server, "held", event.set, loop_caller())
    stopper.start()
    with pytest.raises(GenerationCancelledError) as info:
        if how == "generate":
            await llm.agenerate("x", max_tokens=100_000, request_id="held", cancel_event=event)
        else:
            async with llm.astream("x", max_tokens=100_000, request_id="held", cancel_event=event) as stream:
                async for _ in stream:
                    pass
    stopper.check(server)
    assert info.value.reason == "user" and ANSWER.startswith(info.value.partial_text)
    cause = info.value.__cause__  # rule 4: the read the sever ended, or none (a chunk already in hand)
    assert cause is None or isinstance(cause, httpx.HTTPError), repr(cause)
    assert llm.in_flight == []


# -- never retried: attempts and connections ----------------------------------------------------------


class CountingAttempts:
    """Wraps a provider's stream/complete routes to count the contract's attempts."""

    def __init__(self, llm: LLM) -> None:
        self.attempts = 0
        provider = llm.provider
        real_stream, real_complete = provider.stream, provider.complete

        def stream(request: Any, ctx: Any) -> AsyncGenerator[Any, None]:
            self.attempts += 1
            return real_stream(request, ctx)

        async def complete(request: Any, ctx: Any) -> Any:
            self.attempts += 1
            return await real_complete(request, ctx)

        provider.stream = stream  # type: ignore[method-assign]
        provider.complete = complete  # type: ignore[method-assign]


@pytest.mark.parametrize("phase", ["prefill", "decode", "backoff"])
@pytest.mark.parametrize("how", ["generate", "plain", "stream"])
def test_a_stopped_call_makes_one_attempt_on_one_connection(
    server: FakeServer, lane: str, phase: str, how: str
) -> None:
    """Retries on (5 of them, no backoff to speak of): a stop in any phase is one attempt, one
    connection, one request — counted at the provider and at the server."""
    if phase == "prefill":
        server.behavior.prefill_delay = 30
    elif phase == "decode":
        server.behavior.token_delay = 0.01
    else:  # the first attempt is refused with a retryable 503; the stop lands in its backoff
        server.behavior.retry_after = 30
        server.inject("loading_503", 100)
    llm = create_llm(lane, "fake-model", base_url=server.base_url, max_retries=5)
    counting = CountingAttempts(llm)
    event = threading.Event()
    try:

        def stop_when_ready() -> None:
            record = server.wait_for_request(timeout=10)
            if phase == "decode":
                wait_until(lambda: record.tokens_sent >= 3, 10)
            elif phase == "backoff":
                wait_until(lambda: record.status == 503, 10)
                time.sleep(0.05)  # inside the 30 s backoff
            event.set()

        stopper = threading.Thread(target=stop_when_ready, daemon=True)
        stopper.start()
        with pytest.raises(GenerationCancelledError):
            if how == "stream":
                for _ in llm.stream("x", max_tokens=100_000, cancel_event=event):
                    pass
            else:
                llm.generate("x", max_tokens=100_000, cancel_event=event, plain_route=how == "plain")
        stopper.join(10)
        time.sleep(0.5)  # a retry right behind the stop would have connected by now
        assert counting.attempts == 1
        assert server.connections == 1
        assert len(server.requests()) == 1
    finally:
        llm.close()


@pytest.mark.anyio
async def test_with_retries_never_retries_once_the_stop_is_set(anyio_backend: str) -> None:
    """Rule 6 on its own, no scope around it: an attempt that fails retryably after the stop was
    requested is not attempted again, even with a zero backoff."""
    from abstract_client.providers.openai_compatible import OpenAICompatibleProvider

    provider = OpenAICompatibleProvider(model="m", base_url="http://127.0.0.1:9")
    spec = CallSpec(
        provider=provider,
        request=GenerationRequest(messages=[], model="m"),
        timeout=Timeout(),
        retry=RetryPolicy(max_retries=5, base_delay=0.0),
    )
    call = Call(spec, StopToken("r"), InflightRegistry())
    attempts = 0

    async def attempt() -> None:
        nonlocal attempts
        attempts += 1
        call.token.stop("user")  # the stop arrives while this attempt fails
        raise ServerUnavailableError("connection refused", retry_after=0.0)

    with pytest.raises(ServerUnavailableError):
        await with_retries(call, attempt)
    assert attempts == 1


def test_a_retryable_failure_without_a_stop_is_retried(server: FakeServer, lane: str) -> None:
    """The counterpart, so the counts above can fail: the same 503 without a stop is retried."""
    server.behavior.retry_after = 0.01
    server.inject("loading_503", 2)
    with create_llm(lane, "fake-model", base_url=server.base_url, max_retries=5) as llm:
        counting = CountingAttempts(llm)
        assert llm.generate("x", max_tokens=2).content == "tok0 tok1 "
    assert counting.attempts == 3 and len(server.requests()) == 3


# -- rule 7 on the async path (the sync caller is woken by the stop itself, so only async code
#    can see the contract's own decision) -----------------------------------------------------------


def stop_inside_the_wire(llm: LLM, event: threading.Event, *, before: str | None) -> None:
    """Make the provider's routes request the caller's stop at an exact point, with no await
    between the request and the contract's next decision: before handing out the chunk whose
    text is ``before`` (None: once the stream has ended, or the plain answer has arrived)."""
    provider = llm.provider
    real_stream, real_complete = provider.stream, provider.complete

    async def stream(request: Any, ctx: Any) -> AsyncGenerator[Any, None]:
        source = real_stream(request, ctx)
        try:
            async for chunk in source:
                if before is not None and chunk.delta == before:
                    event.set()
                yield chunk
            if before is None:
                event.set()
        finally:
            await source.aclose()

    async def complete(request: Any, ctx: Any) -> Any:
        answer = await real_complete(request, ctx)
        event.set()
        return answer

    provider.stream = stream  # type: ignore[method-assign]
    provider.complete = complete  # type: ignore[method-assign]


@pytest.mark.anyio
async def test_rule7_a_stop_before_a_chunk_is_handed_out_wins(server: FakeServer, llm: LLM) -> None:
    event = threading.Event()
    stop_inside_the_wire(llm, event, before="tok3 ")
    got: list[str] = []
    with pytest.raises(GenerationCancelledError) as info:
        async with llm.astream("x", max_tokens=50, cancel_event=event) as stream:
            async for chunk in stream:
                got.append(chunk.delta)
    assert "".join(got) == "tok0 tok1 tok2 "  # the chunk that raced the stop was not handed out
    assert info.value.partial_text.startswith("tok0 tok1 tok2 ")


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["stream", "generate", "plain"])
async def test_rule7_a_stop_before_the_answer_is_handed_over_wins(server: FakeServer, llm: LLM, how: str) -> None:
    event = threading.Event()
    stop_inside_the_wire(llm, event, before=None)
    with pytest.raises(GenerationCancelledError) as info:
        if how == "stream":
            async with llm.astream("x", max_tokens=3, cancel_event=event) as stream:
                async for _ in stream:
                    pass
        else:
            await llm.agenerate("x", max_tokens=3, cancel_event=event, plain_route=how == "plain")
    assert info.value.reason == "user"
    if how != "plain":
        assert info.value.partial_text == "tok0 tok1 tok2 "  # the whole answer, kept, but not handed over


def test_the_retry_policy_refuses_a_stop_and_a_timeout_by_type() -> None:
    """Even a stop or a timeout that claims to be retryable (a provider's subclass setting the
    flag) is never retried: the type decides first."""
    from abstract_client import GenerationTimeoutError

    policy = RetryPolicy(max_retries=5)
    for err in (GenerationCancelledError("stopped"), GenerationTimeoutError("late", kind="total")):
        err.retryable = True
        assert policy.should_retry(err, 0) is False
    assert policy.should_retry(ServerUnavailableError("loading", retry_after=1.0), 0) is True


@pytest.mark.anyio
async def test_async_stop_during_a_backoff_ends_the_sleep(server: FakeServer, lane: str) -> None:
    """An async caller has no wake hook: only the stop cancelling the step's scope ends a 30 s
    backoff sleep (rule 3 + 6)."""
    server.behavior.retry_after = 30
    server.inject("loading_503", 10)
    llm = create_llm(lane, "fake-model", base_url=server.base_url, max_retries=5)
    event = threading.Event()
    try:
        async with anyio.create_task_group() as tg:

            async def stop_in_backoff() -> None:
                record = await anyio.to_thread.run_sync(server.wait_for_request)
                while record.status != 503:
                    await anyio.sleep(0.005)
                await anyio.sleep(0.05)
                event.set()

            tg.start_soon(stop_in_backoff)
            with anyio.fail_after(10), pytest.raises(GenerationCancelledError):  # 10 s << the 30 s backoff
                await llm.agenerate("x", cancel_event=event)
        assert len(server.requests()) == 1 and server.connections == 1
    finally:
        await llm.aclose()


@pytest.mark.parametrize("how", ["generate", "stream", "embed"])
def test_one_error_per_stop_on_the_sync_path(
    server: FakeServer, llm: LLM, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync caller builds the stop's error in its own thread; the loop unwinding behind it
    builds none (it raises ``SyncStop``), so exactly one ``GenerationCancelledError`` exists."""
    built: list[GenerationCancelledError] = []
    real_init = GenerationCancelledError.__init__

    def counting_init(self: GenerationCancelledError, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(GenerationCancelledError, "__init__", counting_init)
    server.behavior.token_delay = 0.01
    server.behavior.embed_delay = 0.02
    event = threading.Event()
    # mid-answer (or mid-batches), by the server's record
    press = press_when(lambda: len(server.requests()) >= 2 or server.last.tokens_sent >= 3, event.set)
    with pytest.raises(GenerationCancelledError) as info:
        if how == "generate":
            llm.generate("x", max_tokens=100_000, cancel_event=event)
        elif how == "stream":
            for _ in llm.stream("x", max_tokens=100_000, cancel_event=event):
                pass
        else:
            llm.embed([f"t{i}" for i in range(300)], batch_size=3, cancel_event=event)
    press.wait()
    assert llm.in_flight == [] and loop_settled(llm)  # the loop has unwound behind the caller
    assert built == [info.value]
