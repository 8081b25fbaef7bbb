"""What the gateway's ``/health`` and ``/ready`` cost, and how fast they follow a backend (#59).

A gateway process in front of a fake upstream on loopback (this process is the only client):

* ``/health`` and ``/ready``: per request, beside the floor — an unknown route (a 404 through
  the same middleware, no handler work);
* a backend that dies while up, with a request every 50 ms: from the kill to ``/ready`` 503
  (its first call that cannot connect says so; no probe runs for a backend that is up);
* a backend that comes back: from its start to ``/ready`` 200 (a probe every
  ``health_interval``: 1 s here, 5 s by default);
* the log: WARNING lines over 20 s with the store and the backend both down.

    python benchmarks/bench_health.py [-n 500] [--cycles 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _tables import pct, print_table

from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess
from abstract_client.testing.processes import free_port
from tests.test_gateway_hosts import RedisServer

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def latency_rows(url: str, n: int) -> list[dict[str, Any]]:
    rows = []
    with httpx.Client(base_url=url) as client:
        for label, path in (
            ("floor: an unknown route (404)", "/nothing-here"),
            ("/health", "/health"),
            ("/ready", "/ready"),
        ):
            ms = []
            for i in range(n + 50):
                t0 = time.perf_counter()
                client.get(path)
                if i >= 50:
                    ms.append((time.perf_counter() - t0) * 1000)
            rows.append({"route": label, "p50 ms": f"{pct(ms, 50):.2f}", "p99 ms": f"{pct(ms, 99):.2f}"})
    return rows


def wait(predicate: Any, timeout: float = 30) -> float:
    began = time.perf_counter()
    while not predicate():
        if time.perf_counter() - began > timeout:
            raise TimeoutError("not within the timeout")
        time.sleep(0.005)
    return time.perf_counter() - began


def follow_rows(workdir: Path, cycles: int) -> list[dict[str, Any]]:
    port = free_port()
    upstream = FakeOpenAIServer(port=port, token_delay=0.0).__enter__()
    gateway = GatewayProcess.launch(
        ["-p", "vllm", "-u", f"http://127.0.0.1:{port}/v1", "--name", "m", "--health-interval", "1"],
        log_path=workdir / "follow.log",
    )
    client = httpx.Client(base_url=gateway.url, timeout=30)
    down, up = [], []
    try:
        for _ in range(cycles):
            stop = threading.Event()

            def traffic(stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    client.post("/v1/chat/completions", json=CHAT)
                    time.sleep(0.05)

            sender = threading.Thread(target=traffic)
            sender.start()
            time.sleep(0.3)
            upstream.__exit__(None, None, None)
            down.append(wait(lambda: client.get("/ready").status_code == 503) * 1000)
            stop.set()
            sender.join()
            upstream = FakeOpenAIServer(port=port, token_delay=0.0).__enter__()
            up.append(wait(lambda: client.get("/ready").status_code == 200) * 1000)
    finally:
        client.close()
        gateway.stop()
        upstream.__exit__(None, None, None)
    return [
        {
            "what": "backend killed while up (a request every 50 ms) → /ready 503",
            "p50 ms": f"{pct(down, 50):.0f}",
            "max ms": f"{max(down):.0f}",
        },
        {
            "what": "backend back → /ready 200 (health_interval 1 s)",
            "p50 ms": f"{pct(up, 50):.0f}",
            "max ms": f"{max(up):.0f}",
        },
    ]


def log_rows(workdir: Path) -> list[dict[str, Any]]:
    redis = RedisServer(workdir)
    redis.kill()
    gateway = GatewayProcess.launch(
        ["-p", "vllm", "-u", f"http://127.0.0.1:{free_port()}/v1", "--name", "m", "--store", redis.url],
        log_path=workdir / "log.log",
    )
    try:
        time.sleep(20)
        text = gateway.log_text()
    finally:
        gateway.stop()
    warnings = [line for line in text.splitlines() if " WARNING " in line]
    return [{"what": "WARNING lines in 20 s, the store and the backend down", "lines": len(warnings)}]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=500)
    parser.add_argument("--cycles", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAIServer(token_delay=0.0) as upstream:
        gateway = GatewayProcess.launch(
            ["-p", "vllm", "-u", upstream.base_url, "--name", "m"], log_path=Path(tmp) / "latency.log"
        )
        try:
            print_table("/health and /ready, per request (one client, loopback)", latency_rows(gateway.url, args.n))
        finally:
            gateway.stop()
        print_table("following a backend", follow_rows(Path(tmp), args.cycles))
        print_table("the log", log_rows(Path(tmp)))


if __name__ == "__main__":
    main()
