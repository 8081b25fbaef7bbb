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

Usage: python benchmarks/bench_usage.py [--cost] [--streams] [--fair] [-n 300]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cost", action="store_true")
    parser.add_argument("--streams", action="store_true")
    parser.add_argument("--fair", action="store_true")
    parser.add_argument("-n", type=int, default=300, help="requests per round (--cost); streams (--streams)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--longs", type=int, default=30)
    parser.add_argument("--long-tokens", type=int, default=200)
    parser.add_argument("--questions", type=int, default=20)
    args = parser.parse_args()
    every = not (args.cost or args.streams or args.fair)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if every or args.cost or args.streams:
            proc, upstream = spawn_printing_url([sys.executable, str(HERE / "_load_upstream.py")])
            try:
                wait_ready(upstream)
                if every or args.cost:
                    cost(upstream, tmp, args.n, args.rounds)
                if every or args.streams:
                    streams(upstream, tmp, args.n, args.rate, args.chunks)
            finally:
                proc.terminate()
        if every or args.fair:
            fair(tmp, args.longs, args.long_tokens, args.questions)


if __name__ == "__main__":
    main()
