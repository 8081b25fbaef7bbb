"""The gateway's mechanisms under load (#26): coalesced writes, the disconnect acting in the
protocol's ``connection_lost``, header/body timeouts, several workers with cancel routing.
The figures themselves are ``benchmarks/bench_gateway_load.py``'s; these pin the mechanisms."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest

from abstract_client.gateway import BackendConfig, GatewayConfig
from abstract_client.gateway.flight import Flight
from abstract_client.gateway.hosts.workers import Peers
from abstract_client.gateway.metrics import Metrics
from abstract_client.gateway.runner import Job, Runner
from abstract_client.gateway.sinks import ClientStream
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess, InProcessGateway
from abstract_client.types import StreamChunk, ToolCallDelta
from abstract_client.wires.chat_server import ChatFrames, FrameEncoder, chunk_frames

from .helpers import wait_until

HELLO = [{"role": "user", "content": "hi"}]


class _Chunks:
    """A stream whose chunks are all there at once (the way a loaded upstream's are)."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    async def __aenter__(self) -> _Chunks:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> StreamChunk:
        if self.i >= self.n:
            raise StopAsyncIteration
        self.i += 1
        return StreamChunk(delta=f"t{self.i} ")

    def result(self) -> Any:
        return SimpleNamespace(usage=None)


def test_frames_written_without_a_yield_go_out_in_one_send() -> None:
    """100 chunks that arrive without the loop turning: one body message carries them all
    (plus the end), not 100 sends."""
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    llm = SimpleNamespace(astream=lambda **kw: _Chunks(100))
    backend = SimpleNamespace(llm=llm, name="m")
    flight = Flight("r1", backend)  # type: ignore[arg-type]

    async def main() -> int:
        frames = ChatFrames("r1", "m", chat=True, include_usage=False)
        job = Job("chat", backend, "r1", "stream", {}, frames=frames)  # type: ignore[arg-type]
        accounting = SimpleNamespace(account=lambda *args: None)
        runner = Runner(SimpleNamespace(metrics=Metrics(), accounting=accounting))  # type: ignore[arg-type]
        return await runner._answer(flight, job, ClientStream(send, flight, frames))

    assert anyio.run(main) == 200
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert sent[0]["type"] == "http.response.start" and len(bodies) <= 2, len(bodies)
    data = b"".join(m["body"] for m in bodies)
    frames = [json.loads(line[6:]) for line in data.split(b"\n\n") if line.startswith(b"data: {")]
    assert [f["choices"][0]["delta"]["content"] for f in frames] == [f"t{i} " for i in range(1, 101)]
    assert data.endswith(b"data: [DONE]\n\n") and bodies[-1]["more_body"] is False


@pytest.mark.parametrize("chat", [True, False])
def test_the_fast_frame_encoder_says_what_chunk_frames_says(chat: bool) -> None:
    encoder = FrameEncoder('r"1', "mödel", 7, chat=chat)
    chunks = [
        StreamChunk(delta='a "quoted"\nline é 😀'),
        StreamChunk(delta="x", finish_reason="stop"),
        StreamChunk(reasoning="think"),
        StreamChunk(tool_call=ToolCallDelta(index=0, id="c1", name="f", arguments_fragment="{")),
        StreamChunk(),
    ]
    for chunk in chunks:
        encoded = encoder.encode(chunk)
        expected = chunk_frames(chunk, 'r"1', "mödel", 7, chat=chat)
        got = [json.loads(part[6:]) for part in encoded.split(b"\n\n") if part]
        assert got == expected, chunk


def _stream_three_frames(gw: InProcessGateway) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gw.port))
    body = json.dumps({"model": "m", "messages": HELLO, "max_tokens": 100_000, "stream": True})
    sock.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    got = b""
    while got.count(b"data: ") < 3:
        got += sock.recv(65536)
    return sock


def _wait_for_the_disconnect_stop(gw: InProcessGateway) -> None:
    """The gateway's own record: one stop with reason client_disconnect."""
    stops = gw.gateway.metrics.stops
    assert wait_until(lambda: stops.get(("m", "client_disconnect"), 0) >= 1, 15, 0.02), dict(stops)


