"""A small threaded HTTP/1.1 server on a real loopback socket, the base of the fake backends.

Why not respx or http.server: a stop is only proven when the *server* sees the connection go, so
this server watches its sockets itself. While it "computes" (prompt processing, a held
non-streaming body, the gap between tokens) it waits in ``select()`` on the client socket, so a
FIN or RST from the client is noticed within microseconds and timestamped
(``RequestRecord.disconnected_at``, ``time.perf_counter()``, comparable with the test's own
clock). Every token written is timestamped too, so a test can count tokens sent after its stop.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from .._validate import MAX_DIMENSIONS

log = logging.getLogger(__name__)
# like a real server, the fake refuses vectors longer than any model has: the library's bound
MAX_EMBED_DIM = MAX_DIMENSIONS


class ClientGone(Exception):
    """The client closed or reset the connection."""


@dataclass
class RequestRecord:
    """What the server saw of one request."""

    id: int
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    received_at: float
    headers_sent_at: float | None = None
    disconnected_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    completed: bool = False
    status: int | None = None
    fault: str | None = None
    images: list[bytes] = field(default_factory=list)  # every image the request carried, decoded

    @property
    def tokens_sent(self) -> int:
        return len(self.token_times)

    def tokens_sent_after(self, t: float) -> int:
        """Tokens written after ``t`` (a ``time.perf_counter()`` value, e.g. when you pressed Stop)."""
        return sum(1 for x in self.token_times if x > t)


@dataclass
class Behavior:
    """Knobs shared by every fake backend. Change them at any time (``server.behavior.x = ...``)."""

    answer: str | None = None  # None: an endless "tok0 tok1 ..." answer bounded by max_tokens
    default_max_tokens: int = 16
    token_delay: float = 0.005  # seconds between tokens (1/token rate)
    prefill_delay: float = 0.0  # prompt processing before the first token
    prefill_per_char: float = 0.0  # extra prompt processing per character of the prompt
    headers_before_prefill: bool = False  # stream headers at once, then "compute" the prompt
    finish_prompt_before_disconnect: bool = False  # LM Studio / Ollama <0.30: prefill can't stop
    fault: str | None = None  # applied to every request (see Fault names in README of testing)
    fail_after_tokens: int = 2
    retry_after: float | None = None  # Retry-After header on 429/503 faults
    embed_delay: float = 0.0  # seconds of "compute" per embedding input (a disconnect interrupts)
    embed_dim: int = 8  # length of the (deterministic, unit-length) fake embedding vectors
    models: dict[str, bool] = field(default_factory=lambda: {"fake-model": True})
    # An answer scripted as wire pieces, one per token: {"content": s}, {"reasoning": s}, or
    # {"tool": index, "id": ..., "name": ..., "arguments": fragment} (id/name on the first piece)
    script: list[dict[str, Any]] | None = None
    reasoning_field: str = "reasoning_content"  # llama-server's name; vLLM says "reasoning"
    template_tools: bool = True  # /props: the chat template does tool calls (SmolLM2's does not)
    vision: bool = True  # the model takes images (/props modalities.vision on llama-server's wire)


def decode_image(value: Any, *, data_url: bool) -> bytes | str:
    """An image as a server reads it: a ``data:image/...;base64,`` URL (or bare base64 when
    ``data_url`` is false) → its bytes; anything else → what the server would say about it."""
    text = value if isinstance(value, str) else ""
    if data_url:
        head, sep, text = text.partition(",")
        if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
            return f"invalid image data URL: {str(value)[:40]!r}"
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        return "illegal base64 data"


def script_finish(script: list[dict[str, Any]]) -> str:
    return "tool_calls" if any("tool" in p for p in script) else "stop"


def script_delta(piece: dict[str, Any], reasoning_field: str) -> dict[str, Any]:
    """One scripted piece as an OpenAI ``delta``."""
    if "tool" in piece:
        call: dict[str, Any] = {"index": piece["tool"], "function": {"arguments": piece.get("arguments", "")}}
        if piece.get("id"):
            call.update(id=piece["id"], type="function")
            call["function"]["name"] = piece.get("name")
        return {"tool_calls": [call]}
    if "reasoning" in piece:
        return {reasoning_field: piece["reasoning"]}
    return {"content": piece.get("content", "")}


def script_calls(pieces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The whole calls of scripted pieces (OpenAI message shape, arguments as JSON text)."""
    calls: dict[int, dict[str, Any]] = {}
    for p in pieces:
        if "tool" in p:
            c = calls.setdefault(
                p["tool"], {"id": p.get("id"), "type": "function", "function": {"name": p.get("name"), "arguments": ""}}
            )
            c["function"]["arguments"] += p.get("arguments", "")
    return [calls[i] for i in sorted(calls)]


