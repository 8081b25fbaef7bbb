"""Usage per key and fair queuing (#62), measured.

1. **Cost** (``--cost``): the gateway's time per request (a 1-token non-streaming answer,
   sequential) with usage accounting on and off (``--no-usage``), in alternating rounds, beside
   the floor (the upstream called directly). Goal: on - off <= 0.1 ms at p50.
2. **Exact under load** (``--streams``): 300 concurrent streams (``_load_clients.py``, its own
   process) through the gateway, a third of them leaving at a random moment; then every
   request's billed generated tokens (the gateway's usage database) against the upstream's own
   count of what it generated (``_load_upstream.py``: chunks written before it saw the close).
3. **Fair share** (``--fair``): a real llama-server with 4 slots behind the gateway (4 slots, one
   of them kept for another key: ``reserved_slots = 1``). Key A sends 30 long generations at
   once; key B sends short questions one at a time. B's time to first token p50/p99 with fair
   queuing and with first come first served, beside B alone on an idle box (the floor).
4. **A key's limits across processes** (``--shared``, #68): what a key's reservation costs a
   request where its counts live — this process's memory, the SQLite file ``--workers 2``
   share, a real ``redis-server`` — beside a key without limits and the floor; and a key's
   overshoot with ``--workers 2`` and with two hosts on one Redis: 16 parallel requests of
   200 tokens on a 1,000-token budget, 12 parallel answers on ``concurrent = 2`` (the most the
   upstream ran at once, by its own record), 6 parallel 3,000-token prompts on a 1,000 budget.

Usage: python benchmarks/bench_usage.py [--cost] [--streams] [--fair] [--shared] [-n 300]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
from _tables import pct, print_table
from bench_gateway_load import load, per_request, spawn_printing_url, wait_ready

from abstract_client.testing.gateway import GatewayProcess

HERE = Path(__file__).resolve().parent


def gateway(upstream: str, tmp: Path, name: str, *extra: str) -> GatewayProcess:
    args = ["-p", "vllm", "-u", upstream, "-m", "fake-model", "--log-level", "warning", "--max-concurrent", "400"]
    return GatewayProcess.launch([*args, "--data-dir", str(tmp / name), *extra], log_path=tmp / f"{name}.log")


def cost(upstream: str, tmp: Path, n: int, rounds: int) -> None:
    on, off = gateway(upstream, tmp, "on"), gateway(upstream, tmp, "off", "--no-usage")
    try:
        figures: dict[str, list[float]] = {"direct (floor)": [], "accounting off": [], "accounting on": []}
        for _ in range(rounds):  # alternating: a noisy neighbour hits both alike
            figures["direct (floor)"] += per_request(upstream, n)
            figures["accounting off"] += per_request(off.url + "/v1", n)
            figures["accounting on"] += per_request(on.url + "/v1", n)
        rows = [
            {"path": k, "p50 ms": f"{pct(v, 50):.3f}", "p99 ms": f"{pct(v, 99):.3f}", "n": len(v)}
            for k, v in figures.items()
        ]
        print_table(f"per request (1-token answer, sequential, {rounds} alternating rounds)", rows)
        delta = pct(figures["accounting on"], 50) - pct(figures["accounting off"], 50)
        print(f"accounting on - off, p50: {delta:+.3f} ms (goal <= +0.1 ms)\n")
    finally:
        on.stop()
        off.stop()


def streams(upstream: str, tmp: Path, n: int, rate: int, chunks: int) -> None:
    gw = gateway(upstream, tmp, "streams")
    try:
        stats_url = upstream.removesuffix("/v1")
        run = load(gw.url + "/v1", stats_url, n, rate, chunks, n // 3, seed=7)
        time.sleep(2.0)  # the writer's last batch
        engine = {r["tag"]: r["sent"] for r in httpx.get(stats_url + "/stats").json()}
        db = sqlite3.connect(tmp / "streams" / "usage.sqlite3")
        billed = dict(db.execute("SELECT request_id, generated_tokens FROM usage").fetchall())
        outcome = dict(db.execute("SELECT request_id, outcome FROM usage").fetchall())
        gaps = [engine[tag] - billed.get(tag, 0) for tag in engine]
        stopped = [t for t in engine if outcome.get(t) == "stopped"]
        rows = [
            {
                "streams": len(engine),
                "records": len(billed),
                "stopped": len(stopped),
                "billed == engine": sum(g == 0 for g in gaps),
                "billed < engine": sum(g > 0 for g in gaps),
                "billed > engine": sum(g < 0 for g in gaps),
                "max gap (tokens)": max(gaps, default=0),
                "engine tokens": sum(engine.values()),
                "billed tokens": sum(billed.get(t, 0) for t in engine),
                "relayed/s": round(run["chunks/s"]),
            }
        ]
        print_table(f"{n} streams, {n // 3} leaving at random: billed vs the upstream's own count", rows)
    finally:
        gw.stop()


def fair(tmp: Path, longs: int, long_tokens: int, questions: int) -> None:
    from abstract_client.testing.processes import LlamaServer, llama_server_binary, smollm2_gguf

    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        print("--fair: llama-server or the SmolLM2 GGUF is missing (scripts/get_llama_server.sh, scripts/get_model.py)")
        return
    llama = LlamaServer.launch(binary, model, log_path=tmp / "llama.log", parallel=4, threads=2)
    question = [{"role": "user", "content": "What is the capital of France? One word."}]
    story = [{"role": "user", "content": "Write a very long story about a dragon."}]
    rows = []
    try:
        modes = [
            ("idle box (floor)", 0, ""),
            ("3 long answers running, nothing queued (floor)", 3, "fair_queuing = false\n"),
            ("fair, reserved_slots = 1", longs, "reserved_slots = 1\n"),
            ("fair, no slot reserved", longs, ""),
            ("first come first served", longs, "fair_queuing = false\n"),
        ]
        for n, (mode, batch, slots) in enumerate(modes):
            config = tmp / f"{n}.toml"
            config.write_text(
                f'[server]\nlog_level = "warning"\ndata_dir = "{tmp / str(n)}"\n\n'
                f'[[backend]]\nname = "smollm2"\nprovider = "llamacpp"\nbase_url = "{llama.url}"\n'
                f"max_concurrent = 4\nqueue_timeout = 600\n{slots}"
                '\n[[key]]\nname = "batch"\nkey = "batch-key"\n\n[[key]]\nname = "chat"\nkey = "chat-key"\n'
            )
            gw = GatewayProcess.launch(["--config", str(config)], log_path=tmp / f"{n}.log")
            started = time.perf_counter()
            try:
                threads = []
                if batch:

                    def long_one(url: str = gw.url) -> None:
                        body = {"model": "smollm2", "messages": story, "max_tokens": long_tokens, "ignore_eos": True}
                        httpx.post(
                            url + "/v1/chat/completions",
                            json=body,
                            headers={"Authorization": "Bearer batch-key"},
                            timeout=1200,
                        )

                    threads = [threading.Thread(target=long_one) for _ in range(batch)]
                    for t in threads:
                        t.start()
                    time.sleep(3.0)  # every slot taken, the rest queued
                ttft = []
                for _ in range(questions):
                    body = {"model": "smollm2", "messages": question, "max_tokens": 8, "stream": True}
                    t0 = time.perf_counter()
                    with httpx.stream(
                        "POST",
                        gw.url + "/v1/chat/completions",
                        json=body,
                        headers={"Authorization": "Bearer chat-key"},
                        timeout=1200,
                    ) as r:
                        lines = r.iter_lines()
                        for line in lines:
                            compact = line.replace(" ", "")
                            if '"content":"' in compact and '"content":""' not in compact:
                                ttft.append((time.perf_counter() - t0) * 1000)
                                break
                        for _ in lines:  # the rest of the answer
                            pass
                for t in threads:
                    t.join()
                rows.append(
                    {
                        "mode": mode,
                        "short key TTFT p50 ms": f"{pct(ttft, 50):.0f}",
                        "p99 ms": f"{pct(ttft, 99):.0f}",
                        "max ms": f"{max(ttft):.0f}",
                        "questions": len(ttft),
                        "wall s": f"{time.perf_counter() - started:.0f}",
                    }
                )
            finally:
                gw.stop()
    finally:
        llama.stop()
    print_table(
        f"llama-server, 4 slots: key A sends {longs} x {long_tokens}-token answers at once; "
        f"key B asks {questions} short questions one at a time",
        rows,
    )


def _config(tmp: Path, name: str, upstream: str, limits: str, **server: object) -> Path:
    lines = [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}" for k, v in server.items()]
    path = tmp / f"{name}.toml"
    path.write_text(
        "\n".join(
            [
                "[server]",
                'admin_key = "root-key"',
                'log_level = "warning"',
                f'data_dir = "{tmp / name}"',
                *lines,
                "[[backend]]",
                'name = "m"',
                'provider = "openai-compatible"',
                'model = "fake-model"',
                f'base_url = "{upstream}"',
                "max_concurrent = 64",
                '[[key]]\nname = "alice"\nkey = "alice-key"',
                '[[key]]\nname = "free"\nkey = "free-key"',
                '[[key]]\nname = "bob"\nkey = "bob-key"',
                limits,
            ]
        )
    )
    return path


def _serve(config: Path, tmp: Path, name: str, *extra: str) -> GatewayProcess:
    return GatewayProcess.launch(["--config", str(config), *extra], log_path=tmp / f"{name}.log")


def shared_cost(upstream: str, tmp: Path, n: int, rounds: int, redis_url: str) -> None:
    """A request's cost for its key's reservation, where the counts live."""
    limits = "[limits.alice]\nconcurrent = 1000\ntokens_per_minute = 1000000000\ntoken_budget = 1000000000000"
    memory = _serve(_config(tmp, "memory", upstream, limits), tmp, "memory")
    workers = _serve(_config(tmp, "workers", upstream, limits), tmp, "workers", "--workers", "2")
    redis = _serve(_config(tmp, "redis", upstream, limits, store=redis_url), tmp, "redis")
    alice, free = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer free-key"}
    try:
        figures: dict[str, list[float]] = {
            "direct (floor)": [],
            "a key without limits (one process)": [],
            "limited: memory (one process)": [],
            "a key without limits (--workers 2)": [],
            "limited: SQLite (--workers 2)": [],
            "limited: Redis (--store)": [],
        }
        for _ in range(rounds):
            figures["direct (floor)"] += per_request(upstream, n)
            figures["a key without limits (one process)"] += per_request(memory.url + "/v1", n, free)
            figures["limited: memory (one process)"] += per_request(memory.url + "/v1", n, alice)
            figures["a key without limits (--workers 2)"] += per_request(workers.url + "/v1", n, free)
            figures["limited: SQLite (--workers 2)"] += per_request(workers.url + "/v1", n, alice)
            figures["limited: Redis (--store)"] += per_request(redis.url + "/v1", n, alice)
        base = pct(figures["a key without limits (one process)"], 50)
        rows = [
            {
                "path": k,
                "p50 ms": f"{pct(v, 50):.3f}",
                "p99 ms": f"{pct(v, 99):.3f}",
                "p50 - no limits": f"{pct(v, 50) - base:+.3f}",
                "n": len(v),
            }
            for k, v in figures.items()
        ]
        print_table(f"a limited key's reservation, per request (1-token answer, {rounds} alternating rounds)", rows)
    finally:
        for gw in (memory, workers, redis):
            gw.stop()


def overshoot(tmp: Path, redis_url: str) -> None:
    """A key's limits with --workers 2 and with two hosts on one Redis."""
    import concurrent.futures

    from abstract_client.testing import FakeOpenAIServer

    def chat(url: str, key: str, max_tokens: int, prompt: str = "x") -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60).status_code

    def parallel(urls: list[str], n: int, key: str, max_tokens: int, prompt: str = "x") -> list[int]:
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            return list(pool.map(lambda i: chat(urls[i % len(urls)], key, max_tokens, prompt), range(n)))

    def peak(server: FakeOpenAIServer) -> int:
        spans = [(r.received_at, r.token_times[-1] if r.token_times else r.received_at) for r in server.records]
        now = most = 0
        for _, step in sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans]):
            now += step
            most = max(most, now)
        return most

    limits = (
        '[limits.alice]\ntoken_budget = 1000\nbudget_period = "day"\n[limits.free]\nconcurrent = 2\n'
        '[limits.bob]\ntoken_budget = 1000\nbudget_period = "day"'
    )
    import redis as redis_py

    redis_py.Redis.from_url(redis_url).flushall()  # what the cost runs spent is not these keys'
    rows = []
    for setup in ("--workers 2", "two hosts, one Redis"):
        with FakeOpenAIServer(token_delay=0.002) as upstream:
            name = "w" if setup.startswith("--") else "h"
            if name == "w":
                hosts = [_serve(_config(tmp, name, upstream.base_url, limits), tmp, name, "--workers", "2")]
            else:
                conf = [_config(tmp, f"h{i}", upstream.base_url, limits, store=redis_url) for i in range(2)]
                hosts = [_serve(c, tmp, f"h{i}") for i, c in enumerate(conf)]
            urls = [h.url for h in hosts]
            try:
                statuses = parallel(urls, 16, "alice-key", 200)
                time.sleep(1.5)  # every worker's last batch of records
                data = httpx.get(
                    urls[0] + "/v1/usage", params={"key": "alice"}, headers={"Authorization": "Bearer root-key"}
                ).json()["data"]
                spent = sum(r["prompt_tokens"] - r["cached_tokens"] + r["generated_tokens"] for r in data)
                upstream.records.clear()
                upstream.behavior.token_delay = 0.02
                slow = parallel(urls, 12, "free-key", 150)
                most = peak(upstream)
                upstream.behavior.token_delay = 0.002
                prompts = parallel(urls, 6, "bob-key", 1, " ".join(["word"] * 3000))
                rows.append(
                    {
                        "setup": setup,
                        "16 x 200 on 1,000: admitted": statuses.count(200),
                        "spent": spent,
                        "12 on concurrent=2: most at once": most,
                        "admitted": slow.count(200),
                        "6 x 3,000-token prompts: admitted": prompts.count(200),
                    }
                )
            finally:
                for h in hosts:
                    h.stop()
            redis_py.Redis.from_url(redis_url).flushall()  # the next setup's counts start afresh
    print_table("a key's limits across processes (before #68: 2,010 spent, 4 at once, 6 prompts admitted)", rows)


