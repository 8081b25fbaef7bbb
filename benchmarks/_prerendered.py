"""A server whose SSE answer is rendered before the request arrives and written in one
``sendall``: it costs the kernel's copy, so a client benchmark against it measures the client.

    python benchmarks/_prerendered.py N_CHUNKS   # prints the base URL, serves until killed
"""

from __future__ import annotations

import json
import socket
import sys
import threading


def sse_chunk(content: str | None, *, finish_reason: str | None = None, **extra: object) -> bytes:
    """One ``chat.completion.chunk`` SSE frame (``content`` None: an empty delta)."""
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake-model",
        "choices": [
            {"index": 0, "delta": {} if content is None else {"content": content}, "finish_reason": finish_reason}
        ],
        **extra,
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def render(n_chunks: int) -> bytes:
    frames = [sse_chunk(f"tok{i} ") for i in range(n_chunks)]
    frames.append(sse_chunk(None, finish_reason="length") + b"data: [DONE]\n\n")
    body = b"".join(frames)
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
    )
    return head + body


def serve(n_chunks: int) -> None:
    answer = render(n_chunks)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", flush=True)

    def handle(conn: socket.socket) -> None:
        with conn:
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                conn.sendall(answer)

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