def script_message(pieces: list[dict[str, Any]], reasoning_field: str) -> dict[str, Any]:
    """Scripted pieces as one OpenAI assistant ``message``."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(p.get("content", "") for p in pieces)}
    reasoning = "".join(p.get("reasoning", "") for p in pieces)
    if reasoning:
        message[reasoning_field] = reasoning
    calls = script_calls(pieces)
    if calls:
        message["tool_calls"] = calls
    return message


class Conn:
    """One client connection, with disconnect-aware waiting and writing."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.record: RequestRecord | None = None

    def gone(self) -> bool:
        """True if the client has closed or reset the connection (non-blocking)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            if not readable:
                return False
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def wait(self, seconds: float, *, interruptible: bool = True) -> None:
        """Spend ``seconds`` "computing"; raise ClientGone the moment the client leaves."""
        if not interruptible:
            time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if self.gone():
                    self._mark_gone()
                return
            try:
                readable, _, _ = select.select([self.sock], [], [], remaining)
            except (OSError, ValueError):
                self._mark_gone()
            if readable and self.gone():
                self._mark_gone()
            if readable and not self.gone():
                time.sleep(min(remaining, 0.001))  # pipelined bytes: not ours to read yet

    def _mark_gone(self) -> None:
        if self.record is not None and self.record.disconnected_at is None:
            self.record.disconnected_at = time.perf_counter()
        raise ClientGone

    def send(self, data: bytes) -> None:
        if self.gone():
            self._mark_gone()
        try:
            self.sock.sendall(data)
        except OSError:
            self._mark_gone()

    def send_head(self, status: int, headers: dict[str, str]) -> None:
        reason = {
            200: "OK",
            307: "Temporary Redirect",
            400: "Bad Request",
            404: "Not Found",
            429: "Too Many Requests",
            500: "Internal Server Error",
            502: "Bad Gateway",
            503: "Service Unavailable",
            504: "Gateway Timeout",
        }.get(status, "Status")
        lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode())
        if self.record is not None:
            self.record.status = status
            self.record.headers_sent_at = time.perf_counter()

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_head(
            status, {"Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
        )
        self.send(body)

    def start_chunked(self, content_type: str) -> None:
        self.send_head(200, {"Content-Type": content_type, "Transfer-Encoding": "chunked", "Cache-Control": "no-cache"})

    def chunk(self, data: bytes, *, token: bool = False) -> None:
        self.send(b"%x\r\n%s\r\n" % (len(data), data))
        if token and self.record is not None:
            self.record.token_times.append(time.perf_counter())

    def end_chunked(self) -> None:
        self.send(b"0\r\n\r\n")

    def reset(self) -> None:
        """Abort the connection with an RST (SO_LINGER 0)."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.sock.close()

    def read_request(self) -> tuple[str, str, dict[str, str], bytes] | None:
        # bytearrays grow in amortised O(1): a 200 MB upload is read in linear time
        buf = bytearray(self.buf)
        while b"\r\n\r\n" not in buf:
            data = self.sock.recv(65536)
            if not data:
                return None
            buf += data
            if len(buf) > 1 << 20 and b"\r\n\r\n" not in buf[: 1 << 20]:
                return None  # a header block over 1 MiB: not a request we serve
        head, _, tail = bytes(buf).partition(b"\r\n\r\n")
        rest = bytearray(tail)
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0") or 0)
        while len(rest) < length:
            data = self.sock.recv(65536)
            if not data:
                return None
            rest += data
        body, self.buf = bytes(rest[:length]), bytes(rest[length:])
        return method, path, headers, body


Handler = Callable[[Conn, RequestRecord], None]


