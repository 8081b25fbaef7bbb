"""The gateway's cost and its stop chain, on each of its generation routes (chat completions,
Anthropic's Messages, the Responses API) side by side.

1. Overhead per request (a 1-token non-streaming answer) and per chunk (a 2,000-chunk stream
   with no token delay) through ``abstract-client serve`` vs calling the same fake upstream
   directly (vLLM wire, a real loopback socket): the floor is the upstream's own chat route.
2. Client disconnect → upstream severed: the client closes its stream; the fake upstream (in
   this process, same clock) timestamps the FIN it sees.
3. With ``--mlx``: the chain in front of in-process mlx-lm (SmolLM2): the gateway's own figure
   from the disconnect it saw to the MLX worker drained.
4. With ``--llama``: stop → engine stopped on a real llama-server, per route, stream and not,
   through the gateway and straight to llama-server's own route (the floor): the client closes
   its socket once the slot is decoding; the time until ``/slots`` says idle (polled every ms).

Usage: python benchmarks/bench_gateway.py [-n 50] [--mlx] [--llama]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
from _tables import pct, print_table

from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
# route → (path, request body for n tokens, the marker that starts one token's frame)
ROUTES: dict[str, tuple[str, Any, str]] = {
    "chat": (CHAT, lambda n: {"model": "fake-model", "messages": HELLO, "max_tokens": n}, "data: {"),
    "messages": (
        "/v1/messages",
        lambda n: {"model": "fake-model", "messages": HELLO, "max_tokens": n},
        "event: content_block_delta",
    ),
    "responses": (
        "/v1/responses",
        lambda n: {"model": "fake-model", "input": "hi", "max_output_tokens": n},
        "event: response.output_text.delta",
    ),
}


def per_request(http: httpx.Client, url: str, n: int, route: str = "chat") -> list[float]:
    path, body, _ = ROUTES[route]
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = http.post(url + path, json=body(1))
        r.raise_for_status()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def per_chunk(http: httpx.Client, url: str, chunks: int, route: str = "chat") -> float:
    path, body, marker = ROUTES[route]
    t0 = time.perf_counter()
    n = 0
    with http.stream("POST", url + path, json=body(chunks) | {"stream": True}) as r:
        for line in r.iter_lines():
            n += line.startswith(marker)
    return (time.perf_counter() - t0) * 1e6 / max(n, 1)


def disconnect_to_sever(upstream: FakeOpenAIServer, gateway_url: str, n: int, route: str = "chat") -> list[float]:
    """A raw socket client: send the request, read a few chunks, close; the upstream's FIN time
    minus the close time."""
    host, port = gateway_url.removeprefix("http://").split(":")
    out = []
    path, make, marker = ROUTES[route]
    body = json.dumps(make(100_000) | {"stream": True}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    for _ in range(n):
        before = len(upstream.requests(CHAT))
        sock = socket.create_connection((host, int(port)))
        sock.sendall(head + body)
        got = b""
        while got.count(marker.encode()) < 3:
            part = sock.recv(65536)
            if not part:  # (an unchecked recv spun here on a closed connection)
                raise RuntimeError(f"the gateway closed the connection after {len(got)} bytes: {got[-3000:]!r}")
            got += part
        record = upstream.wait_for_request(before + 1, path=CHAT)
        record = upstream.requests(CHAT)[before]
        t_close = time.perf_counter()
        sock.close()
        t_fin = upstream.wait_for_disconnect(record, timeout=10)
        out.append((t_fin - t_close) * 1000)
    return out


def mlx_chain(n: int, route: str = "chat") -> list[float]:
    from abstract_client.app.assets import smollm2_mlx
    from abstract_client.gateway import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    config = GatewayConfig(backends=[BackendConfig(name="smollm2", provider="mlx", model=str(smollm2_mlx()))])
    path, make, marker = ROUTES[route]
    body = make(2000) | {"model": "smollm2", "stream": True}
    if route == "chat":
        body["logit_bias"] = {"2": -1e9}  # no end of text (the other wires have no such field: a long prompt instead)
    else:
        body |= (
            {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}
            if route == "messages"
            else {"input": "Write a very long story about a dragon."}
        )
    with InProcessGateway(config) as gw:
        metrics = gw.gateway.metrics
        for _ in range(n):
            with httpx.stream("POST", gw.url + path, json=body, timeout=120) as r:
                seen = 0
                for line in r.iter_lines():
                    seen += line.startswith(marker)
                    if seen == 3:
                        break
            gw.gateway.backends["smollm2"].llm.provider.thread.wait_idle(30)
        deadline = time.monotonic() + 10
        while metrics._count < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return [float(x) for x in metrics.chain_ms]


def close_to_idle(server: Any, url: str, path: str, body: dict[str, Any], n: int) -> list[float]:
    """Open a raw connection, send the request, wait until llama-server decodes it, close; the
    time until its slot is idle again."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    out = []
    for _ in range(n):
        assert server.wait_idle(30)
        sock = socket.create_connection((host, int(port)))
        sock.sendall(head.encode() + data)
        deadline = time.monotonic() + 60
        while (server.processing_decoded() or 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        t0 = time.perf_counter()
        sock.close()
        while not server.wait_idle(0.0005):
            if time.perf_counter() - t0 > 10:  # the server did not stop: it decodes to max_tokens
                out.append(float("nan"))
                assert server.wait_idle(600)
                return out
        out.append((time.perf_counter() - t0) * 1000)
    return out


def llama_stops(n: int) -> None:
    from abstract_client.gateway import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway
    from abstract_client.testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        raise SystemExit("llama-server or the model is missing: run scripts/get_llama_server.sh, scripts/get_model.py")
    tmp = Path(tempfile.mkdtemp())
    server = LlamaServer.launch(binary, model, log_path=tmp / "llama.log", threads=1)
    story = [{"role": "user", "content": "Write a very long story about a dragon."}]
    long = {"model": "smollm2", "messages": story, "max_tokens": 1000}
    bodies = {
        "chat": (CHAT, long),
        "messages": ("/v1/messages", long),
        "responses": (
            "/v1/responses",
            {"model": "smollm2", "input": "hi", "max_output_tokens": 4000, "ignore_eos": True},
        ),
    }
    rows = []
    try:
        config = GatewayConfig(backends=[BackendConfig(name="smollm2", provider="llamacpp", base_url=server.url)])
        with InProcessGateway(config) as gw:
            for route, (path, body) in bodies.items():
                for stream in (True, False):
                    row: dict[str, Any] = {"route": route, "stream": stream}
                    for where, url in (("direct", server.url), ("gateway", gw.url)):
                        if where == "direct" and route == "responses":
                            row["direct p50"] = row["direct p99"] = float("nan")  # llama-server has none
                            continue
                        times = close_to_idle(server, url, path, body | {"stream": stream}, n)
                        row[f"{where} p50"], row[f"{where} p99"] = pct(times, 50), pct(times, 99)
                    rows.append(row)
    finally:
        server.stop()
    print_table(
        f"client closes → llama-server's slot idle (SmolLM2, 1 thread), n={n} each (ms; nan: the server did not stop "
        "within 10 s and decoded to max_tokens)",
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=50)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--mlx", action="store_true", help="also the chain in front of in-process mlx-lm")
    parser.add_argument("--llama", action="store_true", help="only: stop → llama-server idle per route")
    args = parser.parse_args()
    if args.llama:
        llama_stops(min(args.n, 30))
        return
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
            request_rows, chunk_rows, sever_rows = [], [], []
            with httpx.Client(timeout=60) as http:
                per_request(http, upstream.url, 20)
                direct = per_request(http, upstream.url, args.n)
                chunk_direct = min(per_chunk(http, upstream.url, args.chunks) for _ in range(3))
                request_rows.append(
                    {"path": "floor: direct to the upstream (chat)", "p50": pct(direct, 50), "p99": pct(direct, 99)}
                )
                chunk_rows.append(
                    {"path": "floor: direct to the upstream (chat)", "µs per chunk": chunk_direct, "overhead": 0.0}
                )
                for route in ROUTES:
                    per_request(http, gw.url, 20, route)
                    via = per_request(http, gw.url, args.n, route)
                    request_rows.append(
                        {
                            "path": f"through the gateway: {route}",
                            "p50": pct(via, 50),
                            "p99": pct(via, 99),
                            "overhead p50": pct(via, 50) - pct(direct, 50),
                        }
                    )
                    chunk_via = min(per_chunk(http, gw.url, args.chunks, route) for _ in range(3))
                    chunk_rows.append(
                        {
                            "path": f"through the gateway: {route}",
                            "µs per chunk": chunk_via,
                            "overhead": chunk_via - chunk_direct,
                        }
                    )
                    sever = disconnect_to_sever(upstream, gw.url, args.n, route)
                    sever_rows.append({"route": route, "p50": pct(sever, 50), "p99": pct(sever, 99), "max": max(sever)})
            print_table(f"per request: 1-token non-streaming answer, n={args.n} (ms)", request_rows)
            print_table(f"per chunk: {args.chunks}-chunk stream, best of 3", chunk_rows)
            print_table(f"client disconnect → upstream sees FIN, n={args.n} per route (ms)", sever_rows)
        finally:
            gw.stop()
    if args.mlx:
        rows = []
        for route in ROUTES:
            chain = mlx_chain(10, route)
            rows.append(
                {
                    "route": route,
                    "n": len(chain),
                    "p50": pct(chain, 50),
                    "p99": pct(chain, 99),
                    "max": max(chain) if chain else float("nan"),
                }
            )
        print_table("in-process mlx-lm (SmolLM2) behind the gateway: disconnect seen → worker drained (ms)", rows)


if __name__ == "__main__":
    main()