def test_the_disconnect_stops_the_flight_in_connection_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the ASGI disconnect watcher disabled, a client that closes its socket still stops
    the upstream: the protocol's ``connection_lost`` stops the flight itself."""
    from abstract_client.gateway.http import departures
    from abstract_client.gateway.http.protocol import GatewayProtocol

    async def never(receive: Any, watch: Any) -> None:
        await anyio.sleep_forever()

    monkeypatch.setattr(departures, "_http_disconnect", never)
    monkeypatch.setattr(departures, "departure_thread", lambda: None)  # no departure thread either
    monkeypatch.setattr(GatewayProtocol, "eof_received", lambda self: True)  # nor the loop's half-close path
    with FakeOpenAIServer(token_delay=0.01) as up:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=up.base_url)
        with InProcessGateway(GatewayConfig(backends=[backend])) as gw:
            with _stream_three_frames(gw):
                pass  # leaving the block closes the socket: the disconnect
            record = up.wait_for_request(timeout=10)
            up.wait_for_disconnect(record, timeout=15)
            assert record.tokens_sent < 100_000
            _wait_for_the_disconnect_stop(gw)


def test_a_disconnect_severs_the_upstream_while_the_loop_is_busy() -> None:
    """The departure thread: with the gateway's event loop blocked for 6 s (standing in for a
    loop loaded with hundreds of streams' chunk work), a client that leaves still has its
    upstream severed at once. The loop's own paths could act only after the block."""
    with FakeOpenAIServer(token_delay=0.01) as up:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=up.base_url)
        with InProcessGateway(GatewayConfig(backends=[backend])) as gw:
            sock = _stream_three_frames(gw)
            record = up.wait_for_request(timeout=10)
            loop = gw.gateway.loop
            assert loop is not None
            blocked = threading.Event()

            def block() -> None:
                blocked.set()
                time.sleep(6)

            loop.call_soon_threadsafe(block)
            assert blocked.wait(10)
            left = time.perf_counter()
            sock.close()
            severed = up.wait_for_disconnect(record, timeout=15)
            assert severed - left < 3, f"the upstream was severed {severed - left:.2f}s after the client left"
            _wait_for_the_disconnect_stop(gw)  # and the loop's bookkeeping follows once it is free


def test_a_finished_request_is_no_longer_watched_and_a_late_close_stops_nothing() -> None:
    from abstract_client.gateway.http.departures import departure_thread as watcher

    with FakeOpenAIServer(token_delay=0.0) as up:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=up.base_url)
        with InProcessGateway(GatewayConfig(backends=[backend])) as gw:
            with httpx.Client() as client:
                for _ in range(5):  # keep-alive: one connection, five requests
                    body = {"model": "m", "messages": HELLO, "max_tokens": 3}
                    assert client.post(gw.url + "/v1/chat/completions", json=body).status_code == 200
                w = watcher()
                assert w is not None
                # while the connection is still open, every request's watch has ended with it (the
                # response's last bytes can reach us a moment before the handler's ``finally``
                # unwatches, so wait for it, generously; the client's close would clear it too)
                assert wait_until(lambda: w.watching == 0, 10, 0.01), w.watching
            time.sleep(0.2)
            assert gw.gateway.metrics.stops.get(("m", "client_disconnect"), 0) == 0


