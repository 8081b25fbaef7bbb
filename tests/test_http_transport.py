"""The private connections' transport (``abstract_client/http/transport.py``) on real sockets.

A scripted server answers, withholds its headers, or stops inside a chunk. Each stop is checked
by its mechanism (the event loop held while another thread stops, as in test_stop_mechanism):
the stopping thread itself shut the socket down, and the server saw the end while the loop was
still held. Then what the pool may keep: a finished answer's connection serves the next call and
belongs to it; a stopped one is never reused; an idle one the server closed is not used.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from abstract_client import LLM, GenerationCancelledError, create_llm
from abstract_client.http.guard import SocketGuard, current_guard
from abstract_client.http.transport import GuardedTransport, NoResponseError

from .helpers import FIN_SENT, LoopHold, guard_of, tcp_state, wait_until

HOLD_S = 1.5


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def frame(obj: Any) -> bytes:
    return chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
TOKEN = frame({"choices": [{"index": 0, "delta": {"content": "tok "}}]})
ANSWER = (
    HEAD
    + TOKEN
    + frame({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    + chunk(b"data: [DONE]\n\n")
    + b"0\r\n\r\n"
)


class Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.requests = 0
        self.eof_at: float | None = None
        self.closed = False  # by the script's end

    def read_request(self) -> bool:
        """One request (head and Content-Length body); False at the connection's end."""
        while b"\r\n\r\n" not in self.buf:
            if not self._recv():
                return False
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
        )
        while len(self.buf) < length:
            if not self._recv():
                return False
        self.buf = self.buf[length:]
        self.requests += 1
        return True

    def wait_eof(self) -> None:
        while self._recv():
            pass

    def _recv(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self.eof_at = time.perf_counter()
            return False
        self.buf += data
        return True


Script = Callable[[Conn], None]


class ScriptedServer:
    """Runs ``script(conn)`` for every connection it accepts, each in its own thread."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.conns: list[Conn] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            conn = Conn(sock)
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: Conn) -> None:
        try:
            self.script(conn)
        finally:
            conn.sock.close()
            conn.closed = True

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def served() -> Iterator[Callable[[Script], tuple[ScriptedServer, LLM]]]:
    made: list[tuple[ScriptedServer, LLM]] = []

    def make(script: Script) -> tuple[ScriptedServer, LLM]:
        server = ScriptedServer(script)
        llm = create_llm("openai-compatible", "m", base_url=server.base_url, max_retries=0, complete_over_stream=True)
        made.append((server, llm))
        return server, llm

    yield make
    for server, llm in made:
        llm.close()
        server.close()


def stop_with_the_loop_held(llm: LLM, request_id: str, ready: Callable[[], bool]) -> tuple[int, float, float]:
    """Once ``ready()``, hold the call's loop and stop it from this thread. Returns the socket's
    TCP state right after the stop, when the stop was made and when the loop was let go."""
    event = threading.Event()
    out: dict[str, Any] = {}

    def stopper() -> None:
        try:
            assert wait_until(lambda: request_id in llm.in_flight and ready(), 10)
            sock = guard_of(llm, request_id)._sock
            assert sock is not None, "the call's guard holds no socket: its stop cannot sever"
            hold = LoopHold(HOLD_S)
            llm._portal.loop.call_soon_threadsafe(hold)
            assert hold.started.wait(10)
            out["stopped_at"] = time.perf_counter()
            event.set()
            out["state"] = tcp_state(sock)  # the loop is held: only this thread can have shut it
            out["free_at"] = hold.wait_free()
        except BaseException as exc:
            out["failure"] = exc
            event.set()

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    with pytest.raises(GenerationCancelledError):
        llm.generate("x", max_tokens=100, request_id=request_id, cancel_event=event)
    # Raised while the loop is still held: the call is no longer listed in flight (a caller
    # reading in_flight or calling cancel_all() right after the raise sees no ghost).
    assert llm.in_flight == []
    thread.join(30)
    assert "failure" not in out, out["failure"]
    assert out["state"] in FIN_SENT, f"TCP state {out['state']} right after the stop: not severed by the stopper"
    return out["state"], out["stopped_at"], out["free_at"]


def severed_while_held(conn: Conn, stopped_at: float, free_at: float) -> None:
    assert wait_until(lambda: conn.eof_at is not None, 10), "the server never saw the connection end"
    assert conn.eof_at is not None and stopped_at <= conn.eof_at < free_at, "the server saw EOF only after the loop"


def answer_then(after: Script) -> Script:
    """Answer every request in full (keep-alive) until ``after`` takes over the second one."""

    def script(conn: Conn) -> None:
        while conn.read_request():
            if conn.requests >= 2:
                after(conn)
                return
            conn.sock.sendall(ANSWER)

    return script


def withhold(conn: Conn) -> None:
    conn.wait_eof()


def inside_a_chunk(conn: Conn) -> None:
    conn.sock.sendall(HEAD + TOKEN + b'40\r\ndata: {"choi')
    conn.wait_eof()


def answer_all(conn: Conn) -> None:
    while conn.read_request():
        conn.sock.sendall(ANSWER)


def test_a_finished_answer_keeps_its_connection_for_the_next_call(served: Any) -> None:
    server, llm = served(answer_all)
    for _ in range(3):
        assert llm.generate("x", max_tokens=5).content == "tok "
    assert len(server.conns) == 1 and server.conns[0].requests == 3


@pytest.mark.parametrize("where", ["before the headers", "inside a chunk"])
def test_a_stop_severs_from_the_stopping_thread_wherever_the_response_is(served: Any, where: str) -> None:
    def script(conn: Conn) -> None:
        conn.read_request()
        if where == "before the headers":
            withhold(conn)
        else:
            inside_a_chunk(conn)

    server, llm = served(script)
    _, stopped_at, free_at = stop_with_the_loop_held(
        llm, "held", lambda: bool(server.conns) and server.conns[0].requests == 1
    )
    severed_while_held(server.conns[0], stopped_at, free_at)
    assert llm.in_flight == []


def test_a_reused_connection_is_the_new_calls_to_sever(served: Any) -> None:
    """The first call finished cleanly and left its connection in the pool; the second call takes
    it, and the second call's stop severs it (the first call's guard no longer holds it)."""
    server, llm = served(answer_then(withhold))
    assert llm.generate("x", max_tokens=5).content == "tok "
    _, stopped_at, free_at = stop_with_the_loop_held(llm, "second", lambda: server.conns[0].requests == 2)
    assert len(server.conns) == 1  # the same connection
    severed_while_held(server.conns[0], stopped_at, free_at)


def test_a_stopped_connection_never_comes_back(served: Any) -> None:
    def script(conn: Conn) -> None:
        conn.read_request()
        if len(server.conns) == 1:
            inside_a_chunk(conn)
        else:
            conn.sock.sendall(ANSWER)
            conn.wait_eof()

    server, llm = served(script)
    stop_with_the_loop_held(llm, "held", lambda: bool(server.conns) and server.conns[0].requests == 1)
    assert llm.generate("x", max_tokens=5).content == "tok "
    assert len(server.conns) == 2 and server.conns[1].requests == 1


def test_an_idle_connection_the_server_closed_is_not_used(served: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A server may close a keep-alive connection while it sits in the pool (llama-server does
    after a streamed answer): the next call must not write into it (and need the resend that
    rescues a close it could not see)."""

    def script(conn: Conn) -> None:
        conn.read_request()
        conn.sock.sendall(ANSWER)  # keep-alive by the headers, then closed anyway

    server, llm = served(script)
    assert llm.generate("x", max_tokens=5).content == "tok "
    assert wait_until(lambda: server.conns[0].closed, 5)  # its FIN is on our idle socket (loopback)
    caplog.set_level(logging.DEBUG, logger="abstract_client.http.transport")
    assert llm.generate("x", max_tokens=5).content == "tok "
    assert not [r for r in caplog.records if "sending again" in r.getMessage()]  # seen closed, not tried
    for _ in range(2):
        assert llm.generate("x", max_tokens=5).content == "tok "
    assert len(server.conns) == 4


