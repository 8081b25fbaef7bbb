"""abstract_client.sdk: the clients applications already use — openai-python, the anthropic SDK,
ollama-python, langchain-openai, installed from the registry as a user would — stopped through
their own calls, on the fakes' real sockets.

The evidence is the server's: its disconnect record, the tokens it sent after the Stop, and how
many requests it saw (each SDK left at its default ``max_retries``: a stop is never retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import anyio
import httpx
import httpx2
import ollama
import openai
import pytest
from langchain_openai import ChatOpenAI

from abstract_client import AbortController, AbortSignal, GenerationCancelledError, sdk
from abstract_client.sdk.exchange import Exchange
from abstract_client.stopping.event_hook import listeners_on
from abstract_client.stopping.token import StopToken
from abstract_client.testing import FakeOllamaServer, FakeOpenAIServer

from .helpers import press_when

CHAT = [{"role": "user", "content": "Tell me a long story"}]
LONG = 2000  # tokens, 10 ms each: an answer nobody waits for to the end
RELEASED = 2.0  # generous: the release is milliseconds (benchmarks/bench_sdk.py)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=LONG) as s:
        yield s


@pytest.fixture
def ollama_server() -> Iterator[FakeOllamaServer]:
    with FakeOllamaServer(token_delay=0.01, default_max_tokens=LONG) as s:
        yield s


def sent(server: Any, path: str | None = None) -> int:
    return len(server.requests(path))


def after_tokens(server: Any, n: int) -> Any:
    """Ready once the server has sent (or, not streaming, decoded) ``n`` tokens of the next
    request's answer."""
    before = sent(server)
    return lambda: sent(server) > before and server.last.tokens_sent >= n


_read: list[bytearray] = []  # what each exchange's caller side has read of its body, newest last


@pytest.fixture(autouse=True)
def client_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record the body bytes the library has read for each request (the server's count of what it
    sent is no proof that the caller's side read it yet: a loaded machine lags behind)."""
    original = Exchange.body

    async def body(self: Exchange, response: httpx.Response) -> AsyncIterator[bytes]:
        read = bytearray()
        _read.append(read)
        async with contextlib.aclosing(original(self, response)) as pieces:
            async for piece in pieces:
                read += piece
                yield piece

    monkeypatch.setattr(Exchange, "body", body)


def after_read(server: Any, n: int) -> Any:
    """Ready once the library has read ``n`` tokens of the next request's streamed answer: a stop
    then keeps at least their text, however the race between the server and the reader falls."""
    before, token = len(_read), f"tok{n - 1} ".encode()
    return lambda: len(_read) > before and token in _read[-1]


def assert_stopped_server_side(server: Any, pressed_at: float) -> None:
    """The server saw the connection go, and decoded at most a few tokens after the Stop."""
    record = server.last
    server.wait_for_disconnect(record, 5)
    assert record.tokens_sent_after(pressed_at) < 50, record.tokens_sent_after(pressed_at)
    assert not record.completed


def openai_client(server: FakeOpenAIServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="k", http_client=sdk.http_client())


# -- openai-python -------------------------------------------------------------------------------


def test_an_openai_call_not_streamed_stops_from_another_thread(server: FakeOpenAIServer) -> None:
    client = openai_client(server)
    stop = threading.Event()
    press = press_when(after_read(server, 5), stop.set)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    released = time.perf_counter() - press.wait()
    assert released < RELEASED
    err = info.value
    assert err.reason == "user" and err.cancel_to_stop_ms is not None
    # the plain call rode the stream (folded back when nobody stops it): its text so far is kept
    assert err.partial_text.startswith("tok0 tok1 tok2 tok3 tok4 ")
    assert server.last.body["stream"] is True
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1  # max_retries=2, the SDK's default: the stop was not retried
    assert listeners_on(stop) == 0  # the request let go of its source
    client.close()


def test_an_openai_stream_stops_and_keeps_the_text_the_caller_had(server: FakeOpenAIServer) -> None:
    client = openai_client(server)
    stop = threading.Event()
    seen: list[str] = []
    press = press_when(lambda: len(seen) >= 5, stop.set)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        stream = client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)  # type: ignore[arg-type]
        for chunk in stream:
            seen.append(chunk.choices[0].delta.content or "")
    assert time.perf_counter() - press.wait() < RELEASED
    err = info.value
    assert err.partial_text.startswith("".join(seen)) and "tok3" in err.partial_text
    assert err.received_bytes > 0  # type: ignore[attr-defined]
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1
    client.close()


