"""The gateway under load, beside its floor and LiteLLM's proxy, in one run.

Four ways to reach one upstream (``_load_upstream.py``, its own process: 300 streams cost it a
fraction of a core): **direct**; a **bare pass-through** (``_relay.py``: bytes only, the floor
of any relay); **ours** (``abstract-client serve``); **LiteLLM**'s proxy (when its venv exists:
``--litellm-venv``, default ``~/.cache/abstract-client/bench-litellm``; it is never a project
dependency). For each:

* per request: a 1-token non-streaming answer, sequential (p50 ms, and minus direct);
* per chunk: one 20,000-chunk stream written at once by the upstream (µs per chunk, minus direct);
* under load: ``--streams`` concurrent streams offered ``--rate`` chunks/s each, ``--leavers`` of
  them closing at a random moment. The clients run in their own process (``_load_clients.py``).
  Relayed chunks/s; for each leaver, client close → upstream saw the connection end (both on
  CLOCK_MONOTONIC), p50/p99/max; and how many leavers' upstreams streamed to the end anyway.
* idle: the same, one leaver at a time.

Usage: python benchmarks/bench_gateway_load.py [--streams 300 --rate 100 --chunks 500]
       [--only direct,relay,ours,litellm] [--workers 1,2] [--gateway-arg=... ]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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

from abstract_client.testing.gateway import GatewayProcess
from abstract_client.testing.processes import free_port

HERE = Path(__file__).resolve().parent
LITELLM_VENV = Path.home() / ".cache" / "abstract-client" / "bench-litellm"


def spawn_printing_url(argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def wait_ready(url: str, timeout: float = 120, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/models", timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready after {timeout}s")
        time.sleep(0.2)


def ask(tag: str, rate: int, n: int, *, stream: bool) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": f"tag={tag} rate={rate} n={n}"}],
        "max_tokens": n,
        "stream": stream,
    }


def per_request(url: str, n: int, headers: dict[str, str] | None = None) -> list[float]:
    out = []
    with httpx.Client(timeout=60, headers=headers) as http:
        for i in range(n + 20):
            t0 = time.perf_counter()
            http.post(url + "/chat/completions", json=ask(f"r{i}", 0, 1, stream=False)).raise_for_status()
            if i >= 20:  # warm-up first
                out.append((time.perf_counter() - t0) * 1000)
    return out


def per_chunk(url: str, n: int) -> float:
    best = float("inf")
    with httpx.Client(timeout=120) as http:
        for i in range(3):
            t0 = time.perf_counter()
            got, tail = 0, b""
            with http.stream("POST", url + "/chat/completions", json=ask(f"c{i}", 0, n, stream=True)) as r:
                for part in r.iter_raw():
                    seen = tail + part
                    got += seen.count(b"data: {")
                    tail = seen[-7:]
                    got -= tail.count(b"data: {")
            got += tail.count(b"data: {")
            best = min(best, (time.perf_counter() - t0) * 1e6 / max(got, 1))
    return best


def load(url: str, upstream: str, streams: int, rate: int, chunks: int, leavers: int, seed: int) -> dict[str, Any]:
    httpx.post(upstream + "/reset")
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "_load_clients.py"),
            url,
            str(streams),
            str(rate),
            str(chunks),
            str(leavers),
            str(seed),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    clients = json.loads(out.stdout)
    time.sleep(1.0)  # let every upstream stream end or see its close
    records = {r["tag"]: r for r in httpx.get(upstream + "/stats").json()}
    sever, never = [], 0
    for c in clients["results"]:
        if not c["leaver"]:
            continue
        up = records.get(c["tag"])
        if up is None:
            continue
        if up["finished"] or up["closed_at"] is None:
            never += 1
        else:
            sever.append((up["closed_at"] - c["closed_at"]) * 1000)
    results = clients["results"]
    total = sum(c["chunks"] for c in results)
    t_first = min(c["started"] for c in results)
    t_last = max(c["closed_at"] for c in results)
    stayers = [c for c in results if not c["leaver"]]
    complete = sum(c["chunks"] >= chunks for c in stayers)
    return {
        "chunks/s": total / (t_last - t_first),
        "sever": sever,
        "never": never,
        "errors": clients["n_errors"],
        "complete": f"{complete}/{len(stayers)}",
        "wall": t_last - t_first,
    }


def idle(url: str, upstream: str, n: int) -> list[float]:
    out: list[float] = []
    for i in range(n):
        out += load(url, upstream, 1, 100, 200, 1, 1000 + i)["sever"]
    return out


def launch_litellm(upstream: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str] | None:
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        return None
    cfg = tmp / "litellm.yaml"
    cfg.write_text(
        "model_list:\n  - model_name: fake-model\n    litellm_params:\n"
        f"      model: openai/fake-model\n      api_base: {upstream}\n      api_key: x\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_LOG": "ERROR",
        "LITELLM_MODE": "PRODUCTION",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",  # a loopback benchmark, no auth
    }
    log = open(tmp / "litellm.log", "wb")  # lives as long as the process
    proc = subprocess.Popen([str(exe), "--config", str(cfg), "--port", str(port)], stdout=log, stderr=log, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    wait_ready(url, proc=proc)
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--rate", type=int, default=100, help="chunks/s offered per stream")
    parser.add_argument("--chunks", type=int, default=500, help="chunks per stream")
    parser.add_argument("--leavers", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--idle", type=int, default=20)
    parser.add_argument("--only", default="direct,relay,ours,litellm")
    parser.add_argument("--workers", default="1,2", help="our gateway once per worker count")
    parser.add_argument("--gateway-arg", action="append", default=[])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    only = args.only.split(",")
    procs: list[Any] = []
    rows, loads = [], []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        up_proc, upstream = spawn_printing_url([sys.executable, str(HERE / "_load_upstream.py")])
        procs.append(up_proc)
        stats_url = upstream.removesuffix("/v1")
        targets: list[tuple[str, str]] = []
        try:
            wait_ready(upstream)
            if "direct" in only:
                targets.append(("direct", upstream))
            if "relay" in only:
                relay_proc, relay = spawn_printing_url([sys.executable, str(HERE / "_relay.py"), upstream])
                procs.append(relay_proc)
                targets.append(("bare pass-through", relay))
            for workers in args.workers.split(",") if "ours" in only else []:
                gw = GatewayProcess.launch(
                    [
                        *("-p", "vllm", "-u", upstream, "-m", "fake-model", "--log-level", "warning"),
                        *("--max-concurrent", str(args.streams + 10), "--workers", workers, *args.gateway_arg),
                    ],
                    log_path=tmp / f"gw-{workers}.log",
                )
                procs.append(gw)
                targets.append((f"abstract-client serve x{workers}", gw.url + "/v1"))
            if "litellm" in only:
                launched = launch_litellm(upstream, tmp)
                if launched is None:
                    print(f"LiteLLM: no venv at {LITELLM_VENV} (python -m venv it; pip install 'litellm[proxy]')")
                else:
                    procs.append(launched[0])
                    targets.append(("LiteLLM proxy", launched[1]))
            base_req = base_chunk = None
            for name, url in targets:
                req = per_request(url, args.requests)
                chunk = per_chunk(url, 20000)
                if name == "direct":
                    base_req, base_chunk = pct(req, 50), chunk
                quiet = idle(url, stats_url, args.idle)
                run = load(url, stats_url, args.streams, args.rate, args.chunks, args.leavers, args.seed)
                full = load(url, stats_url, args.streams, args.rate, args.chunks, 0, args.seed + 1)
                rows.append(
                    {
                        "path": name,
                        "request p50 ms": pct(req, 50),
                        "+ms": pct(req, 50) - base_req if base_req is not None else float("nan"),
                        "µs/chunk": chunk,
                        "+µs": chunk - base_chunk if base_chunk is not None else float("nan"),
                        "idle sever p99": pct(quiet, 99),
                    }
                )
                sever = run["sever"]
                loads.append(
                    {
                        "path": name,
                        "relayed/s (none leave)": round(full["chunks/s"]),
                        "sever p50": pct(sever, 50),
                        "p99": pct(sever, 99),
                        "max": max(sever) if sever else float("nan"),
                        "never stopped": f"{run['never']}/{args.leavers}",
                        "stayers complete": run["complete"],
                        "errors": run["errors"] + full["errors"],
                    }
                )
                print(f"... {name}: done", file=sys.stderr, flush=True)
        finally:
            for p in procs:
                if isinstance(p, GatewayProcess):
                    p.stop()
                else:
                    p.terminate()
                    p.wait(10)
    print_table("overhead (sequential; per chunk: a 20,000-chunk stream written at once) and idle stop (ms)", rows, 2)
    print_table(
        f"load: {args.streams} streams x {args.rate} chunks/s offered ({args.streams * args.rate} chunks/s), "
        f"{args.leavers} leave at random; client close → upstream sees the end (ms)",
        loads,
        1,
    )


if __name__ == "__main__":
    main()