def test_an_answer_whose_body_never_ended_does_not_serve_the_next_call(served: Any) -> None:
    """``[DONE]`` came but the chunked body's end did not (the drain gives up after a bound): the
    call is done, but what is left of that body would be read as the next call's answer, so the
    connection is closed, not pooled."""

    def script(conn: Conn) -> None:
        conn.read_request()
        if len(server.conns) == 1:
            conn.sock.sendall(ANSWER[: -len(b"0\r\n\r\n")])  # no terminator
        else:
            conn.sock.sendall(ANSWER)
        conn.wait_eof()

    server, llm = served(script)
    assert llm.generate("x", max_tokens=5).content == "tok "
    assert llm.generate("x", max_tokens=5, timeout=10).content == "tok "  # bounded if it waits on the old one
    assert len(server.conns) == 2
    assert wait_until(lambda: server.conns[0].eof_at is not None, 10)  # closed, not left open


def test_a_body_end_that_comes_after_done_is_read_and_the_connection_kept(served: Any) -> None:
    """The chunked body's end often shares a read with ``[DONE]``, and then it is read with it; when
    it comes a little later, the call still reads it (``drain``) so that its connection serves the
    next call instead of a new TCP connection per call."""

    def script(conn: Conn) -> None:
        while conn.read_request():
            conn.sock.sendall(ANSWER[: -len(b"0\r\n\r\n")])
            time.sleep(0.05)
            conn.sock.sendall(b"0\r\n\r\n")

    server, llm = served(script)
    for _ in range(3):
        assert llm.generate("x", max_tokens=5).content == "tok "
    assert len(server.conns) == 1 and server.conns[0].requests == 3


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\nContent-Type: text/event-stream\nTransfer-Encoding: chunked\n\n",  # bare LF
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Folded: a\r\n b\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",  # an obsolete folded header line
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\nTransfer-Encoding: chunked\r\n\r\n",  # > 64 KiB
    ],
    ids=["bare-lf", "obs-fold", "big-head"],
)
def test_a_head_h11_reads_is_read_over_a_real_socket(served: Any, head: bytes) -> None:
    """What httpx (h11) reads, the private transport reads — never a hang, never a refusal: a
    bare-LF head used to wait forever for the CRLF CRLF that never comes."""

    def script(conn: Conn) -> None:
        while conn.read_request():
            conn.sock.sendall(ANSWER.replace(HEAD, head))

    _, llm = served(script)
    t0 = time.perf_counter()
    assert llm.generate("x", max_tokens=5).content == "tok "
    assert time.perf_counter() - t0 < 10


