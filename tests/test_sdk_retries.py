"""abstract_client.sdk where the SDK or the framework waits, not the transport: an SDK's retry
sleep (a 429's ``Retry-After``, the backoff after a refused connection), an agent's tool, a
request id outliving its block. A stop there releases the caller at once, typed, and the server
records no request after it (its own record: each request's arrival). An older openai-python,
which wraps every foreign error: tests/test_sdk_frameworks_openai2.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import anyio
import openai
import pytest

from abstract_client import AbortSignal, GenerationCancelledError, sdk
from abstract_client.testing import FakeOpenAIServer

from .helpers import press_when

CHAT = [{"role": "user", "content": "Tell me a long story"}]
RELEASED = 2.0  # generous: the release is milliseconds; every sleep stopped here is 3 s or more
RETRY_AFTER = 20  # what the server asks the SDK to wait


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=2000) as s:
        yield s


def sent_after(server: FakeOpenAIServer, t: float) -> int:
    return sum(1 for r in server.requests() if r.received_at > t)


def answered_a_while_ago(server: FakeOpenAIServer, status: int, seconds: float = 0.5) -> Callable[[], bool]:
    """Ready once the server answered ``status`` and ``seconds`` passed (the SDK asleep by then)."""

    def ready() -> bool:
        done = [r for r in server.requests() if r.status == status and r.headers_sent_at is not None]
        return bool(done) and time.perf_counter() - done[-1].headers_sent_at > seconds  # type: ignore[operator]

    return ready


def sync_call(kind: str, server: FakeOpenAIServer, **options: Any) -> Callable[[], Any]:
    if kind == "openai":
        client = openai.OpenAI(base_url=server.base_url, api_key="k", http_client=sdk.http_client(), **options)
        return lambda: client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=3)  # type: ignore[arg-type]
    messages = anthropic.Anthropic(base_url=server.url, api_key="k", http_client=sdk.http_client(), **options)
    return lambda: messages.messages.create(model="fake-model", max_tokens=3, messages=CHAT)  # type: ignore[arg-type]


def async_call(kind: str, server: FakeOpenAIServer) -> Callable[[], Any]:
    if kind == "openai":
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=sdk.async_http_client())
        return lambda: client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=3)  # type: ignore[arg-type]
    messages = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", http_client=sdk.async_http_client())
    return lambda: messages.messages.create(model="fake-model", max_tokens=3, messages=CHAT)  # type: ignore[arg-type]


# -- an SDK's retry sleep ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_stop_during_a_retry_after_sleep_releases_the_caller_at_once(server: FakeOpenAIServer, kind: str) -> None:
    """A 429 asking for 20 s: the SDK sleeps; a stop pressed in that sleep ends it, and the retry
    it then sends is refused before a byte leaves: one request, the typed error."""
    server.behavior.retry_after = RETRY_AFTER
    server.inject("status_429", 3)
    call = sync_call(kind, server)
    stop = threading.Event()
    press = press_when(answered_a_while_ago(server, 429), stop.set)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        call()
    pressed = press.wait()
    assert time.perf_counter() - pressed < RELEASED
    assert info.value.reason == "user"
    assert len(server.requests()) == 1 and sent_after(server, pressed) == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "anyio_backend"), [("openai", "asyncio"), ("openai", "trio"), ("anthropic", "asyncio")]
)
async def test_a_stop_during_an_async_retry_sleep_releases_the_caller_at_once(
    server: FakeOpenAIServer, kind: str, anyio_backend: str
) -> None:
    server.behavior.retry_after = RETRY_AFTER
    server.inject("status_429", 3)
    call = async_call(kind, server)
    stop = threading.Event()
    press = press_when(answered_a_while_ago(server, 429), stop.set)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):  # a plain `with`, in async code
        await call()
    pressed = press.wait()
    assert time.perf_counter() - pressed < RELEASED
    assert len(server.requests()) == 1 and sent_after(server, pressed) == 0


def test_a_stop_during_the_backoff_after_a_refused_connection_releases_at_once(server: FakeOpenAIServer) -> None:
    """The backoff after refused connections (openai: 0.5 s doubling, 8 s at most): pressed once
    four were refused, in the 3-4 s sleep before the fifth."""
    server.inject("refuse", 20)
    call = sync_call("openai", server, max_retries=10)
    stop = threading.Event()
    press = press_when(lambda: len(server.requests()) >= 4, stop.set, timeout=120)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        call()
    pressed = press.wait()
    assert time.perf_counter() - pressed < RELEASED
    assert sent_after(server, pressed) == 0


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_call_nobody_stopped_keeps_the_sdks_retry_policy(server: FakeOpenAIServer, kind: str) -> None:
    """Inside a block nobody stops, the SDK waits what the server asked (1 s) and retries."""
    server.behavior.retry_after = 1
    server.inject("status_429", 1)
    call = sync_call(kind, server)
    with sdk.stop_on(threading.Event(), 60.0):
        call()
    first, second = server.requests()
    assert second.received_at - first.headers_sent_at >= 0.9  # type: ignore[operator]


# -- async with: the block's work ends where it stands -------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_stop_while_a_tool_runs_ends_an_async_block_at_once(
    server: FakeOpenAIServer, anyio_backend: str
) -> None:
    """An agent's step: a call, then a tool that takes 30 s, then the next call. A stop pressed
    while the tool runs ends the block there (``async with``), typed, with the source's reason;
    the next call is never sent."""
    call = async_call("openai", server)
    tool_started = threading.Event()

    async def agent_step() -> None:
        await call()
        tool_started.set()
        await anyio.sleep(30)  # the tool
        await call()

    stop = threading.Event()
    press = press_when(tool_started.is_set, stop.set)
    with pytest.raises(GenerationCancelledError) as info:
        async with sdk.stop_on(stop, "agent-1"):
            await agent_step()
    pressed = press.wait()
    assert time.perf_counter() - pressed < RELEASED
    assert info.value.reason == "user" and info.value.partial_text == "" and info.value.request_id == "agent-1"
    assert len(server.requests()) == 1

    # a deadline and cancel(id) end it the same way, with their reasons
    with pytest.raises(GenerationCancelledError) as info:
        async with sdk.stop_on(0.5):
            await agent_step()
    assert info.value.reason == "timeout"
    press = press_when(lambda: len(server.requests()) >= 3, lambda: sdk.cancel("agent-2"))
    with pytest.raises(GenerationCancelledError) as info:
        async with sdk.stop_on("agent-2"):
            await agent_step()
    assert time.perf_counter() - press.wait() < RELEASED and info.value.reason == "user"
    assert len(server.requests()) == 3


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_async_block_stopped_mid_answer_raises_the_requests_error(
    server: FakeOpenAIServer, anyio_backend: str
) -> None:
    """A stop during a stream: the block's error is the request's, with its text; a block nobody
    stopped returns as it would, and a block is entered once."""
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=sdk.async_http_client())
    signal = AbortSignal.timeout(60)
    seen: list[str] = []
    stop = threading.Event()
    with pytest.raises(GenerationCancelledError) as info:
        async with sdk.stop_on(stop, signal):
            stream = await client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)  # type: ignore[arg-type]
            async for chunk in stream:
                seen.append(chunk.choices[0].delta.content or "")
                if len(seen) == 5:
                    stop.set()
    assert info.value.partial_text.startswith("".join(seen)) and "".join(seen)
    stop = threading.Event()
    async with sdk.stop_on(stop):
        answer = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
    assert answer.choices[0].finish_reason == "length"
    block = sdk.stop_on(stop)
    with block, pytest.raises(RuntimeError, match="entered once"):
        block.__enter__()
    await client.close()


# -- a request id, whatever the block has become -------------------------------------------------


def test_cancel_by_id_reaches_a_stream_read_after_its_block_and_counts_what_it_stopped(
    server: FakeOpenAIServer,
) -> None:
    """A stream takes its sources when it is sent: ``cancel(id)`` stops it after the block ended,
    and says how many requests in flight it stopped (one here; none once nothing is held)."""
    client = openai.OpenAI(base_url=server.base_url, api_key="k", http_client=sdk.http_client())
    with sdk.stop_on("job-9"):
        stream = client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)  # type: ignore[arg-type]
    stopped: list[int] = []
    with pytest.raises(GenerationCancelledError) as info:
        for i, _ in enumerate(stream):
            if i == 3:
                stopped.append(sdk.cancel("job-9"))
    assert stopped == [1] and info.value.request_id == "job-9" and info.value.partial_text
    server.wait_for_disconnect(server.last, 5)
    assert sdk.cancel("job-9") == 0
    client.close()
