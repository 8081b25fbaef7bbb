"""Fleet over real llama-server replicas (SmolLM2-135M, CPU): time to first chunk with one
replica made slow, with and without hedging, beside the floor (straight to the free replica);
the hedges' cost (requests sent, won; what the losers decoded after losing, from the slow
server's own log); and failover's cost when a member is down (connection refused).

The slow replica is kept busy by a load client in its own process: two endless-ish streams at a
time on its two slots, so a call that lands there queues behind them (seconds).

Usage: python benchmarks/bench_fleet.py [-n 30] [--hedge-after 0.25]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tables import pct, print_table

from abstract_client import LLM, Fleet, create_llm
from abstract_client.testing.processes import LlamaServer, free_port, llama_server_binary, smollm2_gguf

CAPITAL = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
LOAD = r"""
import sys, threading, httpx
url = sys.argv[1]
def loop():
    while True:
        try:
            body = {"messages": [{"role": "user", "content": "Write a story."}], "max_tokens": 150,
                    "stream": True, "ignore_eos": True}
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    pass
        except Exception:
            pass
for _ in range(2):
    threading.Thread(target=loop, daemon=True).start()
threading.Event().wait()
"""


def ttft(llm: LLM, n: int) -> tuple[list[float], list[str]]:
    times, members = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        with llm.stream(messages=CAPITAL, max_tokens=4) as stream:  # type: ignore[arg-type]
            next(iter(stream))
            times.append((time.perf_counter() - t0) * 1000)
            for _ in stream:
                pass
        members.append(stream.result().member or "-")
    return times, members


def row(label: str, times: list[float], members: list[str], **extra: Any) -> dict[str, Any]:
    share = {m: members.count(m) for m in sorted(set(members))}
    return {
        "path": label,
        "n": len(times),
        "ttft p50 ms": pct(times, 50),
        "p90": pct(times, 90),
        "p99": pct(times, 99),
        "served by": " ".join(f"{m}:{c}" for m, c in share.items()),
        **extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--hedge-after", type=float, default=0.25)
    args = parser.parse_args()
    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        raise SystemExit("llama-server or the model is missing: run scripts/get_llama_server.sh, scripts/get_model.py")
    logs = Path(tempfile.mkdtemp())
    slow = LlamaServer.launch(binary, model, log_path=logs / "slow.log", parallel=2, threads=1)
    fast = LlamaServer.launch(binary, model, log_path=logs / "fast.log", parallel=2, threads=1)
    load = subprocess.Popen([sys.executable, "-c", LOAD, slow.url])
    rows = []
    try:
        time.sleep(2)  # the load holds both of the slow replica's slots

        def fleet(**options: Any) -> Fleet:
            members = {
                "slow": create_llm("llamacpp", "smollm2", base_url=slow.url, max_retries=0),
                "fast": create_llm("llamacpp", "smollm2", base_url=fast.url, max_retries=0),
            }
            return Fleet(members, policy="round_robin", **options)

        with create_llm("llamacpp", "smollm2", base_url=fast.url, max_retries=0) as direct:
            prompt = direct.count_tokens(messages=CAPITAL)  # type: ignore[arg-type]
            ttft(direct, 3)
            rows.append(row("floor: straight to the free replica", *ttft(direct, args.n)))
        with fleet() as f:
            rows.append(row("fleet, round robin, no hedging", *ttft(f, args.n)))
        cancels = len(slow.cancelled_tasks())
        with fleet(hedge_after=args.hedge_after) as f:
            times, members = ttft(f, args.n)
            status = f.status()
        rows.append(
            row(
                f"fleet, round robin, hedge_after={args.hedge_after}s",
                times,
                members,
                hedges=f"{status['hedges_sent']} sent, {status['hedges_won']} won",
            )
        )
        load.kill()
        load.wait()
        assert slow.wait_idle(60)
        lost = slow.cancelled_tasks()[cancels:]
        log = slow.log_text()
        decoded = []
        for task in lost:
            m = re.search(rf"task {task} \| stop processing: n_tokens = (\d+)", log)
            if m:
                decoded.append(int(m.group(1)))
        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
        members = {
            "down": create_llm("llamacpp", "smollm2", base_url=dead, max_retries=0),
            "fast": create_llm("llamacpp", "smollm2", base_url=fast.url, max_retries=0),
        }
        # never cooled down: every other call fails over
        with Fleet(members, policy="round_robin", failure_threshold=10**6) as f:
            rows.append(row("fleet, one member down (failover every other call)", *ttft(f, args.n)))
    finally:
        if load.poll() is None:
            load.kill()
        slow.stop()
        fast.stop()
    print_table("Time to first chunk through a Fleet (ms)", rows, digits=1)
    print(
        f"\nlosers cancelled on the slow replica: {sum(1 for n in decoded if n <= prompt + 1)} of "
        f"{status['hedges_sent']} hedges; tokens in a loser's slot at release (prompt + decoded): "
        f"{sorted({n for n in decoded if n <= prompt + 1})} (the prompt is {prompt} tokens; the load "
        f"client's own streams, killed at the end, are the other {sum(1 for n in decoded if n > prompt + 1)})"
    )


if __name__ == "__main__":
    main()
