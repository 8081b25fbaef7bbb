"""The gateway's resources under hostile clients (#40's figures, re-measured after its changes).

A real ``abstract-client serve`` process in front of a fake upstream; each attack runs from this
process, and the gateway's RSS, open fds and threads are read from outside (psutil, sampled
every 5 ms while an attack runs):

* bodies: a declared 40 MiB ``Content-Length``, a 200 MB chunked upload, a 10 GB gzip bomb
  (10 MB on the wire, ``Content-Encoding: gzip``): refused, and the peak RSS while they were;
* slow clients: a head trickled a byte a second (slowloris) and a body trickled likewise —
  when the gateway cuts each (``header_timeout`` 10 s, ``body_timeout`` 30 s);
* the key compare: wrong keys sharing no prefix vs all but the last character, 2,000 each,
  interleaved — the medians' difference (a timing signal would be the shared prefix's);
* 1,000 keep-alive requests on one connection: RSS, fds and threads before and after;
* SIGTERM with 20 streams running: how long until each ends with an error frame, and the exit;
* #48's attacks on the newest routes: a background response's readers that never read (RSS
  after 16 responses, 2 held at once, 8 MiB each), requests whose checks were long (tools,
  messages: the answer's time and ``/health``'s worst latency meanwhile), hostile bodies sent
  with ``background: true`` (answered before or after the 200), and 800 concurrent reads of one
  response with ``--workers 2`` (404s were the relay's failures).

    python benchmarks/bench_gateway_hostile.py          # everything
    python benchmarks/bench_gateway_hostile.py --only 48  # #48's rows (run it on two commits for before/after)
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _tables import print_table

from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess

KEY = "k" * 63 + "x"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def show(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    print_table(title, [dict(zip(columns, row, strict=True)) for row in rows])


def resources(pid: int) -> tuple[float, int, int]:
    """(RSS MiB, open fds, threads) of the process and its children."""
    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)]
    return (
        sum(p.memory_info().rss for p in procs) / 2**20,
        sum(p.num_fds() for p in procs),
        sum(p.num_threads() for p in procs),
    )


class PeakRss:
    """The highest RSS of ``pid`` while the ``with`` block runs (sampled every 5 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._done = pid, 0.0, threading.Event()

    def __enter__(self) -> PeakRss:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, resources(self.pid)[0])
            time.sleep(0.005)

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(extra or {})}


def bodies(gw: GatewayProcess) -> list[list[Any]]:
    rows = []

    def declared() -> Iterator[bytes]:
        yield b"{"  # the head says 40 MiB; the gateway answers before reading it

    def chunked() -> Iterator[bytes]:
        piece = b" " * (1 << 20)
        for _ in range(200):
            yield piece

    bomb = gzip.compress(b"\0" * (1 << 30), compresslevel=9) * 10  # 10 GiB of zeros inflated, ~10 MB sent
    cases: list[tuple[str, Callable[[httpx.Client], httpx.Response]]] = [
        (
            "Content-Length: 40 MiB (declared)",
            lambda c: c.post("/v1/chat/completions", content=b"{" * (40 << 20), headers=headers()),
        ),
        ("200 MB chunked upload", lambda c: c.post("/v1/chat/completions", content=chunked(), headers=headers())),
        (
            f"gzip bomb ({len(bomb) / 1e6:.0f} MB sent, 10 GiB inflated)",
            lambda c: c.post("/v1/chat/completions", content=bomb, headers=headers({"Content-Encoding": "gzip"})),
        ),
    ]
    for name, send in cases:
        before = resources(gw.pid)[0]
        with httpx.Client(base_url=gw.url, timeout=120) as client, PeakRss(gw.pid) as peak:
            t0 = time.perf_counter()
            try:
                status: Any = send(client).status_code
            except httpx.HTTPError as exc:  # the gateway answered and closed while we still wrote
                status = type(exc).__name__
            took = time.perf_counter() - t0
        rows.append([name, status, f"{took * 1000:.0f} ms", f"{before:.0f}", f"{peak.peak:.0f}"])
    return rows


