"""The stop bench's reading of a server's evidence, on a fake in its own process: a request
that ran to its end is not "stopped"; one whose client left is, at the fake's own disconnect
time, with the tokens written after the press counted by the fake's record."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from urllib.parse import urlsplit

from abstract_client.app.stop_bench.kit import Press, outcome
from abstract_client.app.stop_bench.servers import FakeServer


def test_a_whole_answer_is_not_a_stop_and_a_client_leaving_is() -> None:
    server = FakeServer("lmstudio", token_delay=0.005)
    try:
        body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 20})
        watch = server.watch()
        urllib.request.urlopen(
            urllib.request.Request(
                server.url + "/v1/chat/completions", body.encode(), {"Content-Type": "application/json"}
            ),
            timeout=10,
        ).read()
        whole = watch.settle(time.perf_counter() - 10)
        assert (whole.requests, whole.stopped, whole.decoded_after) == (1, False, 20)

        watch = server.watch()
        long = json.dumps(
            {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 300, "stream": True}
        )
        where = urlsplit(server.url)
        with socket.create_connection((where.hostname, where.port)) as sock:
            sock.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(long)}\r\n\r\n{long}".encode()
            )
            sock.recv(4096)
            time.sleep(0.2)
            pressed = time.perf_counter()
        left = watch.settle(pressed)
        assert left.requests == 1 and left.stopped, left
        assert left.ended_at is not None and 0 <= left.ended_at - pressed < 2.0, left
        assert left.decoded_after < 300 - 20, left
    finally:
        server.close()


def test_only_a_cancellation_is_typed() -> None:
    class GenerationCancelledError(Exception):
        pass

    def fails(error: BaseException) -> None:
        raise error

    assert outcome(lambda: fails(GenerationCancelledError("x")), Press(None))["typed"]
    assert not outcome(lambda: fails(ConnectionError("closed")), Press(None))["typed"]
    assert not outcome(lambda: "a whole answer", Press(None))["typed"]