class _Stops:
    """A flight that only records its stops."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def stop(self, reason: str) -> None:
        self.reasons.append(reason)

    def stop_from_thread(self, reason: str) -> None:
        self.reasons.append(reason)


class _HeldEpoll:
    """A real epoll whose first batch of events, once ``hold`` is set, waits in the thread until
    ``release``: the moment between ``epoll`` handing the thread an event and the thread looking
    its fd up, made as long as a test needs."""

    def __init__(self) -> None:
        self._real = select.epoll()
        self.hold, self.held, self.release, self.polled_after = (threading.Event() for _ in range(4))

    def poll(self, *args: Any) -> list[tuple[int, int]]:
        if self.release.is_set():
            self.polled_after.set()  # the held batch was handled
        events: list[tuple[int, int]] = self._real.poll(*args)
        if events and self.hold.is_set():
            self.hold.clear()
            self.held.set()
            self.release.wait(30)
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _same_number(target: int) -> Any:
    """``os.dup`` as the kernel answers it when ``target`` is the lowest free number."""
    return lambda fd: os.dup2(fd, target, inheritable=False)


@pytest.mark.parametrize("when", ["before the lookup", "during the stop"], ids=["before-lookup", "during-stop"])
def test_a_departure_never_stops_the_request_that_took_its_fd_number(
    monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A client leaves; before the departure thread has acted on it, the loop ends that request
    (its dup'd fd is closed) and the next request's dup gets the same number — the kernel hands
    out the lowest free one. The late event must not stop the next request (it did: a 499 to a
    client that was there), nor may the first request's cleanup unregister the next one's watch;
    the next client's own departure still stops its request."""
    from abstract_client.gateway.http.departures import ClientWatch, DepartureThread, Registration

    epoll = _HeldEpoll()
    with monkeypatch.context() as patch:
        patch.setattr(select, "epoll", lambda: epoll)
        thread = DepartureThread()
    first_sock, first_client = socket.socketpair()
    second_sock, second_client = socket.socketpair()
    first, second = _Stops(), _Stops()
    registrations: list[Registration | None] = []

    def next_request_takes_the_number() -> None:
        first_registration = registrations[0]
        assert first_registration is not None
        thread.unwatch(first_registration)  # the loop ends the first request
        with monkeypatch.context() as patch:
            patch.setattr(os, "dup", _same_number(first_registration.fd))
            registrations.append(thread.watch(second_sock, ClientWatch(second)))

    if when == "during the stop":

        class _StopsThenReuses(_Stops):
            def stop_from_thread(self, reason: str) -> None:
                super().stop_from_thread(reason)
                next_request_takes_the_number()  # the loop is quick: it happens before the thread's cleanup

        first = _StopsThenReuses()
    try:
        registrations.append(thread.watch(first_sock, ClientWatch(first)))
        epoll.hold.set()
        first_client.close()  # the first client leaves
        assert epoll.held.wait(30), "the thread was never told of the departure"
        if when == "before the lookup":
            next_request_takes_the_number()
        epoll.release.set()
        assert epoll.polled_after.wait(30), "the thread never came back to epoll"
        if when == "before the lookup":
            assert first.reasons == []  # its request had ended: nothing left to stop
        else:
            assert first.reasons == ["client_disconnect"]
        second_registration = registrations[1]
        assert second_registration is not None and second_registration.fd == registrations[0].fd  # type: ignore[union-attr]
        assert second.reasons == [], "the first client's departure stopped the second client's request"
        assert thread.watching == 1, "the second request's watch was dropped"
        second_client.close()  # and its own departure still stops it
        assert wait_until(lambda: second.reasons == ["client_disconnect"], 30, 0.01), second.reasons
    finally:
        epoll.release.set()
        thread.close()
        for sock in (first_sock, first_client, second_sock, second_client):
            sock.close()


def _read_until_closed(sock: socket.socket, limit: float) -> tuple[bytes, float]:
    sock.settimeout(limit)
    t0, got = time.monotonic(), b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:  # closed with our bytes unread: an RST (the 408 may be lost)
            return got or b"HTTP/1.1 408 (reset)", time.monotonic() - t0
        if not data:
            return got, time.monotonic() - t0
        got += data


def test_a_slow_request_head_or_body_is_a_408_and_the_connection_closes() -> None:
    with FakeOpenAIServer(token_delay=0.01) as up:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=up.base_url)
        config = GatewayConfig(backends=[backend], header_timeout=1.0, body_timeout=1.0)
        with InProcessGateway(config) as gw:
            # slowloris: a head one byte at a time, never finished
            with socket.create_connection(("127.0.0.1", gw.port)) as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHo")
                stop = threading.Event()

                def drip() -> None:
                    while not stop.wait(0.2):
                        try:
                            sock.sendall(b"x")
                        except OSError:
                            return

                dripper = threading.Thread(target=drip, daemon=True)
                dripper.start()
                got, took = _read_until_closed(sock, 12)
                stop.set()
                assert got.startswith(b"HTTP/1.1 408") and took < 12, (got, took)
            # a connection that says nothing
            with socket.create_connection(("127.0.0.1", gw.port)) as sock:
                got, took = _read_until_closed(sock, 12)
                assert got.startswith(b"HTTP/1.1 408"), got
            # a body that never finishes
            with socket.create_connection(("127.0.0.1", gw.port)) as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
                got, took = _read_until_closed(sock, 12)
                assert got.startswith(b"HTTP/1.1 408") and b"request_timeout" in got, got
            assert up.requests("/v1/chat/completions") == []  # nothing went upstream
            # a stream longer than both timeouts is not cut, and keep-alive still serves
            with httpx.Client(base_url=gw.url, timeout=60) as http:
                body = {"model": "m", "messages": HELLO, "max_tokens": 200, "stream": True}
                for _ in range(2):
                    with http.stream("POST", "/v1/chat/completions", json=body) as r:
                        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
                    assert lines[-1] == "data: [DONE]" and len(lines) >= 201