def refusals(upstream: str, tmp: Path, seconds: float) -> None:
    """One keep-alive connection over its key's requests_per_minute for ``seconds``: what the
    refusals add to the usage database."""
    config = _config(tmp, "refusals", upstream, "[limits.alice]\nrequests_per_minute = 1")
    gw = _serve(config, tmp, "refusals")
    db = tmp / "refusals" / "usage.sqlite3"

    def size() -> int:
        """What the database keeps: its file once the WAL is checkpointed into it (the WAL
        itself is reused, bounded by SQLite's checkpoint at 1,000 pages)."""
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in db.parent.glob("usage.sqlite3*"))

    try:
        with httpx.Client(timeout=30, headers={"Authorization": "Bearer alice-key"}) as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
            http.post(gw.url + "/v1/chat/completions", json=body)
            time.sleep(1.0)
            before, sent, end = size(), 0, time.monotonic() + seconds
            while time.monotonic() < end:
                http.post(gw.url + "/v1/chat/completions", json=body)
                sent += 1
        time.sleep(1.5)
        rows = [{"refusals": sent, "seconds": seconds, "usage files grew (bytes)": size() - before}]
        print_table("refusals on one connection (goal: 20,000 in 10 s add < 100 kB; before #68: 7.9 MB)", rows)
    finally:
        gw.stop()


