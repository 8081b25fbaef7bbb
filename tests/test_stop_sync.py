"""The stop contract through the sync API, proven by the fake server's disconnect record."""

from __future__ import annotations

import gc
import socket
import threading
import time

import pytest

from abstract_client import (
    LLM,
    AbortController,
    AbortSignal,
    GenerationCancelledError,
    create_llm,
)
from abstract_client.http.guard import SocketGuard
from abstract_client.testing import FakeServer

from .helpers import guard_of, loop_settled, press_when, set_later, wait_until

# Generous wall-clock bounds: this machine is shared (2 cores). Tight figures are in benchmarks/.
PROMPT_STOP_S = 1.0
SERVER_SEES_EOF_S = 1.0


def test_preset_event_raises_before_a_byte_is_sent(server: FakeServer, llm: LLM) -> None:
    event = threading.Event()
    event.set()
    with pytest.raises(GenerationCancelledError) as info:
        llm.generate("hi", cancel_event=event)
    assert info.value.reason == "user"
    assert info.value.partial_text == ""
    with pytest.raises(GenerationCancelledError):
        next(iter(llm.stream("hi", signal=AbortSignal.abort())))
    time.sleep(0.05)
    assert server.connections == 0 and server.records == []  # the server saw no connection at all
    assert llm.in_flight == []


@pytest.mark.parametrize("bad", ["yes", True, 1, object(), AbortController()])
def test_wrong_stop_types_are_a_type_error(llm: LLM, bad: object) -> None:
    with pytest.raises(TypeError):
        llm.generate("hi", cancel_event=bad)  # type: ignore[arg-type]
    if not isinstance(bad, AbortController):
        with pytest.raises(TypeError):
            llm.generate("hi", signal=bad)


def test_stop_while_waiting_for_headers(server: FakeServer, llm: LLM) -> None:
    server.behavior.prefill_delay = 30  # the server is "processing the prompt"
    event = threading.Event()
    press = press_when(lambda: server.requests(), event.set)  # the server holds the request
    with pytest.raises(GenerationCancelledError) as info:
        llm.generate("long prompt", cancel_event=event)
    pressed = press.wait()
    assert time.perf_counter() - pressed < PROMPT_STOP_S
    record = server.last
    seen = server.wait_for_disconnect(record)
    assert seen - pressed < SERVER_SEES_EOF_S
    assert record.headers_sent_at is None  # stopped before the server answered at all
    assert info.value.cancel_to_stop_ms is not None and info.value.cancel_to_stop_ms < 1000


@pytest.mark.parametrize("plain_route", [False, True], ids=["over-stream", "plain"])
def test_stop_during_non_streaming_body(server: FakeServer, llm: LLM, plain_route: bool) -> None:
    server.behavior.token_delay = 0.01
    controller = AbortController()
    press = press_when(lambda: server.last.tokens_sent >= 3, controller.abort)  # mid-body, by the server's record
    with pytest.raises(GenerationCancelledError) as info:
        llm.generate("x", max_tokens=10_000, signal=controller.signal, plain_route=plain_route)
    press.wait()
    record = server.last
    seen = server.wait_for_disconnect(record)
    assert controller.signal.aborted_at is not None
    assert seen - controller.signal.aborted_at < SERVER_SEES_EOF_S
    assert 0 < record.tokens_sent < 10_000  # the server stopped "decoding"
    over_stream = llm.provider.complete_over_stream and not plain_route
    assert record.body["stream"] is over_stream
    if not over_stream:
        assert info.value.partial_text == ""  # a plain body: nothing arrived, nothing invented
    else:  # over the streaming wire the partial answer is kept, as for a stream
        assert "tok0 tok1 ".startswith(info.value.partial_text[:10]) and info.value.generated_tokens > 0


def test_stop_mid_stream_keeps_partial_text(server: FakeServer, llm: LLM) -> None:
    event = threading.Event()
    received: list[str] = []
    with pytest.raises(GenerationCancelledError) as info:
        for chunk in llm.stream("x", max_tokens=10_000, cancel_event=event):
            received.append(chunk.delta)
            if len(received) == 6:
                stop_at = time.perf_counter()
                event.set()
    err = info.value
    assert err.partial_text.startswith("".join(received))
    assert err.generated_tokens >= 5
    record = server.last
    seen = server.wait_for_disconnect(record)
    assert seen - stop_at < SERVER_SEES_EOF_S
    assert record.tokens_sent_after(seen) == 0
    assert record.tokens_sent < 10_000


