"""The gateway's cost and its stop chain.

1. Overhead per request (a 1-token non-streaming answer) and per chunk (a 2,000-chunk stream
   with no token delay) through ``abstract-client serve`` vs calling the same fake upstream
   directly (vLLM wire, a real loopback socket).
2. Client disconnect → upstream severed: the client closes its stream; the fake upstream (in
   this process, same clock) timestamps the FIN it sees.
3. With ``--mlx``: the chain in front of in-process mlx-lm (SmolLM2): the gateway's own figure
   from the disconnect it saw to the MLX worker drained.

Usage: python benchmarks/bench_gateway.py [-n 200] [--mlx]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
from _tables import pct, print_table

from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]


def per_request(http: httpx.Client, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = http.post(url + CHAT, json={"model": "fake-model", "messages": HELLO, "max_tokens": 1})
        r.raise_for_status()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def per_chunk(http: httpx.Client, url: str, chunks: int) -> float:
    body = {"model": "fake-model", "messages": HELLO, "max_tokens": chunks, "stream": True}
    t0 = time.perf_counter()
    n = 0
    with http.stream("POST", url + CHAT, json=body) as r:
        for line in r.iter_lines():
            n += line.startswith("data: ")
    return (time.perf_counter() - t0) * 1e6 / max(n, 1)


def disconnect_to_sever(upstream: FakeOpenAIServer, gateway_url: str, n: int) -> list[float]:
    """A raw socket client: send the request, read a few chunks, close; the upstream's FIN time
    minus the close time."""
    host, port = gateway_url.removeprefix("http://").split(":")
    out = []
    body = b'{"model":"fake-model","messages":[{"role":"user","content":"hi"}],"max_tokens":100000,"stream":true}'
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    for _ in range(n):
        before = len(upstream.requests(CHAT))
        sock = socket.create_connection((host, int(port)))
        sock.sendall(head + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(65536)
        record = upstream.wait_for_request(before + 1, path=CHAT)
        record = upstream.requests(CHAT)[before]
        t_close = time.perf_counter()
        sock.close()
        t_fin = upstream.wait_for_disconnect(record, timeout=10)
        out.append((t_fin - t_close) * 1000)
    return out


def mlx_chain(n: int) -> list[float]:
    from abstract_client.app.assets import smollm2_mlx
    from abstract_client.gateway import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    config = GatewayConfig(backends=[BackendConfig(name="smollm2", provider="mlx", model=str(smollm2_mlx()))])
    body = {"model": "smollm2", "messages": HELLO, "max_tokens": 2000, "stream": True, "logit_bias": {"2": -1e9}}
    with InProcessGateway(config) as gw:
        metrics = gw.gateway.metrics
        for _ in range(n):
            with httpx.stream("POST", gw.url + CHAT, json=body, timeout=120) as r:
                seen = 0
                for line in r.iter_lines():
                    seen += line.startswith("data: ")
                    if seen == 3:
                        break
            gw.gateway.backends["smollm2"].llm.provider.thread.wait_idle(30)
        deadline = time.monotonic() + 10
        while metrics._count < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return [float(x) for x in metrics.chain_ms]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--mlx", action="store_true", help="also the chain in front of in-process mlx-lm")
    args = parser.parse_args()
    with FakeOpenAIServer(token_delay=0.0) as upstream, tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess.launch(
            [
                "-p",
                "vllm",
                "-u",
                upstream.base_url,
                "-m",
                "fake-model",
                "--log-level",
                "warning",
                "--max-concurrent",
                "8",
            ],
            log_path=Path(tmp) / "gw.log",
        )
        try:
            with httpx.Client(timeout=60) as http:
                per_request(http, upstream.url, 20)
                per_request(http, gw.url, 20)
                direct, via = per_request(http, upstream.url, args.n), per_request(http, gw.url, args.n)
                chunk_direct = min(per_chunk(http, upstream.url, args.chunks) for _ in range(3))
                chunk_via = min(per_chunk(http, gw.url, args.chunks) for _ in range(3))
            print_table(
                f"per request: 1-token non-streaming answer, n={args.n} (ms)",
                [
                    {"path": "direct to the upstream", "p50": pct(direct, 50), "p99": pct(direct, 99)},
                    {"path": "through the gateway", "p50": pct(via, 50), "p99": pct(via, 99)},
                    {
                        "path": "gateway overhead",
                        "p50": pct(via, 50) - pct(direct, 50),
                        "p99": pct(via, 99) - pct(direct, 99),
                    },
                ],
            )
            print_table(
                f"per chunk: {args.chunks}-chunk stream, best of 3 (µs per chunk)",
                [{"direct": chunk_direct, "through the gateway": chunk_via, "overhead": chunk_via - chunk_direct}],
            )
            sever = disconnect_to_sever(upstream, gw.url, args.n)
            print_table(
                f"client disconnect → upstream sees FIN, n={len(sever)} (ms)",
                [{"p50": pct(sever, 50), "p99": pct(sever, 99), "max": max(sever)}],
            )
        finally:
            gw.stop()
    if args.mlx:
        chain = mlx_chain(10)
        print_table(
            f"in-process mlx-lm (SmolLM2) behind the gateway: disconnect seen → worker drained, n={len(chain)} (ms)",
            [{"p50": pct(chain, 50), "p99": pct(chain, 99), "max": max(chain) if chain else float("nan")}],
        )


if __name__ == "__main__":
    main()