def trickle(gw: GatewayProcess, head_done: bool) -> float:
    """Seconds until the gateway closes a connection that sends a byte a second."""
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.settimeout(1.0)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    t0 = time.perf_counter()
    try:
        if head_done:
            sock.sendall(head)
        for i in range(120):
            try:
                sock.sendall(head[i : i + 1] if not head_done else b" ")
            except OSError:
                return time.perf_counter() - t0
            try:
                if sock.recv(65536) == b"":
                    return time.perf_counter() - t0
                return time.perf_counter() - t0  # an answer (408): the connection ends with it
            except TimeoutError:
                continue
        return float("inf")
    finally:
        sock.close()


def key_timing(gw: GatewayProcess, n: int = 2000) -> list[list[Any]]:
    far = "a" * len(KEY)  # shares no prefix with the key
    near = KEY[:-1] + "y"  # shares all but the last character
    times: dict[str, list[float]] = {"far": [], "near": []}
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        for _ in range(50):  # warm up
            client.get("/v1/models", headers={"Authorization": f"Bearer {far}"})
        for i in range(2 * n):
            which = "far" if i % 2 else "near"
            key = far if which == "far" else near
            t0 = time.perf_counter_ns()
            status = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code
            times[which].append((time.perf_counter_ns() - t0) / 1000)
            assert status == 401
    far_p50, near_p50 = statistics.median(times["far"]), statistics.median(times["near"])
    return [
        ["no shared prefix", n, f"{far_p50:.1f}"],
        ["all but the last character", n, f"{near_p50:.1f}"],
        ["difference", "", f"{near_p50 - far_p50:+.1f}"],
    ]


def keep_alive(gw: GatewayProcess, n: int = 1000) -> list[list[Any]]:
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        for _ in range(20):
            client.post("/v1/chat/completions", json=CHAT, headers=headers())
        before = resources(gw.pid)
        t0 = time.perf_counter()
        for _ in range(n):
            assert client.post("/v1/chat/completions", json=CHAT, headers=headers()).status_code == 200
        took = time.perf_counter() - t0
        after = resources(gw.pid)
    return [
        ["RSS MiB", f"{before[0]:.1f}", f"{after[0]:.1f}"],
        ["open fds", before[1], after[1]],
        ["threads", before[2], after[2]],
        [f"{n} requests took", "", f"{took:.1f} s ({n / took:.0f}/s)"],
    ]


def sigterm(gw: GatewayProcess, streams: int = 20) -> list[list[Any]]:
    body = {**CHAT, "max_tokens": 100_000, "stream": True}
    started = threading.Barrier(streams + 1)
    ended: list[tuple[float, bool]] = []
    lock = threading.Lock()

    def stream() -> None:
        frames = 0
        last = ""
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers(), timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    frames += 1
                    last = line[6:]
                    if frames == 3:
                        started.wait(30)
        errored = last.startswith("{") and "error" in json.loads(last)
        with lock:
            ended.append((time.perf_counter(), errored))

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(streams)]
    for t in threads:
        t.start()
    started.wait(30)
    assert gw.proc is not None
    t0 = time.perf_counter()
    gw.proc.send_signal(signal.SIGTERM)
    gw.proc.wait(30)
    exited = time.perf_counter() - t0
    for t in threads:
        t.join(30)
    after = sorted(e[0] - t0 for e in ended)
    return [
        ["streams ended with an error frame", f"{sum(e[1] for e in ended)} of {streams}"],
        ["SIGTERM → first stream ended", f"{after[0] * 1000:.0f} ms"],
        ["SIGTERM → last stream ended", f"{after[-1] * 1000:.0f} ms"],
        ["SIGTERM → process exited", f"{exited * 1000:.0f} ms"],
    ]


# -- #48 ------------------------------------------------------------------------------------------


