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
* SIGTERM with 20 streams running: how long until each ends with an error frame, and the exit.

    python benchmarks/bench_gateway_hostile.py
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


def main() -> None:
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


if __name__ == "__main__":
    main()