def close_unanswered(conn: Conn) -> None:
    """The request is read, then the connection closes without a word (a keep-alive timeout
    firing just as the request arrived)."""


def test_a_reused_connection_closed_unanswered_sends_the_request_again(served: Any) -> None:
    server, llm = served(answer_then(close_unanswered))
    for _ in range(2):
        assert llm.generate("x", max_tokens=5).content == "tok "
    # the second call's request went on the pooled connection, met its close, and went again
    assert [c.requests for c in server.conns] == [2, 1]


def test_a_call_that_says_connection_close_never_leaves_its_connection_pooled() -> None:
    """The llamacpp lane says ``Connection: close`` (llama-server closes after a streamed answer
    whatever its headers say): a connection the request gave up must not serve the next call,
    even when this server would have kept it."""
    server = ScriptedServer(answer_all)
    llm = create_llm(
        "openai-compatible",
        "m",
        base_url=server.base_url,
        max_retries=0,
        complete_over_stream=True,
        headers={"Connection": "close"},
    )
    try:
        for _ in range(3):
            assert llm.generate("x", max_tokens=5).content == "tok "
    finally:
        llm.close()
        server.close()
    assert [c.requests for c in server.conns] == [1, 1, 1]


def test_a_stopped_call_is_never_sent_again_on_a_new_connection(served: Any) -> None:
    """The sever is what fails a stopped call's request on a pooled connection; that failure looks
    like a server's close, and must not be taken for one and sent again."""
    server, _ = served(answer_then(close_unanswered))
    url = server.base_url + "/chat/completions"

    async def exchange(transport: GuardedTransport) -> None:
        response = await transport.handle_async_request(httpx.Request("POST", url, json={}))
        await response.aread()
        await response.aclose()

    async def main() -> None:
        transport = GuardedTransport(max_idle=4)
        await exchange(transport)  # its connection is pooled
        stopped = SocketGuard()
        stopped.sever()  # the call was stopped: the pooled socket is severed the moment it is bound
        reset = current_guard.set(stopped)
        with pytest.raises(NoResponseError):
            await exchange(transport)
        current_guard.reset(reset)
        await exchange(transport)  # the next call connects afresh
        await transport.aclose()

    anyio.run(main)
    assert [c.requests for c in server.conns] == [1, 1]  # no third connection: the stopped call's


def test_a_large_request_is_encoded_off_the_loop_and_arrives_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request whose text adds up past a piece (a 30 MB document, an image) is encoded on a
    worker thread, a piece at a time (``http/json_encode.py``): on the loop it was one C call of
    40-80 ms, every other stream of a gateway waiting. Small ones stay on the loop (one call)."""
    from abstract_client.http import clients
    from abstract_client.testing import FakeOpenAIServer

    where: list[bool] = []
    real = clients.encode_json

    def recording(value: Any, long: Any = None) -> bytes:
        try:
            asyncio.get_running_loop()
            where.append(True)
        except RuntimeError:
            where.append(False)
        return real(value, long)

    monkeypatch.setattr(clients, "encode_json", recording)
    document = 'é\\n"' * 400_000
    with FakeOpenAIServer(token_delay=0.0) as server:
        with create_llm("openai-compatible", "fake-model", base_url=server.base_url) as llm:
            llm.generate(messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            llm.generate(messages=[{"role": "user", "content": document}], max_tokens=2)
        assert server.requests()[-1].body["messages"][-1]["content"] == document
    assert where == [True, False], where  # on the loop, then on a worker thread