def _config(tmp: str, upstream: Any, workers: int = 1) -> Path:
    path = Path(tmp) / "gw48.toml"
    path.write_text(
        "[server]\nwrite_timeout = 2\nmax_background = 2\nbackground_max_bytes = 8388608\n"
        f'workers = {workers}\n\n[[backend]]\nname = "m"\nprovider = "openai-compatible"\n'
        f'model = "fake-model"\nbase_url = "{upstream.base_url}"\nmax_concurrent = 64\n'
    )
    return path


def stalled_readers(gw: GatewayProcess, n: int = 16) -> list[list[Any]]:
    """A background response per round, each with one reader that never reads; RSS after."""
    before = resources(gw.pid)[0]
    held = []
    for _ in range(n):
        started = httpx.post(
            gw.url + "/v1/responses",
            json={"model": "m", "input": "x", "max_output_tokens": 1_000_000, "background": True},
            timeout=30,
        ).json()
        if "id" not in started:  # max_background reached: the oldest finished ones make room
            time.sleep(0.5)
            continue
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", gw.port))
        sock.sendall(f"GET /v1/responses/{started['id']}?stream=true HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        held.append(sock)
        time.sleep(1.0)
        httpx.post(f"{gw.url}/v1/responses/{started['id']}/cancel", timeout=30)
    time.sleep(5)  # past the write timeout: a bounded reader is cut by now
    after = resources(gw.pid)[0]
    for sock in held:
        sock.close()
    return [[f"{n} background responses, one reader each that never reads", f"{before:.0f}", f"{after:.0f}"]]


def _health_worst(gw: GatewayProcess, done: threading.Event) -> list[float]:
    worst = [0.0]
    while not done.is_set():
        t0 = time.perf_counter()
        try:
            httpx.get(gw.url + "/health", timeout=120)
        except httpx.HTTPError:
            pass
        worst[0] = max(worst[0], time.perf_counter() - t0)
        time.sleep(0.02)
    return worst


def long_checks(gw: GatewayProcess) -> list[list[Any]]:
    tool = {"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}
    cases = [
        (f"{n:,} tools", {"tools": [{**tool, "function": {**tool["function"], "name": f"t{i}"}} for i in range(n)]})
        for n in (8_000, 32_000)
    ]
    cases.append(("1,000,000 messages", {"messages": [{"role": "user", "content": "x"}] * 1_000_000}))
    rows = []
    for name, extra in cases:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra}
        # serialised before the watch starts: json.dumps holds this process's GIL, and the
        # /health poller is a thread of this process (the harness must not be what is measured)
        content = json.dumps(body, separators=(",", ":")).encode()
        done = threading.Event()
        worst: list[float] = []
        watcher = threading.Thread(target=lambda w=worst, d=done: w.extend(_health_worst(gw, d)), daemon=True)
        watcher.start()
        t0 = time.perf_counter()
        try:
            status: Any = httpx.post(
                gw.url + "/v1/chat/completions",
                content=content,
                headers={"content-type": "application/json"},
                timeout=300,
            ).status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        took = time.perf_counter() - t0
        done.set()
        watcher.join()
        rows.append([name, status, f"{took * 1000:.0f} ms", f"{max(worst or [0]) * 1000:.0f} ms"])
    return rows


def background_bodies(gw: GatewayProcess) -> list[list[Any]]:
    weather = {"type": "function", "name": "w", "parameters": {"type": "object"}}
    bad: list[tuple[str, dict[str, Any] | None, str | None]] = [
        ('a {"$ref": "#"} schema', {"tools": [{**weather, "parameters": {"$ref": "#"}}]}, None),
        ("duplicate tool names", {"tools": [weather, weather]}, None),
        ("top_p: 5", {"top_p": 5}, None),
        ("stop: 5", {"stop": 5}, None),
        (
            "image_url file:///etc/passwd",
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/passwd"}]}]},
            None,
        ),
        ("temperature: NaN", None, '"temperature": NaN'),
        ("seed: 1e400", None, '"seed": 1e400'),
    ]
    rows = []
    for name, extra, raw in bad:
        body = {"model": "m", "input": "x", "background": True, **(extra or {})}
        text = json.dumps(body) if raw is None else json.dumps(body)[:-1] + ", " + raw + "}"
        answer = httpx.post(
            gw.url + "/v1/responses", content=text, headers={"content-type": "application/json"}, timeout=30
        )
        status = answer.json().get("status") if answer.status_code == 200 else ""
        rows.append([name, answer.status_code, status])
    return rows


def relayed_reads(gw: GatewayProcess, n: int = 800) -> list[list[Any]]:
    import asyncio

    started = httpx.post(
        gw.url + "/v1/responses",
        json={"model": "m", "input": "x", "max_output_tokens": 1_000_000, "background": True},
        timeout=30,
    ).json()
    url = f"{gw.url}/v1/responses/{started['id']}"

    async def burst() -> list[Any]:
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=120) as client:

            async def one() -> Any:
                try:
                    return (await client.get(url)).status_code
                except httpx.HTTPError as exc:
                    return type(exc).__name__

            return await asyncio.gather(*(one() for _ in range(n)))

    outcomes = asyncio.run(burst())
    httpx.post(url + "/cancel", timeout=30)
    counts = {str(o): outcomes.count(o) for o in set(outcomes)}
    return [[f"{n} concurrent GETs of one running response, --workers 2", json.dumps(counts, sort_keys=True)]]


