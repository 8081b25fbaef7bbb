"""The several-hosts store under the faults an operator meets (#58; docs/resumable.md "Faults").

A real ``redis-server`` on loopback and this process's hosts (``gateway/hosts/store.py``, the default
lease of 5 s unless said):

* a large running set: how long one sweep of N entries takes (batched ``SSCAN`` + pipelines)
  and the longest gap between two renewals of a live host's lease meanwhile (the floor: the
  renewal period, a fifth of a lease);
* a connection the network drops silently (a relay that stops relaying): how long until the
  listener has resubscribed on a new connection;
* a malformed record in the running set: the lease's longest gap over two leases.

    python benchmarks/bench_store_faults.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _tables import print_table

from abstract_client.gateway.config import BackendConfig, GatewayConfig
from abstract_client.gateway.hosts.store import Hosts
from tests.network_servers import BlackholingProxy
from tests.test_gateway_hosts import RedisServer, fill_running

LEASE = 5.0


def hosts(url: str) -> Hosts:
    backend = BackendConfig(name="m", provider="vllm", base_url="http://127.0.0.1:1")
    return Hosts(GatewayConfig(backends=[backend], store=url, host_lease=LEASE))


async def renewal_gaps(host: Hosts, seconds: float) -> float:
    """The longest time the host's lease key went without a renewal (its TTL's drop), in s."""
    worst, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        ttl = await host.redis.pttl(f"ac:host:{host.id}")
        worst = max(worst, (host.lease_ms - max(ttl, 0)) / 1000)
        await asyncio.sleep(0.05)
    return worst


async def sweep_rows(url: str) -> list[dict[str, Any]]:
    rows = []
    for n in (1_000, 20_000):
        owner, live = hosts(url), hosts(url)
        await owner.redis.flushdb()
        await owner.start()
        await live.start()
        await fill_running(owner.redis, n, live.id)
        began = time.perf_counter()
        await owner.sweep()
        took = time.perf_counter() - began
        gap = await renewal_gaps(owner, 2 * LEASE)
        rows.append(
            {
                "fault": f"{n:,} running entries",
                "figure": f"one sweep {took * 1000:.0f} ms; lease's longest gap {gap:.2f} s",
                "floor": f"renewal period {LEASE / 5:.1f} s",
            }
        )
        await owner.aclose()
        await live.aclose()
    return rows


async def deaf_row(redis: RedisServer) -> dict[str, Any]:
    proxy = BlackholingProxy(redis.port)
    host = hosts(proxy.url())
    await host.start()
    try:
        while not host.subscribed.is_set():
            await asyncio.sleep(0.01)
        proxy.blackhole()
        began = time.monotonic()
        while host.subscribed.is_set():  # noticed
            await asyncio.sleep(0.01)
        noticed = time.monotonic() - began
        while not host.subscribed.is_set():  # resubscribed on a new connection
            await asyncio.sleep(0.01)
        back = time.monotonic() - began
    finally:
        await host.aclose()
        proxy.close()
    return {
        "fault": "the listener's connection dropped silently",
        "figure": f"noticed after {noticed:.2f} s, resubscribed after {back:.2f} s",
        "floor": f"3 periods unheard: {3 * LEASE / 5:.1f} s",
    }


async def malformed_row(url: str) -> dict[str, Any]:
    host = hosts(url)
    await host.start()
    try:
        await host.redis.hset("ac:resp:bad", mapping={"status": "in_progress"})
        await host.redis.sadd("ac:running", "bad")
        gap = await renewal_gaps(host, 2 * LEASE)
    finally:
        await host.aclose()
    return {
        "fault": "a record without its host in the running set",
        "figure": f"logged once, skipped; lease's longest gap {gap:.2f} s",
        "floor": f"renewal period {LEASE / 5:.1f} s",
    }


async def main() -> None:
    redis = RedisServer(Path(tempfile.mkdtemp()))
    try:
        rows = await sweep_rows(redis.url)
        rows.append(await deaf_row(redis))
        rows.append(await malformed_row(redis.url))
    finally:
        redis.stop()
    print_table(f"the store's faults (lease {LEASE:g} s, real redis-server)", rows)


if __name__ == "__main__":
    asyncio.run(main())
