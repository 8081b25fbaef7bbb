"""Model management (list, load, unload, readiness) runs through the contract: only this
library's errors come out, each call has a deadline, and each can be stopped."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
import httpx
import pytest
import respx

from abstract_client import (
    AbortController,
    AbstractClientError,
    GenerationCancelledError,
    GenerationTimeoutError,
    NotSupportedError,
    ProviderProtocolError,
    ServerUnavailableError,
    create_llm,
)

from .helpers import press_when

HTTP_LANES = ["openai-compatible", "llamacpp", "vllm", "ollama", "lmstudio"]


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


@dataclass
class SilentPort:
    port: int
    accepted: list[socket.socket]


@pytest.fixture
def silent_port() -> Iterator[SilentPort]:
    """A port that accepts connections and never answers (``accepted``: how many so far)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield SilentPort(int(listener.getsockname()[1]), accepted)
    listener.close()
    for conn in accepted:
        conn.close()


@pytest.mark.parametrize("lane", HTTP_LANES)
def test_refused_connection_is_typed_on_every_call(lane: str) -> None:
    with create_llm(lane, "m", base_url=f"http://127.0.0.1:{_closed_port()}") as llm:
        for call in (llm.list_models, llm.load_model, lambda: llm.wait_ready(0.3)):
            with pytest.raises(AbstractClientError) as info:
                call()
            # the server is down, or the lane cannot do this at all: both say so by type
            assert isinstance(info.value, ServerUnavailableError | NotSupportedError), repr(info.value)
        try:  # a lane without a server-side unload just reports; any other outcome is typed
            llm.unload_model()
        except (ServerUnavailableError, NotSupportedError):
            pass


@respx.mock
def test_malformed_model_lists_are_protocol_errors() -> None:
    base = "http://127.0.0.1:11434"
    respx.get(f"{base}/api/tags").mock(return_value=httpx.Response(200, json={"models": []}))
    respx.get(f"{base}/api/ps").mock(return_value=httpx.Response(200, json=["not", "a", "dict"]))
    with create_llm("ollama", "m", base_url=base) as llm:
        with pytest.raises(ProviderProtocolError, match="/api/ps"):
            llm.list_models()
    respx.get("http://127.0.0.1:1234/api/v1/models").mock(return_value=httpx.Response(200, text="<html>"))
    with create_llm("lmstudio", "m", base_url="http://127.0.0.1:1234") as llm:
        with pytest.raises(ProviderProtocolError):
            llm.list_models()


@respx.mock
def test_lmstudio_wait_ready_is_typed_not_a_bare_timeout() -> None:
    # LM Studio answers unknown paths 200: a /v1/models without its shape is "not ready".
    respx.get("http://127.0.0.1:1234/v1/models").mock(return_value=httpx.Response(200, json={"error": "x"}))
    with create_llm("lmstudio", "m", base_url="http://127.0.0.1:1234") as llm:
        with pytest.raises(ServerUnavailableError, match="not ready"):
            llm.wait_ready(0.3)


@pytest.mark.parametrize("lane", HTTP_LANES)
def test_model_calls_have_a_deadline_and_a_stop(lane: str, silent_port: SilentPort) -> None:
    def held() -> Callable[[], bool]:  # true once the silent server holds one more connection
        n = len(silent_port.accepted)
        return lambda: len(silent_port.accepted) > n

    with create_llm(lane, "m", base_url=f"http://127.0.0.1:{silent_port.port}") as llm:
        t0 = time.monotonic()
        with pytest.raises(GenerationTimeoutError):
            llm.list_models(timeout=0.3)
        assert time.monotonic() - t0 < 10  # generous: the point is that it ends
        event = threading.Event()
        press = press_when(held(), event.set)
        with pytest.raises(GenerationCancelledError) as info:
            llm.list_models(cancel_event=event)
        press.wait()
        assert info.value.reason == "user"
        controller = AbortController()
        press = press_when(held(), controller.abort)
        with pytest.raises(GenerationCancelledError):
            llm.list_models(signal=controller.signal)
        press.wait()
        press = press_when(held(), llm.close)
        with pytest.raises(GenerationCancelledError) as info:
            llm.wait_ready(30)  # no source of its own: close() from another thread stops it
        press.wait()
        assert info.value.reason == "shutdown"


@pytest.mark.anyio
async def test_close_stops_model_calls_in_flight(anyio_backend: str, silent_port: SilentPort) -> None:
    llm = create_llm("ollama", "m", base_url=f"http://127.0.0.1:{silent_port.port}")
    outcome: list[BaseException] = []

    async def listing() -> None:
        try:
            await llm.alist_models()
        except BaseException as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(listing)
        await anyio.sleep(0.2)
        await llm.aclose()
    assert len(outcome) == 1 and isinstance(outcome[0], GenerationCancelledError)
    assert outcome[0].reason == "shutdown"