def main48() -> None:
    with FakeOpenAIServer(token_delay=0.002) as upstream, tempfile.TemporaryDirectory() as tmp:
        upstream.behavior.answer = ("x" * 1000 + " ") * 200_000  # 1 KB tokens: windows fill in seconds
        gw = GatewayProcess.launch(["--config", str(_config(tmp, upstream))], log_path=Path(tmp) / "gw.log")
        try:
            show("#48: readers that never read", ["attack", "RSS before MiB", "RSS after MiB"], stalled_readers(gw))
            show("#48: long checks", ["request", "status", "answered in", "/health worst"], long_checks(gw))
            show("#48: hostile bodies with background: true", ["body", "HTTP", "status"], background_bodies(gw))
        finally:
            gw.stop()
        upstream.behavior.answer = None
        gw = GatewayProcess.launch(["--config", str(_config(tmp, upstream, workers=2))], log_path=Path(tmp) / "gw2.log")
        try:
            show("#48: relayed reads", ["attack", "outcomes"], relayed_reads(gw))
        finally:
            gw.stop()


def main() -> None:
    if sys.argv[1:] == ["--only", "48"]:
        main48()
        return
    with FakeOpenAIServer(token_delay=0.005) as upstream, tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "BENCH_KEY": KEY}
        args = ["-p", "openai-compatible", "-u", upstream.base_url, "-m", "fake-model", "--api-key-env", "BENCH_KEY"]
        args += ["--max-concurrent", "32"]
        gw = GatewayProcess.launch(args, log_path=Path(tmp) / "gw.log", env=env)
        try:
            rss, fds, threads = resources(gw.pid)
            print(f"gateway pid {gw.pid}: {rss:.0f} MiB RSS, {fds} fds, {threads} threads at start\n")
            show(
                "Bodies past the limits",
                ["body", "status", "answered in", "RSS before MiB", "peak RSS MiB"],
                bodies(gw),
            )
            cuts: dict[str, float] = {}
            workers = [
                threading.Thread(target=lambda: cuts.__setitem__("head", trickle(gw, head_done=False))),
                threading.Thread(target=lambda: cuts.__setitem__("body", trickle(gw, head_done=True))),
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            show(
                "Slow clients",
                ["a byte a second", "cut after", "setting"],
                [
                    ["the head (slowloris)", f"{cuts['head']:.1f} s", "header_timeout 10 s"],
                    ["the body", f"{cuts['body']:.1f} s", "body_timeout 30 s"],
                ],
            )
            show("The key compare", ["wrong key", "requests", "p50 µs"], key_timing(gw))
            show("1,000 keep-alive requests", ["resource", "before", "after"], keep_alive(gw))
            show("SIGTERM with 20 streams running", ["what", "figure"], sigterm(gw))
        finally:
            gw.stop()
    main48()


if __name__ == "__main__":
    main()
