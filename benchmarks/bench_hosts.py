"""Several gateway hosts through one Redis (issue #53): what the store costs and how fast a stop
and a death cross hosts.

Real processes: ``redis-server`` (Debian's), gateway processes on 127.0.0.2 and 127.0.0.3, a
fake upstream on a real socket in this process (its disconnect timestamp, on this process's
clock, is the evidence of a stop). The client is sequential: one request at a time, so neither
it nor the upstream is the bottleneck.

* **Per request**: a background response of ``--tokens`` tokens (upstream at full speed),
  created and read to its end on one host — without a store (in memory), and with one — beside
  the floor, the same answer as a foreground stream (no background machinery at all).
* **Stop on another host**: a background response running on A, ``POST …/cancel`` sent to B →
  the upstream's connection closed (the engine stopped), p50/p99 — through pub/sub.
* **Resume across hosts**: read ``k`` events on A, cut, read on from B with ``starting_after``;
  events lost / repeated over all runs.
* **A dead host**: ``kill -9`` of A mid-stream → a reader on B gets the ``owner_lost`` error
  event (default lease, 5 s).

Usage: python benchmarks/bench_hosts.py [-n 200 --tokens 32 --deaths 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _tables import pct, print_table

from abstract_client.testing import FakeOpenAIServer
from tests.test_gateway_hosts import GatewayHost, RedisServer

HEADERS = {"Authorization": "Bearer key-a"}


def config(path: Path, upstream: FakeOpenAIServer, store: str | None, lease: float) -> Path:
    server = f'store = "{store}"\nhost_lease = {lease}\n' if store else ""
    path.write_text(
        f"""[server]
{server}api_keys = ["key-a"]

[[backend]]
name = "fake-model"
provider = "vllm"
base_url = "{upstream.base_url}"
max_concurrent = 64
"""
    )
    return path


def events(
    client: httpx.Client, url: str, response_id: str, after: int | None = None, k: int | None = None
) -> list[Any]:
    query = "?stream=true" + ("" if after is None else f"&starting_after={after}")
    out: list[Any] = []
    with client.stream("GET", f"{url}/v1/responses/{response_id}{query}", headers=HEADERS) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if k is not None and len(out) >= k:
                    break
    return out


def background(client: httpx.Client, url: str, tokens: int) -> str:
    body = {"model": "fake-model", "input": "hi", "background": True, "max_output_tokens": tokens}
    answer = client.post(url + "/v1/responses", json=body, headers=HEADERS)
    answer.raise_for_status()
    return str(answer.json()["id"])


def per_request(client: httpx.Client, url: str, n: int, tokens: int) -> dict[str, list[float]]:
    floor, whole = [], []
    body = {"model": "fake-model", "input": "hi", "stream": True, "max_output_tokens": tokens}
    for i in range(n + 5):
        t0 = time.perf_counter()
        with client.stream("POST", url + "/v1/responses", json=body, headers=HEADERS) as answer:
            for _ in answer.iter_lines():
                pass
        t1 = time.perf_counter()
        response_id = background(client, url, tokens)
        got = events(client, url, response_id)
        t2 = time.perf_counter()
        assert got[-1]["type"] in ("response.completed", "response.incomplete"), got[-1]
        if i >= 5:  # warm-up
            floor.append((t1 - t0) * 1000)
            whole.append((t2 - t1) * 1000)
    return {"floor": floor, "background": whole}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--deaths", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-hosts-"))
    rows: list[dict[str, Any]] = []
    with (
        FakeOpenAIServer(token_delay=0.0, default_max_tokens=args.tokens) as upstream,
        httpx.Client(timeout=60) as client,
    ):
        redis = RedisServer(work)
        try:
            # -- per request, without and with a store ------------------------------------------
            for label, store in (("in memory (no store)", None), ("store (Redis)", redis.url)):
                host = GatewayHost.on("127.0.0.2", config(work / "one.toml", upstream, store, 5), work / "one.log")
                try:
                    got = per_request(client, host.url, args.n, args.tokens)
                finally:
                    host.stop()
                for what, values in (
                    ("floor: foreground stream", got["floor"]),
                    (f"background, {label}", got["background"]),
                ):
                    rows.append({"case": what, "n": len(values), "p50 ms": pct(values, 50), "p99 ms": pct(values, 99)})
            print_table(f"Per request: a {args.tokens}-token response, created and read to its end on one host", rows)

            # -- two hosts: stop across, resume across ---------------------------------------------
            upstream.behavior.token_delay = 0.01
            conf = config(work / "two.toml", upstream, redis.url, 5)
            a = GatewayHost.on("127.0.0.2", conf, work / "a.log")
            b = GatewayHost.on("127.0.0.3", conf, work / "b.log")
            try:
                stops = []
                for _ in range(max(20, args.n // 4)):
                    before = len(upstream.requests("/v1/chat/completions"))
                    response_id = background(client, a.url, 100_000)
                    record = upstream.wait_for_request(before + 1, timeout=15, path="/v1/chat/completions")
                    while record.tokens_sent < 3:
                        time.sleep(0.002)
                    t0 = time.perf_counter()
                    client.post(f"{b.url}/v1/responses/{response_id}/cancel", headers=HEADERS)
                    stops.append((upstream.wait_for_disconnect(record, timeout=10) - t0) * 1000)
                print_table(
                    "Stop on another host: POST /v1/responses/{id}/cancel on B → the upstream closed by A",
                    [{"n": len(stops), "p50 ms": pct(stops, 50), "p99 ms": pct(stops, 99), "max ms": max(stops)}],
                )
                lost = repeated = total = 0
                upstream.behavior.token_delay = 0.002
                for i in range(max(10, args.n // 10)):
                    response_id = background(client, a.url, 60)
                    first = events(client, a.url, response_id, k=5 + i % 20)
                    rest = events(client, b.url, response_id, after=first[-1]["sequence_number"])
                    numbers = [e["sequence_number"] for e in first + rest]
                    expected = set(range(numbers[-1] + 1))
                    lost += len(expected - set(numbers))
                    repeated += len(numbers) - len(set(numbers))
                    total += len(numbers)
                print_table(
                    "Resume across hosts: read on A, cut, read on from B (starting_after)",
                    [{"runs": max(10, args.n // 10), "events": total, "lost": lost, "repeated": repeated}],
                )
            finally:
                a.stop()
                b.stop()

            # -- a dead host --------------------------------------------------------------------------
            upstream.behavior.token_delay = 0.01
            deaths = []
            for i in range(args.deaths):
                a = GatewayHost.on("127.0.0.2", conf, work / f"a{i}.log")
                b = GatewayHost.on("127.0.0.3", conf, work / f"b{i}.log")
                try:
                    response_id = background(client, a.url, 100_000)
                    first = events(client, b.url, response_id, k=10)
                    a.kill()
                    t0 = time.perf_counter()
                    rest = events(client, b.url, response_id, after=first[-1]["sequence_number"])
                    assert rest[-1].get("code") == "owner_lost", rest[-1]
                    deaths.append(time.perf_counter() - t0)
                finally:
                    a.stop()
                    b.stop()
            print_table(
                "A dead host (kill -9): → a reader on another host gets owner_lost (lease 5 s, sweep every 1 s)",
                [{"n": len(deaths), "p50 s": pct(deaths, 50), "max s": max(deaths)}],
            )
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
