"""The load benchmark's clients, in their own process (so the thing measured does not share a
loop with them): ``streams`` concurrent SSE streams over raw asyncio sockets; a share of them
leave at a random moment (close the socket, the way a closed browser tab does) and record
``time.monotonic()`` when they did. Prints one JSON object.

    python benchmarks/_load_clients.py URL STREAMS RATE CHUNKS LEAVERS SEED
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from urllib.parse import urlsplit


async def one(
    host: str, port: int, path: str, tag: str, rate: int, n: int, leave_after: float | None
) -> dict[str, object]:
    body = json.dumps(
        {
            "model": "fake-model",
            "messages": [{"role": "user", "content": f"tag={tag} rate={rate} n={n}"}],
            "max_tokens": n,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nX-Request-Id: {tag}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head + body)
    chunks, tail, first_at, closed_at = 0, b"", None, None
    t0 = time.monotonic()
    try:
        while True:
            if leave_after is not None and first_at is not None:
                left = first_at + leave_after - time.monotonic()
                if left <= 0:
                    break
                try:
                    data = await asyncio.wait_for(reader.read(65536), left)
                except TimeoutError:
                    break
            else:
                data = await reader.read(65536)
            if not data:
                break
            seen = tail + data
            chunks += seen.count(b"data: {")  # frames split across reads are counted once
            tail = seen[-7:]
            chunks -= tail.count(b"data: {")
            if first_at is None and chunks:
                first_at = time.monotonic()
            if b"[DONE]" in seen or b'"error"' in seen:  # the end (the connection stays open)
                break
    finally:
        closed_at = time.monotonic()
        writer.close()
    chunks += tail.count(b"data: {")
    return {
        "tag": tag,
        "chunks": chunks,
        "leaver": leave_after is not None,
        "closed_at": closed_at,
        "started": t0,
        "first_at": first_at,
    }


async def main(url: str, streams: int, rate: int, n: int, leavers: int, seed: int) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path.rstrip("/") + "/chat/completions"
    rng = random.Random(seed)
    leaving = set(rng.sample(range(streams), leavers))
    duration = n / rate if rate else 1.0
    tasks = []
    t0 = time.monotonic()
    for i in range(streams):
        leave = rng.uniform(0.2, 0.7 * duration) if i in leaving else None
        tasks.append(asyncio.create_task(one(host, port, path, f"s{seed}-{i}", rate, n, leave)))
        if i % 20 == 19:
            await asyncio.sleep(0.02)  # a ramp, not a connect storm
    results = await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.monotonic() - t0
    ok = [r for r in results if isinstance(r, dict)]
    errors = [repr(r) for r in results if not isinstance(r, dict)]
    print(json.dumps({"wall": wall, "results": ok, "errors": errors[:5], "n_errors": len(errors)}))


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5])))