class _EndlessAnswer(Sequence[str]):
    """``tok0 tok1 ...``, ``n`` tokens, made one at a time as they are sent: a request for
    ``max_tokens=1e9`` costs no memory up front."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [f"tok{k} " for k in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return f"tok{i % self._n} "


class FakeServer:
    """Base of the fake backends: a real HTTP/1.1 server on 127.0.0.1, one thread per connection.

    Use it as a context manager (``with FakeOpenAIServer() as server: ...``); ``base_url`` is
    where it listens, ``records`` what it saw, ``behavior`` its knobs.
    """

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, behavior: Behavior | None = None, **knobs: Any
    ) -> None:
        self.behavior = behavior or Behavior()
        for key, value in knobs.items():
            if not hasattr(self.behavior, key):
                raise TypeError(f"unknown knob {key!r}")
            setattr(self.behavior, key, value)
        self._host, self._port = host, port
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._faults: list[str] = []
        self.records: list[RequestRecord] = []
        self.connections = 0
        self._stopping = threading.Event()

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> FakeServer:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, self._port))
        listener.listen(1024)
        self._listener = listener
        self._port = listener.getsockname()[1]
        thread = threading.Thread(target=self._accept_loop, name=f"{type(self).__name__}-accept", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def base_url(self) -> str:
        """The URL to pass as ``create_llm(..., base_url=...)``."""
        return self.url

    # -- what the server saw --------------------------------------------------------------------

    def inject(self, fault: str, count: int = 1) -> None:
        """Apply ``fault`` to the next ``count`` generation requests."""
        with self._lock:
            self._faults.extend([fault] * count)

    def _next_fault(self) -> str | None:
        with self._lock:
            if self._faults:
                return self._faults.pop(0)
        return self.behavior.fault

    def requests(self, path: str | None = None) -> list[RequestRecord]:
        with self._lock:
            return [r for r in self.records if path is None or r.path.split("?")[0] == path]

    @property
    def last(self) -> RequestRecord:
        with self._lock:
            return self.records[-1]

    def wait_for_request(self, n: int = 1, timeout: float = 5.0, path: str | None = None) -> RequestRecord:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.requests(path)
            if len(found) >= n:
                return found[n - 1]
            time.sleep(0.001)
        raise TimeoutError(f"the server did not receive request #{n} within {timeout}s")

    def wait_for_disconnect(self, record: RequestRecord, timeout: float = 5.0) -> float:
        """Block until the server saw ``record``'s client go; return that perf_counter time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if record.disconnected_at is not None:
                return record.disconnected_at
            if record.completed:
                raise AssertionError("the request completed: the server never saw a disconnect")
            time.sleep(0.0005)
        raise TimeoutError(f"the server did not see the disconnect within {timeout}s")

    def open_connections(self) -> int:
        with self._lock:
            return len(self._conns)

    # -- serving ------------------------------------------------------------------------------------

    def route(self, method: str, path: str) -> Handler | None:  # overridden by each backend
        return None

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(sock)
                self.connections += 1
            threading.Thread(target=self._serve, args=(sock,), daemon=True, name="fake-conn").start()

    def _serve(self, sock: socket.socket) -> None:
        conn = Conn(sock)
        try:
            while not self._stopping.is_set():
                try:
                    parsed = conn.read_request()
                except OSError:
                    return
                if parsed is None:
                    return
                method, target, headers, raw = parsed
                if target.startswith("/_fake/"):
                    self._control(conn, method, target, raw)
                    continue
                try:
                    body = json.loads(raw) if raw else None
                except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit
                    body = raw
                record = RequestRecord(
                    id=len(self.records),
                    method=method,
                    path=target,
                    headers=headers,
                    body=body,
                    received_at=time.perf_counter(),
                )
                with self._lock:
                    self.records.append(record)
                conn.record = record
                handler = self.route(method, target.split("?")[0])
                try:
                    if handler is None:
                        self.not_found(conn, method, target)
                    else:
                        handler(conn, record)
                    record.completed = record.disconnected_at is None
                except ClientGone:
                    return
                except _CloseConnection:
                    return
                if headers.get("connection", "").lower() == "close":
                    return
        except Exception:
            log.exception("fake server handler failed")
        finally:
            with self._lock:
                self._conns.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _control(self, conn: Conn, method: str, target: str, raw: bytes) -> None:
        """Out-of-process control: ``GET /_fake/records``, ``POST /_fake/behavior`` (knobs as
        JSON), ``POST /_fake/inject`` (``{"fault", "count"}``). Not recorded as requests."""
        body = json.loads(raw) if raw else {}
        if method == "GET" and target == "/_fake/records":
            with self._lock:
                records = [_record_json(r) for r in self.records]
            conn.send_json(200, {"records": records, "connections": self.connections})
        elif method == "POST" and target == "/_fake/behavior":
            for key, value in body.items():
                if hasattr(self.behavior, key):
                    setattr(self.behavior, key, value)
            conn.send_json(200, dataclasses.asdict(self.behavior))
        elif method == "POST" and target == "/_fake/inject":
            self.inject(str(body["fault"]), int(body.get("count", 1)))
            conn.send_json(200, {"ok": True})
        else:
            conn.send_json(404, {"error": "unknown control route"})

    def not_found(self, conn: Conn, method: str, path: str) -> None:
        conn.send_json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    # -- helpers for handlers ---------------------------------------------------------------------

    def prompt_text(self, record: RequestRecord) -> str:
        body = record.body if isinstance(record.body, dict) else {}
        if isinstance(body.get("prompt"), str):
            return str(body["prompt"])
        parts = []
        for m in body.get("messages") or []:
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                parts.append(m["content"])
        if isinstance(body.get("input"), str):
            parts.append(body["input"])
        return "\n".join(parts)

    def embedding_request(
        self, conn: Conn, record: RequestRecord, unknown_model: Callable[[str], Any]
    ) -> tuple[str, list[str], Any] | None:
        """The common start of an embeddings request: faults, the model, the ``input`` list.
        Returns ``(model, inputs, dimensions)``, or None when an answer (fault, 404, 400) was
        already sent."""
        body = record.body if isinstance(record.body, dict) else {}
        fault = self._next_fault()
        record.fault = fault
        if self.early_fault(conn, fault):
            return None
        model = str(body.get("model"))
        if model not in self.behavior.models:
            conn.send_json(404, unknown_model(model))
            return None
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            conn.send_json(400, self.error_body(400, "input must be a string or a list of strings"))
            return None
        dimensions = body.get("dimensions")
        if dimensions is not None and not (isinstance(dimensions, int) and 1 <= dimensions <= MAX_EMBED_DIM):
            conn.send_json(400, self.error_body(400, f"dimensions must be an integer from 1 to {MAX_EMBED_DIM}"))
            return None
        return model, inputs, dimensions

    def embed_all(self, conn: Conn, inputs: list[str], dimensions: Any = None) -> list[list[float]]:
        """One vector per input, ``embed_delay`` apart; raises ClientGone if the client leaves.
        The same text always gives the same unit-length vector."""
        dim = dimensions if isinstance(dimensions, int) and dimensions > 0 else self.behavior.embed_dim
        vectors = []
        for text in inputs:
            if self.behavior.embed_delay:
                conn.wait(self.behavior.embed_delay)
            digest = hashlib.sha256(text.encode()).digest()
            raw = [(digest[i % len(digest)] - 127.5) / 127.5 + 1e-3 for i in range(dim)]
            norm = math.sqrt(sum(x * x for x in raw))
            vectors.append([x / norm for x in raw])
            if conn.record is not None:  # one "token" per input embedded: the work-done record
                conn.record.token_times.append(time.perf_counter())
        return vectors

    def prefill(self, conn: Conn, record: RequestRecord) -> None:
        b = self.behavior
        seconds = b.prefill_delay + b.prefill_per_char * len(self.prompt_text(record))
        if seconds > 0:
            conn.wait(seconds, interruptible=not b.finish_prompt_before_disconnect)

    def decode_whole_answer(self, conn: Conn, record: RequestRecord, tokens: Iterable[object]) -> None:
        """A non-streaming answer's decode, before anything is sent: a token delay per token,
        each token's time recorded (a stop test's evidence that decoding ended)."""
        for _ in tokens:
            conn.wait(self.behavior.token_delay)
            record.token_times.append(time.perf_counter())

    def tokens(self, max_tokens: int | None) -> tuple[Sequence[str], str]:
        """The answer as tokens, and the finish reason (``stop`` or ``length``)."""
        b = self.behavior
        limit = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else b.default_max_tokens
        if b.answer is not None:
            words = _split_tokens(b.answer)
            return (words[:limit], "length") if len(words) > limit else (words, "stop")
        return _EndlessAnswer(limit), "length"

    def stream_tokens(
        self,
        conn: Conn,
        tokens: Sequence[str],
        frame: Callable[[str], bytes],
        fault: str | None,
        fault_frame: Callable[[str], None],
    ) -> bool:
        """Send tokens at the configured rate; return False if a fault ended the stream."""
        for i, tok in enumerate(tokens):
            if fault is not None and i == self.behavior.fail_after_tokens:
                fault_frame(fault)
                return False
            if i:
                conn.wait(self.behavior.token_delay)
            conn.chunk(frame(tok), token=True)
        if fault is not None and self.behavior.fail_after_tokens >= len(tokens):
            fault_frame(fault)
            return False
        return True

    def common_fault(self, conn: Conn, fault: str) -> bool:
        """Faults that behave the same on every wire; True if handled (stream ended)."""
        if fault == "drop":
            conn.reset()
            raise _CloseConnection
        if fault == "stall":
            conn.wait(3600)
            return True
        if fault == "close_without_done":
            conn.end_chunked()
            raise _CloseConnection
        if fault == "invalid_utf8":
            conn.chunk(b'data: {"x": "\xff\xfe"}\n\n')
            conn.end_chunked()
            return True
        if fault == "huge_line":
            conn.chunk(b"data: " + b"x" * (10 * 1024 * 1024))
            conn.end_chunked()
            return True
        return False

    def early_fault(self, conn: Conn, fault: str | None) -> bool:
        """Faults that happen before any body; True if the request was answered."""
        if fault is None:
            return False
        if fault.startswith("status_"):
            status = int(fault.split("_", 1)[1])
            headers = {"Retry-After": str(self.behavior.retry_after)} if self.behavior.retry_after is not None else {}
            conn.send_json(status, self.error_body(status, f"injected HTTP {status}"), headers)
            return True
        if fault == "loading_503":
            headers = {"Retry-After": str(self.behavior.retry_after)} if self.behavior.retry_after is not None else {}
            conn.send_json(503, self.error_body(503, "Loading model"), headers)
            return True
        if fault == "json_error_200":  # LM Studio: an error as JSON under HTTP 200, stream or not
            conn.send_json(200, {"error": "Model unloaded"})
            return True
        if fault == "no_answer":
            conn.wait(3600)
            return True
        if fault == "redirect":
            conn.send_head(307, {"Location": "http://127.0.0.1:1/elsewhere", "Content-Length": "0"})
            return True
        if fault == "refuse":
            conn.reset()
            raise _CloseConnection
        return False

    def error_body(self, status: int, message: str) -> Any:
        return {"error": {"code": status, "message": message, "type": "server_error"}}


def _record_json(record: RequestRecord) -> dict[str, Any]:
    """A record as JSON for ``GET /_fake/records``: each image as its size and SHA-256 (bytes are
    not JSON), a body nested too deep to encode as a note (``dataclasses.asdict`` recursed
    through it and the route answered nothing)."""
    out = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    out["images"] = [
        {"bytes": len(image), "sha256": hashlib.sha256(image).hexdigest()} if isinstance(image, bytes) else image
        for image in record.images
    ]
    if isinstance(out["body"], bytes):
        out["body"] = out["body"].decode("utf-8", "replace")
    try:
        json.dumps({"records": [{"body": out["body"]}]})  # as deep as the answer will hold it
    except (RecursionError, ValueError, TypeError) as exc:
        out["body"] = {"unencodable": f"{type(exc).__name__}: the body cannot be sent back as JSON"}
    return out


class _CloseConnection(Exception):
    pass


def _split_tokens(text: str) -> list[str]:
    import re

    return re.findall(r"\s*\S+", text) or [text]
