"""Retries only for safe failures, never for a stop or a timeout; the four deadlines."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from abstract_client import (
    AbortController,
    GenerationCancelledError,
    GenerationTimeoutError,
    ProviderAPIError,
    RateLimitError,
    ServerUnavailableError,
    Timeout,
    TransportError,
    create_llm,
)
from abstract_client.testing import FakeServer

from .helpers import press_when, set_later


@pytest.fixture
def make(server: FakeServer, lane: str):  # type: ignore[no-untyped-def]
    def build(server: FakeServer, retries: int = 2, **kw: object):  # type: ignore[no-untyped-def]
        return create_llm(lane, "fake-model", base_url=server.base_url, max_retries=retries, **kw)

    return build


def test_503_with_retry_after_is_retried(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.behavior.retry_after = 0.05
    server.inject("loading_503", 2)
    with make(server) as llm:
        assert llm.generate("x", max_tokens=2).content
    assert len(server.requests()) == 3


def test_502_and_504_are_retried_with_backoff(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.inject("status_502")
    server.inject("status_504")
    with make(server) as llm:
        assert llm.generate("x", max_tokens=2).content
    assert len(server.requests()) == 3


def test_429_without_retry_after_is_not_retried(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.inject("status_429")
    with make(server) as llm, pytest.raises(RateLimitError):
        llm.generate("x")
    assert len(server.requests()) == 1


def test_max_retries_zero(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.behavior.retry_after = 0
    server.inject("loading_503")
    with make(server, retries=0) as llm, pytest.raises(ServerUnavailableError):
        llm.generate("x")
    assert len(server.requests()) == 1


def test_retries_exhausted_raise_the_last_error(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.inject("status_502", 5)
    with make(server, retries=2) as llm, pytest.raises(ProviderAPIError) as info:
        llm.generate("x")
    assert info.value.status == 502
    assert len(server.requests()) == 3


def test_stop_during_backoff_ends_it_at_once_and_is_not_retried(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.behavior.retry_after = 30  # a long backoff
    server.inject("loading_503", 10)
    event = threading.Event()
    with make(server) as llm:
        # pressed once the 503 is answered: the call is in its 30 s backoff
        press = press_when(lambda: server.last.completed, event.set)
        with pytest.raises(GenerationCancelledError):
            llm.generate("x", cancel_event=event)
        assert time.perf_counter() - press.wait() < 2.0
    assert len(server.requests()) == 1 and server.connections == 1  # the stop was never retried


def test_a_stopped_call_is_never_retried(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.behavior.prefill_delay = 30
    controller = AbortController()
    with make(server, retries=5) as llm:
        press = press_when(lambda: server.requests(), controller.abort)  # the server holds it
        with pytest.raises(GenerationCancelledError):
            llm.generate("x", signal=controller.signal)
        press.wait()
        time.sleep(0.3)
    # requests AND connections: a retry severed at connect would leave a connection, no request
    # (tests/test_stop_mechanism.py also counts the provider's attempts, in every phase)
    assert len(server.requests()) == 1 and server.connections == 1


def test_transport_error_after_body_sent_is_not_retried(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.behavior.token_delay = 0.01
    server.behavior.fail_after_tokens = 3
    server.inject("drop")  # the server resets mid-generation
    with make(server, retries=5) as llm:
        with pytest.raises(TransportError) as info:
            list(llm.stream("x", max_tokens=50))
        assert info.value.partial_text  # what arrived is kept
    assert len(server.requests()) == 1


def test_non_streaming_drop_is_not_retried(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.inject("no_answer")
    with make(server, retries=5) as llm:
        # the server holds the request; then we make it reset the connection
        def reset() -> None:
            rec = server.wait_for_request()
            del rec
            server.stop()

        set_later(reset, 0.2)
        with pytest.raises(TransportError):
            llm.generate("x")
    assert len(server.requests()) == 1


def test_connection_refused_is_retried_then_typed() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    llm = create_llm("openai-compatible", "m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2)
    with llm, pytest.raises(ServerUnavailableError) as info:
        llm.generate("x")
    assert info.value.retryable


def test_first_token_timeout(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.behavior.prefill_delay = 30
    with make(server, retries=3) as llm:
        t0 = time.perf_counter()
        with pytest.raises(GenerationTimeoutError) as info:
            list(llm.stream("x", timeout=Timeout(first_token=0.3)))
        assert info.value.kind == "first_token"
        assert time.perf_counter() - t0 < 2.0
    server.wait_for_disconnect(server.last)
    assert len(server.requests()) == 1  # a timeout is never retried


def test_idle_timeout_keeps_partial_text(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.behavior.fail_after_tokens = 3
    server.inject("stall")
    with make(server) as llm:
        with pytest.raises(GenerationTimeoutError) as info:
            list(llm.stream("x", max_tokens=20, timeout=Timeout(idle=0.3)))
    assert info.value.kind == "idle"
    assert info.value.partial_text == "tok0 tok1 tok2 "
    server.wait_for_disconnect(server.last)


def test_total_timeout_non_streaming(server: FakeServer, make) -> None:  # type: ignore[no-untyped-def]
    server.behavior.prefill_delay = 30
    with make(server) as llm, pytest.raises(GenerationTimeoutError) as info:
        llm.generate("x", timeout=0.3)
    assert info.value.kind == "total"
    server.wait_for_disconnect(server.last)


def test_connect_timeout() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    try:
        llm = create_llm(
            "openai-compatible",
            "m",
            base_url=f"http://127.0.0.1:{port}/v1",
            timeout=Timeout(connect=0.3),
            max_retries=3,
        )
        with llm, pytest.raises(GenerationTimeoutError) as info:
            llm.generate("x")
        assert info.value.kind == "connect"
    finally:
        for s in fillers:
            s.close()
        listener.close()