def test_a_peer_worker_cancels_the_request_it_holds_and_checks_the_key(tmp_path: Path) -> None:
    stopped: list[tuple[str, str]] = []

    def flight(rid: str, owner: str | None, backend: str) -> Any:
        return SimpleNamespace(
            request_id=rid,
            owner=owner,
            backend=SimpleNamespace(name=backend),
            stop=lambda reason: stopped.append((rid, reason)),
        )

    holder = SimpleNamespace(flights={"r1": flight("r1", "alice", "m"), "r2": flight("r2", None, "m")})
    other = SimpleNamespace(flights={})

    async def main() -> list[bool]:
        a, b = Peers(tmp_path, 0, 2), Peers(tmp_path, 1, 2)
        await a.start(other)  # type: ignore[arg-type]
        await b.start(holder)  # type: ignore[arg-type]
        try:
            return [
                await a.ask("cancel", "r1", "bob", "0"),  # not bob's: refused
                await a.ask("cancel", "nope", "-", "1"),  # held by nobody
                await a.ask("cancel", "r1", "alice", "0"),  # hers
                await a.ask("cancel", "r2", "-", "0"),  # no keys: anyone
                await a.ask("cancel", "r1", "bob", "1"),  # the admin key
                await a.ask("stop-backend", "m"),
                await b.ask("cancel", "r1", "alice", "0"),  # the asking worker is not asked
            ]
        finally:
            await a.aclose()
            await b.aclose()

    assert anyio.run(main) == [False, False, True, True, True, True, False]
    assert stopped[:3] == [("r1", "cancel_endpoint"), ("r2", "cancel_endpoint"), ("r1", "cancel_endpoint")]
    assert sorted(stopped[3:]) == [("r1", "model_eject"), ("r2", "model_eject")]


def test_two_workers_serve_one_port_and_every_cancel_reaches_its_request(tmp_path: Path) -> None:
    with FakeOpenAIServer(token_delay=0.01) as up:
        gw = GatewayProcess.launch(
            [
                "-p",
                "openai-compatible",
                "-u",
                up.base_url,
                "-m",
                "fake-model",
                "--workers",
                "2",
                "--max-concurrent",
                "16",
            ],
            log_path=tmp_path / "gw.log",
        )
        try:
            results: dict[str, str] = {}

            def stream(rid: str) -> None:
                body = {"model": "fake-model", "messages": HELLO, "max_tokens": 100_000, "stream": True}
                with httpx.stream(
                    "POST", gw.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}, timeout=60
                ) as r:
                    results[rid] = r.read().decode()  # an error frame, or a 499 body before any chunk

            rids = [f"w-{i}" for i in range(8)]
            threads = [threading.Thread(target=stream, args=(rid,)) for rid in rids]
            for t in threads:
                t.start()
            up.wait_for_request(len(rids), timeout=20)
            for rid in rids:  # each on a new connection: whichever worker accepts it
                answer = httpx.post(gw.url + f"/v1/requests/{rid}/cancel", timeout=30)
                assert answer.status_code == 200, (rid, answer.text)
            for t in threads:
                t.join(30)
            assert set(results) == set(rids)
            assert all("cancelled" in text and "[DONE]" not in text for text in results.values()), results
            for record in up.requests("/v1/chat/completions"):
                up.wait_for_disconnect(record, timeout=15)
            assert httpx.post(gw.url + "/v1/requests/none/cancel", timeout=30).status_code == 404
        finally:
            gw.stop()


def test_workers_refuse_an_in_process_lane() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "abstract_client", "serve", "-p", "mlx", "-m", "/nonexistent", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "in-process" in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("stream", [True, False])
def test_a_finished_answer_leaves_its_connection_for_the_next_call(stream: bool) -> None:
    """The bytes after ``[DONE]`` (the chunked body's end) are read, so the connection is
    clean and reused: ten calls, one TCP connection, not ten (a connect each, a TIME_WAIT each)."""
    from abstract_client import create_llm

    with FakeOpenAIServer(token_delay=0.0) as up:
        llm = create_llm("openai-compatible", "fake-model", base_url=up.base_url)

        async def main() -> None:
            for _ in range(10):
                if stream:
                    async with llm.astream("hi", max_tokens=3) as s:
                        async for _chunk in s:
                            pass
                else:
                    await llm.agenerate("hi", max_tokens=3)
            await llm.aclose()

        anyio.run(main)
        assert up.connections <= 2, up.connections
