"""Stop figures over real networks (issue #39): plain loopback, TLS (nginx in front), an http
proxy (tinyproxy, forwarding) and an https ``CONNECT`` tunnel through it; streaming calls.

Per route, ``n`` stops pressed from another thread once the server has written 3 tokens: stop →
raise (the caller released) and stop → the server saw the disconnect (the fake server's own
timestamp, behind nginx and tinyproxy where they are on the way), p50/p99 in ms. Beside it,
plain httpx on the same route with ``task.cancel()`` (its way to stop a stream) — the floor a
user of httpx gets.

Usage: python benchmarks/bench_network.py [-n 20]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _tables import pct, print_table

from abstract_client import AbortController, GenerationCancelledError, create_llm
from abstract_client.testing import FakeOpenAIServer
from tests.network_servers import Certificates, Nginx, Tinyproxy

BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 3000}


def ours(url: str, options: dict[str, Any], server: FakeOpenAIServer, n: int) -> tuple[list[float], list[float]]:
    raised, seen = [], []
    with create_llm("openai-compatible", "fake-model", base_url=url, **options) as llm:
        for _ in range(n):
            before = len(server.requests("/v1/chat/completions"))
            controller = AbortController()
            out: dict[str, float] = {}

            def run(signal: Any = controller.signal, out: dict[str, float] = out) -> None:
                try:
                    for _ in llm.stream("hi", max_tokens=3000, signal=signal):
                        pass
                except GenerationCancelledError:
                    out["raised"] = time.perf_counter()

            thread = threading.Thread(target=run)
            thread.start()
            record = server.wait_for_request(before + 1, timeout=30, path="/v1/chat/completions")
            while record.tokens_sent < 3:
                time.sleep(0.001)
            pressed = time.perf_counter()
            controller.abort()
            thread.join()
            raised.append((out["raised"] - pressed) * 1000)
            seen.append((server.wait_for_disconnect(record, timeout=10) - pressed) * 1000)
    return raised, seen


def plain_httpx(url: str, options: dict[str, Any], server: FakeOpenAIServer, n: int) -> tuple[list[float], list[float]]:
    raised, seen = [], []

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30, **options) as client:
            for _ in range(n):
                before = len(server.requests("/v1/chat/completions"))

                async def run() -> None:
                    async with client.stream("POST", url + "/chat/completions", json=BODY) as response:
                        async for _ in response.aiter_raw():
                            pass

                task = asyncio.create_task(run())
                while len(server.requests("/v1/chat/completions")) <= before:
                    await asyncio.sleep(0.001)
                record = server.requests("/v1/chat/completions")[before]
                while record.tokens_sent < 3:
                    await asyncio.sleep(0.001)
                pressed = time.perf_counter()
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    raised.append((time.perf_counter() - pressed) * 1000)
                seen.append((server.wait_for_disconnect(record, timeout=10) - pressed) * 1000)

    asyncio.run(main())
    return raised, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-network-"))
    certs = Certificates.make(work / "certs")
    rows = []
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=4000) as server:
        proxy = Tinyproxy(work)
        front = Nginx(work, certs, server.port)
        ca = str(certs.ca_pem)
        routes: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
            ("plain", server.url + "/v1", {}, {}),
            ("TLS (nginx)", front.url + "/v1", {"verify": ca}, {"verify": ca}),
            ("http proxy (tinyproxy)", server.url + "/v1", {"proxy": proxy.url()}, {"proxy": proxy.url()}),
            (
                "CONNECT tunnel + TLS",
                front.url + "/v1",
                {"proxy": proxy.url(), "verify": ca},
                {"proxy": proxy.url(), "verify": ca},
            ),
        ]
        try:
            for name, url, options, httpx_options in routes:
                for who, fn, opts in (
                    ("abstract-client", ours, options),
                    ("httpx task.cancel", plain_httpx, httpx_options),
                ):
                    raised, seen = fn(url, opts, server, args.n)
                    rows.append(
                        {
                            "route": name,
                            "client": who,
                            "n": args.n,
                            "stop→raise p50/p99 ms": f"{pct(raised, 50):.2f} / {pct(raised, 99):.2f}",
                            "stop→server EOF p50/p99 ms": f"{pct(seen, 50):.2f} / {pct(seen, 99):.2f}",
                        }
                    )
        finally:
            front.stop()
            proxy.stop()
    print_table("Stop through the network (streaming; ms)", rows)


if __name__ == "__main__":
    main()
