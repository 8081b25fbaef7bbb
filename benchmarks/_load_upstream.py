"""The load benchmark's upstream: an OpenAI-style SSE server cheap enough not to be the limit.

Every stream is paced by ONE ticker (every 10 ms it writes the frames each stream is due), the
frames are rendered once, and HTTP is parsed by hand: 300 streams x 100 chunks/s cost this
process a fraction of a core. The request's user message says what to do: ``tag=<id>
rate=<chunks/s> n=<chunks>`` (rate 0: all chunks in one write). Each stream's end is recorded
on ``time.monotonic()`` (CLOCK_MONOTONIC, shared by every process on the machine): when the
peer's FIN/RST arrived, and whether every chunk was written first.

    python benchmarks/_load_upstream.py   # prints its base URL; GET /stats, POST /reset
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time

from _prerendered import sse_chunk

_ASK = re.compile(rb"tag=(\S+) rate=(\d+) n=(\d+)")
TICK = 0.01


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)  # one HTTP chunk per SSE frame


FRAMES = [_http_chunk(sse_chunk(f"w{i} ")) for i in range(10)]
_USAGE = {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
_END = sse_chunk(None, finish_reason="length", usage=_USAGE) + b"data: [DONE]\n\n"
END = _http_chunk(_END) + b"0\r\n\r\n"


def _end(sent: int) -> bytes:
    """The end of a stream, with the usage the engine counted: every chunk it sent."""
    usage = {"prompt_tokens": 5, "completion_tokens": sent, "total_tokens": 5 + sent}
    return _http_chunk(sse_chunk(None, finish_reason="length", usage=usage) + b"data: [DONE]\n\n") + b"0\r\n\r\n"


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _json_answer(status: int, body: object) -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        len(data),
        data,
    )


class Stream:
    __slots__ = ("closed_at", "conn", "due", "rate", "sent", "started", "tag", "total")

    def __init__(self, conn: Conn, tag: str, rate: int, total: int) -> None:
        self.conn, self.tag, self.rate, self.total = conn, tag, rate, total
        self.sent = 0
        self.started = time.monotonic()
        self.closed_at: float | None = None
        self.due = 0.0


class Server:
    def __init__(self) -> None:
        self.streams: set[Stream] = set()
        self.records: list[Stream] = []

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            for s in list(self.streams):
                want = min(s.total, int((now - s.started) * s.rate) + 1)
                if want > s.sent:
                    s.conn.transport.write(b"".join(FRAMES[i % 10] for i in range(s.sent, want)))
                    s.sent = want
                if s.sent >= s.total:
                    self.finish(s)

    def finish(self, s: Stream) -> None:
        s.conn.transport.write(_end(s.sent))
        s.conn.stream = None
        self.streams.discard(s)

    def stats(self) -> list[dict[str, object]]:
        return [
            {"tag": s.tag, "sent": s.sent, "total": s.total, "finished": s.sent >= s.total, "closed_at": s.closed_at}
            for s in self.records
        ]


SERVER = Server()


class Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.stream: Stream | None = None
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.closed_at = time.monotonic()
            SERVER.streams.discard(self.stream)
            self.stream = None

    def eof_received(self) -> bool:
        self.connection_lost(None)
        return False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if not sep:
                return
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            body, self.buf = rest[:length], rest[length:]
            self.request(head.split(b" ", 2), body)

    def request(self, line: list[bytes], body: bytes) -> None:
        method, path = line[0], line[1]
        if path == b"/stats":
            self.transport.write(_json_answer(200, SERVER.stats()))
            return
        if path == b"/reset":
            SERVER.records.clear()
            self.transport.write(_json_answer(200, {}))
            return
        if method == b"GET":
            self.transport.write(_json_answer(200, {"object": "list", "data": [{"id": "fake-model"}]}))
            return
        ask = _ASK.search(body)
        tag, rate, total = (ask.group(1).decode(), int(ask.group(2)), int(ask.group(3))) if ask else ("-", 0, 1)
        if b'"stream":true' not in body.replace(b" ", b""):
            answer = {
                "id": "cmpl-load",
                "object": "chat.completion",
                "created": 1,
                "model": "fake-model",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "w0 "}, "finish_reason": "length"}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
            self.transport.write(_json_answer(200, answer))
            return
        stream = Stream(self, tag, rate, total)
        SERVER.records.append(stream)
        self.transport.write(STREAM_HEAD)
        if rate == 0:
            self.transport.write(b"".join(FRAMES[i % 10] for i in range(total)))
            stream.sent = total
            self.stream = stream
            SERVER.finish(stream)
            return
        self.stream = stream
        SERVER.streams.add(stream)


async def main() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Conn, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    await SERVER.tick()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