def test_a_stop_wakes_a_sync_caller_the_loop_cannot_reach(server: FakeOpenAIServer) -> None:
    """The sync caller is woken by the stop itself, and the server told by the stopping thread:
    neither waits for the loop thread the requests run on (held busy here for 3 s)."""
    from abstract_client.sdk.transports import _portal

    client = openai_client(server)
    stop = threading.Event()
    busy = threading.Event()

    def hold_the_loop() -> None:
        busy.set()
        time.sleep(3.0)

    def press() -> None:
        _portal.loop.call_soon_threadsafe(hold_the_loop)
        busy.wait(10)
        stop.set()

    pressed = press_when(after_tokens(server, 5), press)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    released = time.perf_counter()
    pressed.wait()
    assert busy.is_set()
    assert released - pressed.wait() < 2.5  # the loop is busy for 3 s after the press
    server.wait_for_disconnect(server.last, 2.5)
    client.close()


def test_a_stream_keeps_its_stop_after_the_block_and_a_later_call_has_none(server: FakeOpenAIServer) -> None:
    client = openai_client(server)
    stop = threading.Event()
    with sdk.stop_on(stop):
        stream = client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)  # type: ignore[arg-type]
    with pytest.raises(GenerationCancelledError):
        for i, _ in enumerate(stream):
            if i == 3:
                stop.set()  # the block has ended: the source was taken when the request was sent
    assert_stopped_server_side(server, time.perf_counter())
    answer = client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=3)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "tok0 tok1 tok2 "  # stop is still set: not this call's
    idle = threading.Event()
    with sdk.stop_on(idle):
        client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=3)  # type: ignore[arg-type]
        for _ in client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=3, stream=True):  # type: ignore[arg-type]
            pass
    assert listeners_on(idle) == 0  # calls that ended let go of their source
    client.close()


def test_a_stop_set_before_the_call_sends_nothing(server: FakeOpenAIServer) -> None:
    client = openai_client(server)
    for source in (AbortSignal.abort(), AbortSignal.any([AbortSignal.abort("gone")])):
        with pytest.raises(GenerationCancelledError), sdk.stop_on(source):
            client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    stop = threading.Event()
    stop.set()
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)  # type: ignore[arg-type]
    assert sent(server) == 0 and server.connections == 0
    client.close()


def test_a_deadline_and_a_request_id_stop_a_call(server: FakeOpenAIServer) -> None:
    client = openai_client(server)
    t0 = time.perf_counter()
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(0.3):
        client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    assert info.value.reason == "timeout" and 0.25 < time.perf_counter() - t0 < 0.3 + RELEASED
    press = press_when(after_tokens(server, 5), lambda: sdk.cancel("job-7"))
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on("job-7"):
        client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    assert info.value.request_id == "job-7"
    assert_stopped_server_side(server, press.wait())
    assert sdk.cancel("job-7") == 0  # nothing left under that id
    client.close()


def test_a_stopped_call_stays_stopped_whoever_retries_it(server: FakeOpenAIServer) -> None:
    """``cancel(id)`` stops the request in flight; the retries a framework sends next in the same
    block (a retry layer that tries again on any error, as LangChain's ``with_retry`` does) are
    refused before a byte is sent, with the same typed error: one request, never an answer. A
    cancel while nothing is in flight (a retry's sleep) stops what the block sends next."""
    client = openai_client(server)
    press = press_when(after_tokens(server, 5), lambda: sdk.cancel("job-1"))
    caught: list[GenerationCancelledError] = []
    with sdk.stop_on("job-1"):
        for _ in range(3):
            try:
                client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
            except GenerationCancelledError as err:
                caught.append(err)
    assert [e.reason for e in caught] == ["user"] * 3
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1
    with sdk.stop_on("job-2"):
        assert sdk.cancel("job-2") == 0  # nothing in flight
        with pytest.raises(GenerationCancelledError):
            client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)  # type: ignore[arg-type]
    assert sent(server) == 1
    # a stream its reader left is no stop of the block; a new block is a new call
    with sdk.stop_on("job-3"):
        with client.chat.completions.create(model="fake-model", messages=CHAT, stream=True, max_tokens=50) as stream:  # type: ignore[arg-type,call-overload]
            next(iter(stream))
        answer = client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=3)  # type: ignore[arg-type]
    assert answer.choices[0].finish_reason == "length"
    client.close()


