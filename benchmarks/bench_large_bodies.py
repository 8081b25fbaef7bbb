"""How long a large request body holds the gateway's event loop (#58, item 8).

A real ``abstract-client serve`` process in front of a fake upstream in a process of its own; the
bodies are sent three times each from a third process, while this one asks ``/health`` every
5 ms. The figure is ``/health``'s latency meanwhile; the floor is the same probe with nothing
sent. Bodies: one 30 MB string (a document, an image's data URL), 1,000 messages of 30 kB, 5 M
numbers in a field nobody reads, 30,000 tools (refused: too many values); each both refused after
the parse (``max_tokens: -1``) and, where the route takes it, forwarded upstream.

    python benchmarks/bench_large_bodies.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _tables import pct, print_table

from abstract_client.testing.gateway import GatewayProcess
from abstract_client.testing.processes import free_port
from abstract_client.testing.subprocess_fake import SubprocessFake

SENDER = textwrap.dedent(
    """
    import json, sys, httpx
    kind, forward, url = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    hi = [{"role": "user", "content": "hi"}]
    if kind == "30 MB string":
        body = {"messages": [{"role": "user", "content": "x" * 30_000_000}]}
    elif kind == "1,000 x 30 kB messages":
        body = {"messages": [{"role": "user", "content": "y" * 30_000} for _ in range(1000)]}
    elif kind == "5 M numbers":
        body = {"messages": hi, "extra": [1.5] * 5_000_000}
    else:
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            f"p{i}": {"type": "string", "description": "abc"} for i in range(20)}}}}
        body = {"messages": hi, "tools": [tool] * 30_000}
    raw = json.dumps({"model": "m", "max_tokens": 2 if forward else -1, **body}).encode()
    with httpx.Client(timeout=300) as client:
        for _ in range(3):
            headers = {"content-type": "application/json"}
            answer = client.post(url + "/v1/chat/completions", content=raw, headers=headers)
    print(len(raw), answer.status_code)
    """
)


def probe(url: str, sender: subprocess.Popen[str] | None, seconds: float = 3.0) -> list[float]:
    """``/health`` latencies (ms), every 5 ms, while ``sender`` runs (or for ``seconds``)."""
    out: list[float] = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=60) as client:
        while (sender.poll() is None) if sender is not None else time.monotonic() < end:
            began = time.perf_counter()
            client.get(url + "/health")
            out.append((time.perf_counter() - began) * 1000)
            time.sleep(0.005)
    return out


def row(what: str, size: str, status: str, latencies: list[float]) -> dict[str, Any]:
    return {
        "body": what,
        "size": size,
        "answer": status,
        "/health p50 ms": f"{pct(latencies, 50):.1f}",
        "/health p99 ms": f"{pct(latencies, 99):.1f}",
        "/health max ms": f"{max(latencies):.1f}",
    }


def main() -> None:
    fake = SubprocessFake(token_delay=0.0).start()
    workdir = Path(tempfile.mkdtemp())
    config = workdir / "gateway.toml"
    config.write_text(
        f'[server]\nmax_body_bytes = {64 * 2**20}\n[[backend]]\nname = "m"\nprovider = "openai-compatible"\n'
        f'model = "fake-model"\nbase_url = "{fake.base_url}"\n'
    )
    port = free_port()
    argv = [sys.executable, "-m", "abstract_client", "serve", "--config", str(config), "--port", str(port)]
    gateway = GatewayProcess(argv, port, workdir / "gateway.log")
    gateway.start(60)
    script = workdir / "send.py"
    script.write_text(SENDER)
    rows = []
    try:
        url = f"http://127.0.0.1:{port}"
        rows.append(row("(floor: nothing sent)", "-", "-", probe(url, None)))
        for kind in ("30 MB string", "1,000 x 30 kB messages", "5 M numbers", "30,000 tools"):
            for forward in (False, True):
                if kind == "30,000 tools" and forward:
                    continue
                sender = subprocess.Popen(
                    [sys.executable, str(script), kind, "1" if forward else "0", url], stdout=subprocess.PIPE, text=True
                )
                latencies = probe(url, sender)
                assert sender.stdout is not None
                size, status = sender.stdout.read().split()
                label = f"{kind}, {'forwarded' if forward else 'refused after the parse'}"
                rows.append(row(label, f"{int(size) / 1e6:.0f} MB", status, latencies))
    finally:
        gateway.stop()
        fake.stop()
    print_table("a large body and the gateway's loop (3 sends each; /health every 5 ms)", rows)
    print(json.dumps({"rows": len(rows)}))


if __name__ == "__main__":
    main()