def readers(tmp: Path, count: int) -> None:
    rows = [_readers(tmp, count, stall=False), _readers(tmp, count, stall=True)]
    goal = "goal: readers add <= 32 MiB to the same responses unread; before #68: 115-135 MiB in all"
    print_table(f"stalled readers of background responses ({goal})", rows)


def _readers(tmp: Path, count: int, *, stall: bool) -> dict[str, object]:
    """``count`` background responses, each read by a client that never reads (a 4 KiB
    receive window), on a gateway holding 2 (``max_background``) of at most 8 MiB each: the
    gateway's memory before and after (goal: growth within 2 x 8 MiB + 32 MiB)."""
    import socket

    import psutil

    from abstract_client.testing import FakeOpenAIServer

    with FakeOpenAIServer(token_delay=0.0) as upstream:
        config = _config(
            tmp,
            f"readers-{stall}",
            upstream.base_url,
            "",
            max_background=2,
            background_max_bytes=8 * 2**20,
            write_timeout=600,
        )
        gw = _serve(config, tmp, f"readers-{stall}")
        headers = {"Authorization": "Bearer root-key"}
        stalled = []
        try:
            proc = psutil.Process(gw.pid)
            base = proc.memory_info().rss
            for i in range(count):
                body = {"model": "m", "input": f"r{i}", "max_output_tokens": 200_000, "background": True}
                while True:
                    answer = httpx.post(gw.url + "/v1/responses", json=body, headers=headers, timeout=30)
                    if answer.status_code != 429:  # two held already: wait until one may go
                        break
                    time.sleep(0.2)
                rid = answer.json()["id"]
                while not stall:
                    if httpx.get(f"{gw.url}/v1/responses/{rid}", headers=headers).json()["status"] not in (
                        "queued",
                        "in_progress",
                    ):
                        break
                    time.sleep(0.2)
                if not stall:
                    continue
                reader = socket.socket()
                reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                reader.connect(("127.0.0.1", gw.port))
                reader.sendall(
                    f"GET /v1/responses/{rid}?stream=true HTTP/1.1\r\nHost: x\r\n"
                    "Authorization: Bearer root-key\r\n\r\n".encode()
                )
                stalled.append(reader)
                while httpx.get(f"{gw.url}/v1/responses/{rid}", headers=headers, timeout=30).json()["status"] in (
                    "queued",
                    "in_progress",
                ):
                    time.sleep(0.2)
            grown = (proc.memory_info().rss - base) / 2**20
            return {
                "responses": count,
                "stalled readers": len(stalled),
                "held at most (MiB)": 16,
                "RSS grew (MiB)": round(grown, 1),
            }
        finally:
            for reader in stalled:
                reader.close()
            gw.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cost", action="store_true")
    parser.add_argument("--streams", action="store_true")
    parser.add_argument("--fair", action="store_true")
    parser.add_argument("--shared", action="store_true")
    parser.add_argument("--refusals", action="store_true")
    parser.add_argument("--readers", action="store_true")
    parser.add_argument("-n", type=int, default=300, help="requests per round (--cost); streams (--streams)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--longs", type=int, default=30)
    parser.add_argument("--long-tokens", type=int, default=200)
    parser.add_argument("--questions", type=int, default=20)
    args = parser.parse_args()
    every = not (args.cost or args.streams or args.fair or args.shared or args.refusals or args.readers)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if every or args.cost or args.streams or args.refusals:
            proc, upstream = spawn_printing_url([sys.executable, str(HERE / "_load_upstream.py")])
            try:
                wait_ready(upstream)
                if every or args.cost:
                    cost(upstream, tmp, args.n, args.rounds)
                if every or args.streams:
                    streams(upstream, tmp, args.n, args.rate, args.chunks)
                if every or args.refusals:
                    refusals(upstream, tmp, 10.0)
            finally:
                proc.terminate()
        if every or args.shared:
            shared(tmp, args.n, args.rounds)
        if every or args.readers:
            readers(tmp, 16)
        if every or args.fair:
            fair(tmp, args.longs, args.long_tokens, args.questions)


def shared(tmp: Path, n: int, rounds: int) -> None:
    import shutil
    import subprocess

    from abstract_client.testing.processes import free_port

    port = free_port()
    argv = [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(port), "--bind", "127.0.0.1"]
    redis = subprocess.Popen([*argv, "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    redis_url = f"redis://127.0.0.1:{port}/0"
    proc, upstream = spawn_printing_url([sys.executable, str(HERE / "_load_upstream.py")])
    try:
        wait_ready(upstream)
        time.sleep(0.5)
        shared_cost(upstream, tmp, n, rounds, redis_url)
        overshoot(tmp, redis_url)
    finally:
        proc.terminate()
        redis.terminate()


if __name__ == "__main__":
    main()