class _FrameworkError(Exception):
    """What a framework wraps whatever it meets in (instructor's retry exception, LiteLLM's)."""


def test_a_wrapped_stop_is_the_typed_error_at_the_blocks_edge(server: FakeOpenAIServer) -> None:
    client = openai_client(server)
    stop = threading.Event()
    press = press_when(after_read(server, 5), stop.set)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        try:
            for _ in client.chat.completions.create(model="fake-model", messages=CHAT, stream=True):  # type: ignore[arg-type,call-overload]
                pass
        except Exception as exc:
            raise _FrameworkError("the call failed") from exc
    assert isinstance(info.value.__cause__, _FrameworkError) and info.value.reason == "user"
    assert info.value.partial_text  # the first stopped request's, not an empty retry's
    assert_stopped_server_side(server, press.wait())
    with pytest.raises(_FrameworkError), sdk.stop_on(threading.Event()):  # no stop: as it is
        raise _FrameworkError("mine")
    client.close()

    async def in_a_task() -> None:
        aclient = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=sdk.async_http_client())
        with pytest.raises(GenerationCancelledError) as caught, sdk.stop_on("job-async"):
            try:
                stream = await aclient.chat.completions.create(model="fake-model", messages=CHAT, stream=True)  # type: ignore[arg-type,call-overload]
                async for _ in stream:
                    sdk.cancel("job-async")
            except Exception as exc:
                raise _FrameworkError("wrapped") from exc
        assert isinstance(caught.value.__cause__, _FrameworkError)
        await aclient.close()

    asyncio.run(in_a_task())


_LEAVER = """
import sys
import openai
from abstract_client import sdk

given = {} if sys.argv[2] == "default" else {"http_client": sdk.http_client(flavor=sys.argv[2])}
client = openai.OpenAI(base_url=sys.argv[1], api_key="k", **given)
stream = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True)
for i, _ in enumerate(stream):
    if i >= 3:
        break  # and the script ends, the stream never closed (as LiteLLM's wrapper leaves it)
"""


@pytest.mark.parametrize("flavor", ["httpx2", "httpx"])
def test_a_script_that_leaves_a_stream_open_exits_and_severs_it(server: FakeOpenAIServer, flavor: str) -> None:
    """Garbage collection at the interpreter's end closes the stream: it used to start a loop
    thread then and wait for it for ever (the process never exited). Now the script ends as it
    does with the SDK's default client (exit 0; CPython 3.13.0's collector crashes at that exit
    with the default client too), and the server sees the connection go."""

    def run(client: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", _LEAVER, server.base_url, client]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    default = run("default")
    started = time.monotonic()
    ours = run(flavor)
    assert time.monotonic() - started < 30
    assert ours.returncode == default.returncode, (ours.returncode, default.returncode, ours.stderr[-2000:])
    record = server.last
    server.wait_for_disconnect(record, 5)  # the server saw the connection go
    assert not record.completed


def test_nested_blocks_add_their_request_ids(server: FakeOpenAIServer) -> None:
    client = openai_client(server)
    press = press_when(after_tokens(server, 5), lambda: sdk.cancel("outer-job"))
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on("outer-job"), sdk.stop_on("inner-step"):
        client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    assert info.value.request_id == "inner-step"  # named by the innermost block
    assert_stopped_server_side(server, press.wait())
    assert sdk.cancel("outer-job") == sdk.cancel("inner-step") == 0
    client.close()


def test_the_responses_api_stream_stops_with_its_text(server: FakeOpenAIServer) -> None:
    client = openai_client(server)
    stop = threading.Event()
    deltas: list[str] = []
    press = press_when(lambda: len(deltas) >= 5, stop.set)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        for event in client.responses.create(model="fake-model", input="Tell me a long story", stream=True):
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
    assert info.value.partial_text.startswith("".join(deltas)) and deltas
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1
    client.close()


def test_an_outage_is_still_the_sdks_to_retry(server: FakeOpenAIServer) -> None:
    """A connection the server resets is not a stop: the SDK sees its own error class and
    retries as it always does (here: twice, then the answer)."""
    client = openai_client(server)
    server.inject("refuse", 2)
    answer = client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=3)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "tok0 tok1 tok2 "
    assert sent(server) == 3
    client.close()