def test_stop_during_connect() -> None:
    # A listener whose accept queue is full: the kernel drops further SYNs, so connect() hangs.
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
    time.sleep(0.1)
    llm = create_llm("openai-compatible", "m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    try:
        event = threading.Event()
        set_later(event.set, 0.3)
        t0 = time.perf_counter()
        with pytest.raises(GenerationCancelledError):
            llm.generate("x", cancel_event=event)
        assert time.perf_counter() - t0 < 0.3 + PROMPT_STOP_S
    finally:
        llm.close()
        for s in fillers:
            s.close()
        listener.close()


@pytest.mark.parametrize("how", ["cancel", "cancel_all", "eject"])
def test_a_call_without_a_stop_source_is_severed_the_same_way(server: FakeServer, llm: LLM, how: str) -> None:
    """No cancel_event, no signal: ``cancel(id)``, ``cancel_all()`` and an eject still reach the
    server by ``shutdown()`` of the call's own socket, in the stopping thread."""
    server.behavior.prefill_delay = 30
    found: list[SocketGuard] = []
    stopped_at: list[float] = []

    def stop() -> None:
        assert wait_until(lambda: "req-42" in llm.in_flight)
        found.append(guard_of(llm, "req-42"))
        server.wait_for_request(1)  # the server holds the request: a stop now must reach it
        stopped_at.append(time.perf_counter())
        if how == "cancel":
            llm.cancel("req-42")
        elif how == "cancel_all":
            llm.cancel_all()
        else:
            llm.unload_model(drain_timeout=10)

    stopper = set_later(stop, 0.0)
    with pytest.raises(GenerationCancelledError) as info:
        llm.generate("x", request_id="req-42")
    stopper.join(15)
    assert info.value.request_id == "req-42"
    assert info.value.reason == ("model_eject" if how == "eject" else "user")
    guard = found[0]
    assert guard.severed_at is not None and guard.severed_at >= stopped_at[0]  # shut down by the stop
    seen = server.wait_for_disconnect(server.records[0])  # the generation (an eject adds requests)
    assert seen - stopped_at[0] < SERVER_SEES_EOF_S
    assert llm.cancel("req-42") is False  # no longer in flight


def test_abort_signal_timeout_reason(server: FakeServer, llm: LLM) -> None:
    server.behavior.prefill_delay = 30
    with pytest.raises(GenerationCancelledError) as info:
        llm.generate("x", signal=AbortSignal.timeout(0.2))
    assert info.value.reason == "timeout"
    assert isinstance(info.value.signal_reason, TimeoutError)
    server.wait_for_disconnect(server.last)


def test_break_out_of_sync_stream_closes_at_once_without_gc(server: FakeServer, llm: LLM) -> None:
    gc.disable()
    try:
        for i, _ in enumerate(llm.stream("x", max_tokens=10_000)):
            if i == 3:
                stop_at = time.perf_counter()
                break
        record = server.last
        seen = server.wait_for_disconnect(record, timeout=2)
        assert seen - stop_at < SERVER_SEES_EOF_S
    finally:
        gc.enable()
    assert llm.in_flight == []


def test_stream_context_manager_closes(server: FakeServer, llm: LLM) -> None:
    with llm.stream("x", max_tokens=10_000) as stream:
        next(stream)
        next(stream)
    server.wait_for_disconnect(server.last)
    assert llm.in_flight == []


def test_stream_cancel_method_from_another_thread(server: FakeServer, llm: LLM) -> None:
    stream = llm.stream("x", max_tokens=10_000)
    with pytest.raises(GenerationCancelledError):
        for i, _ in enumerate(stream):
            if i == 2:
                set_later(stream.cancel, 0.0)
    server.wait_for_disconnect(server.last)


def test_completed_stream_gives_result(server: FakeServer, llm: LLM) -> None:
    server.behavior.answer = "The capital of France is Paris."
    with llm.stream("capital?") as stream:
        text = "".join(c.delta for c in stream)
    result = stream.result()
    assert text == result.content == "The capital of France is Paris."
    assert result.finish_reason == "stop"
    assert result.usage is not None and result.usage.completion_tokens == 6
    assert result.timings.ttft_ms is not None and result.timings.total_ms is not None
    assert 0 < result.timings.ttft_ms <= result.timings.total_ms


def test_unload_stops_in_flight_with_model_eject(server: FakeServer, llm: LLM) -> None:
    server.behavior.prefill_delay = 30
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            llm.generate("x")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    assert _wait(lambda: len(llm.in_flight) == 3)
    report = llm.unload_model(drain_timeout=5)
    for t in threads:
        t.join(5)
    assert report.stopped_requests == 3
    assert [type(e) for e in errors] == [GenerationCancelledError] * 3
    assert {e.reason for e in errors if isinstance(e, GenerationCancelledError)} == {"model_eject"}
    server.behavior.prefill_delay = 0
    assert llm.generate("again", max_tokens=2).content  # the LLM stays usable


def _wait(predicate: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return False


def test_a_cancel_after_the_stream_finished_changes_nothing(llm: LLM) -> None:
    stream = llm.stream("x", max_tokens=3)
    assert "".join(c.delta for c in stream) == "tok0 tok1 tok2 "
    stream.cancel()
    assert list(stream) == []  # still finished, not stopped
    assert stream.result().content == "tok0 tok1 tok2 "


def test_a_stop_between_chunks_raises_at_the_next_one(server: FakeServer, llm: LLM) -> None:
    """The consumer is busy with a chunk when the stop comes: the next ``next()`` raises at once
    and the server sees the connection go."""
    stream = llm.stream("x", max_tokens=10_000)
    next(stream)
    stream.cancel()
    with pytest.raises(GenerationCancelledError):
        next(stream)
    server.wait_for_disconnect(server.last)
    assert llm.in_flight == [] and loop_settled(llm)