def test_what_is_not_a_stop_is_the_sdks_own_error(server: FakeOpenAIServer) -> None:
    """A failure that is not a stop comes out as the flavour's own class, as from its default
    transport: a refused connection is ``httpx2.ConnectError``; the anthropic SDK calls a read
    that timed out a timeout."""
    from abstract_client.testing.processes import free_port

    with sdk.http_client() as http, pytest.raises(httpx2.ConnectError):
        http.get(f"http://127.0.0.1:{free_port()}/")
    server.inject("no_answer")
    client = anthropic.Anthropic(
        base_url=server.url, api_key="k", max_retries=0, timeout=0.5, http_client=sdk.http_client()
    )
    with pytest.raises(anthropic.APITimeoutError):
        client.messages.create(model="fake-model", max_tokens=5, messages=CHAT)  # type: ignore[arg-type]
    client.close()


def test_connections_are_reused_and_the_environment_proxy_is_the_transports_to_read(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("NO_PROXY", "")
    client = openai.OpenAI(
        base_url=server.base_url, api_key="k", max_retries=0, http_client=sdk.http_client(trust_env=False)
    )
    for _ in range(3):
        client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
    assert server.connections == 1
    client.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_async_openai_stops_by_signal_and_by_a_cancelled_task(
    server: FakeOpenAIServer, anyio_backend: str
) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=sdk.async_http_client())
    controller = AbortController()
    seen = 0
    with pytest.raises(GenerationCancelledError) as info:
        with sdk.stop_on(controller.signal):
            stream = await client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)  # type: ignore[arg-type]
            async for _ in stream:
                seen += 1
                if seen == 5:
                    controller.abort()
    assert info.value.partial_text and info.value.reason == "user"
    assert_stopped_server_side(server, time.perf_counter())
    with anyio.move_on_after(0.3):  # a task cancelled mid-call, not streamed
        await client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    assert_stopped_server_side(server, time.perf_counter())
    assert sent(server) == 2
    await client.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_an_async_blocks_stop_keeps_the_text_when_its_cancel_outruns_the_stop_thread(
    server: FakeOpenAIServer, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Stop thread tells the block's scope (a cancel, run on the loop) before it tells the
    request; a loaded machine can run the loop's cancel first. Here the Stop thread is held
    2 s between the two, every time: the request still ends as its own error, text kept."""
    stop_request = StopToken.stop
    loop_thread = threading.current_thread()

    def held(token: StopToken, *args: Any, **kwargs: Any) -> bool:
        if threading.current_thread() is not loop_thread:
            time.sleep(2.0)  # the Stop thread, preempted
        return stop_request(token, *args, **kwargs)

    monkeypatch.setattr(StopToken, "stop", held)
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=sdk.async_http_client())
    stop = threading.Event()
    press = press_when(after_read(server, 5), stop.set)
    with pytest.raises(GenerationCancelledError) as info:
        async with sdk.stop_on(stop):
            stream = await client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)  # type: ignore[arg-type]
            async for _ in stream:
                pass
    assert time.perf_counter() - press.wait() < 1.5  # the loop's cancel, not the held thread
    assert "tok4" in info.value.partial_text and info.value.reason == "user"
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1
    await client.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_stop_follows_the_call_into_a_thread(server: FakeOpenAIServer, anyio_backend: str) -> None:
    client = openai_client(server)
    stop = threading.Event()
    press = press_when(after_tokens(server, 5), stop.set)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        call = contextvars.copy_context().run  # as asyncio.to_thread and anyio.to_thread do
        await asyncio.to_thread(call, client.chat.completions.create, model="fake-model", messages=CHAT)
    assert_stopped_server_side(server, press.wait())
    client.close()


# -- the anthropic SDK -------------------------------------------------------------------------


def test_anthropic_messages_stop_unwrapped_and_never_retried(server: FakeOpenAIServer) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="k", http_client=sdk.http_client())
    stop = threading.Event()
    press = press_when(after_tokens(server, 5), stop.set)
    raised: BaseException | None = None
    with sdk.stop_on(stop):
        try:  # what the SDK itself raises (the block's edge would convert a wrapped stop)
            client.messages.create(model="fake-model", max_tokens=LONG, messages=CHAT)  # type: ignore[arg-type]
        except Exception as exc:
            raised = exc
    assert time.perf_counter() - press.wait() < RELEASED
    assert isinstance(raised, GenerationCancelledError) and not isinstance(raised, anthropic.APIConnectionError)
    assert_stopped_server_side(server, press.wait())
    assert sent(server, "/v1/messages") == 1  # max_retries=2: not retried

    stop = threading.Event()
    text: list[str] = []
    press = press_when(lambda: len(text) >= 5, stop.set)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        with client.messages.stream(model="fake-model", max_tokens=LONG, messages=CHAT) as stream:  # type: ignore[arg-type]
            for piece in stream.text_stream:
                text.append(piece)
    assert info.value.partial_text.startswith("".join(text)) and text
    assert_stopped_server_side(server, press.wait())
    assert sent(server, "/v1/messages") == 2
    client.close()


# -- ollama-python -------------------------------------------------------------------------------


def test_ollama_chat_stops_streamed_and_not(ollama_server: FakeOllamaServer) -> None:
    client = ollama.Client(host=ollama_server.url, transport=sdk.transport(flavor="httpx"))
    stop = threading.Event()
    press = press_when(after_tokens(ollama_server, 5), stop.set)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        client.chat(model="fake-model", messages=CHAT)
    assert_stopped_server_side(ollama_server, press.wait())

    stop = threading.Event()
    parts: list[str] = []
    press = press_when(lambda: len(parts) >= 5, stop.set)
    with pytest.raises(GenerationCancelledError) as info, sdk.stop_on(stop):
        for part in client.chat(model="fake-model", messages=CHAT, stream=True):
            parts.append(part.message.content or "")
    assert info.value.partial_text.startswith("".join(parts)) and parts
    assert_stopped_server_side(ollama_server, press.wait())
    assert sent(ollama_server, "/api/chat") == 2


# -- a framework: langchain-openai ---------------------------------------------------------------


def test_langchain_invoke_stops_from_another_thread_and_astream_by_a_cancelled_task(
    server: FakeOpenAIServer,
) -> None:
    sync_http, async_http = sdk.http_client(), sdk.async_http_client()
    chat = ChatOpenAI(
        model="fake-model",
        base_url=server.base_url,
        api_key="k",  # type: ignore[arg-type]
        http_client=sync_http,
        http_async_client=async_http,
    )
    stop = threading.Event()
    press = press_when(after_tokens(server, 5), stop.set)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        chat.invoke("Tell me a long story")
    assert time.perf_counter() - press.wait() < RELEASED
    assert_stopped_server_side(server, press.wait())
    assert sent(server) == 1

    async def cancelled_astream() -> None:
        async def consume() -> None:
            async for _ in chat.astream("Tell me a long story"):
                pass

        task = asyncio.ensure_future(consume())
        while server.requests() == [] or server.last.tokens_sent < 5:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await async_http.aclose()

    asyncio.run(cancelled_astream())
    assert_stopped_server_side(server, time.perf_counter())
    sync_http.close()


# -- bad input -----------------------------------------------------------------------------------


def test_bad_sources_and_settings_fail_at_once_with_what_was_wrong() -> None:
    with pytest.raises(TypeError, match="complex"), sdk.stop_on(1j):  # type: ignore[arg-type]
        pass
    with pytest.raises(TypeError, match="bool"), sdk.stop_on(True):
        pass
    with pytest.raises(ValueError, match="seconds"), sdk.stop_on(-1):
        pass
    with pytest.raises(TypeError, match="transport="):
        sdk.http_client(transport=httpx2.HTTPTransport())
    with pytest.raises(ValueError, match="http2"):
        sdk.http_client(http2=True)
    with pytest.raises(ValueError, match="flavor"):
        sdk.http_client(flavor="requests")
    with pytest.raises((ValueError, OSError)):
        sdk.http_client(verify="/nonexistent/ca.pem")
    with pytest.raises(ValueError, match="socks5 proxy"):
        sdk.async_http_client(proxy="socks5://127.0.0.1:1080")
    assert isinstance(sdk.http_client(), httpx2.Client) and isinstance(sdk.async_http_client(), httpx2.AsyncClient)
