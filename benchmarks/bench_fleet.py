"""Fleet over real llama-server replicas (SmolLM2-135M, CPU): time to first chunk with one
replica made slow, with and without hedging, beside the floor (straight to the free replica);
the hedges' cost (requests sent, won; what the losers decoded after losing, from the slow
server's own log); and failover's cost when a member is down (connection refused).

The slow replica is kept busy by a load client in its own process: two endless-ish streams at a
time on its two slots, so a call that lands there queues behind them (seconds).

``--outage``: a kill/restart scenario instead (issue #41). Three replicas, ``--callers``
threads calling in a loop (4-token answers); after ``--phase`` seconds one replica is killed
(``kill -9``), after another ``--phase`` restarted on its port, then ``--phase`` more. Printed:
calls that stalled (longer than any call of the steady phase), failed calls, p50/p99 latency per
phase, and the time from the restarted replica answering its readiness route to its first call.

``--routing``: the placement policies side by side (issue #52). ``--replicas`` real
llama-servers (one thread, one slot each, as a small CPU host runs them); ``--tenants`` tenants,
each with its own ~600-token system prompt and ``--users`` users, each user a conversation of
``--turns`` turns; conversations start as a Poisson process (``--rate`` per second) and think
(exponential, mean 1 s) between turns. Every policy gets fresh prompts (nothing cached from the
run before it). Printed per policy: time to first chunk p50 / p90, the cached share of prompt
tokens (llama-server's own ``timings.cache_n`` / ``prompt_n``, as ``usage.cached_tokens``) over
all calls and over the calls after each tenant's first, and calls per member (busiest / mean).

Usage: python benchmarks/bench_fleet.py [-n 30] [--hedge-after 0.25]
       python benchmarks/bench_fleet.py --outage [--phase 6]
       python benchmarks/bench_fleet.py --routing [--replicas 3 --tenants 6 --users 3 --turns 4]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
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


def outage(binary: Path, model: Path, phase: float, callers: int) -> None:
    logs = Path(tempfile.mkdtemp())
    replicas = [LlamaServer.launch(binary, model, log_path=logs / f"r{i}.log", parallel=2, threads=1) for i in range(3)]
    members = {
        f"r{i}": create_llm("llamacpp", "smollm2", base_url=r.url, max_retries=0) for i, r in enumerate(replicas)
    }
    fleet = Fleet(members, policy="round_robin", max_attempts=3)
    calls: list[tuple[float, float, str, str]] = []  # (start, seconds, member, error)
    done = threading.Event()

    def caller() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            try:
                member, error = fleet.generate(messages=CAPITAL, max_tokens=4).member or "", ""  # type: ignore[arg-type]
            except Exception as exc:
                member, error = "", type(exc).__name__
            calls.append((t0, time.monotonic() - t0, member, error))

    try:
        threads = [threading.Thread(target=caller, daemon=True) for _ in range(callers)]
        for t in threads:
            t.start()
        time.sleep(phase)
        killed_at = time.monotonic()
        replicas[0].kill()
        time.sleep(phase)
        replicas[0].start(120)  # returns once its readiness route answers
        ready_at = time.monotonic()
        time.sleep(phase)
        done.set()
        for t in threads:
            t.join(30)
    finally:
        fleet.close()
        for r in replicas:
            r.stop()
    phases = {
        "steady (3 replicas)": [c for c in calls if c[0] < killed_at],
        "outage (r0 killed)": [c for c in calls if killed_at <= c[0] < ready_at],
        "after r0's restart": [c for c in calls if c[0] >= ready_at],
    }
    steady_max = max((c[1] for c in phases["steady (3 replicas)"] if not c[3]), default=1.0)
    rows = []
    for name, part in phases.items():
        ms = [c[1] * 1000 for c in part]
        rows.append(
            {
                "phase": name,
                "calls": len(part),
                "failed": sum(1 for c in part if c[3]),
                "stalled": sum(1 for c in part if c[1] > steady_max),
                "p50 ms": pct(ms, 50),
                "p99 ms": pct(ms, 99),
                "max ms": max(ms, default=float("nan")),
            }
        )
    print_table(f"A replica killed and restarted under {callers} callers (ms)", rows, digits=1)
    back = [c for c in calls if c[2] == "r0" and c[0] >= ready_at]
    first = min(back, default=None)
    if first is None:
        print("\nr0 served nothing after its restart")
    else:
        print(
            f"\nr0 back: its first call after the restart was sent {(first[0] - ready_at) * 1000:.0f} ms after its "
            f"readiness route answered, and answered {(first[0] + first[1] - ready_at) * 1000:.0f} ms after"
        )
    print(f"failed calls during the outage: {[c[3] for c in phases['outage (r0 killed)'] if c[3]]}")


TENANT_PROMPT = (
    "You are the assistant of {name}. {name} sells {goods} and ships within three days. "
    "Answer in one short sentence. Never invent prices. Refunds take five working days. "
)


def tenant_prompt(name: str, goods: str) -> str:
    return (TENANT_PROMPT.format(name=name, goods=goods) * 12).strip()  # ~600 tokens


def one_policy(policy: str, replicas: list[LlamaServer], args: argparse.Namespace) -> dict[str, Any]:
    """One policy's run: fresh prompts (salted by the policy's name), the same arrivals."""
    import random

    rng = random.Random(7)  # the same arrivals and think times for every policy
    members = {
        f"r{i}": create_llm("llamacpp", "smollm2", base_url=r.url, max_retries=0) for i, r in enumerate(replicas)
    }
    calls: list[tuple[int, int, float, int, int, str]] = []  # tenant, turn, ttft ms, prompt, cached, member
    lock = threading.Lock()
    with Fleet(members, policy=policy) as fleet:  # type: ignore[arg-type]

        def converse(tenant: int, user: int, start: float, thinks: list[float]) -> None:
            time.sleep(max(0.0, start - time.perf_counter()))
            history = [{"role": "system", "content": tenant_prompt(f"{policy}-shop-{tenant}", "bicycles")}]
            for turn in range(args.turns):
                history.append({"role": "user", "content": f"User {user} asks question {turn} about delivery."})
                t0 = time.perf_counter()
                first = None
                with fleet.stream(messages=history, max_tokens=8, temperature=0) as stream:  # type: ignore[arg-type]
                    for _ in stream:
                        if first is None:
                            first = time.perf_counter() - t0
                result = stream.result()
                u = result.usage
                with lock:
                    calls.append(
                        (tenant, turn, (first or 0.0) * 1000, (u and u.prompt_tokens) or 0,
                         (u and u.cached_tokens) or 0, result.member or "-")
                    )  # fmt: skip
                history.append({"role": "assistant", "content": result.content})
                time.sleep(thinks[turn])

        t = time.perf_counter() + 0.5
        threads = []
        for user in range(args.users):
            for tenant in range(args.tenants):
                thinks = [rng.expovariate(1.0) for _ in range(args.turns)]
                threads.append(threading.Thread(target=converse, args=(tenant, user, t, thinks)))
                t += rng.expovariate(args.rate)
        began = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        took = time.perf_counter() - began
    seen: set[int] = set()
    later_prompt = later_cached = 0
    later_ms: list[float] = []
    for tenant, _turn, ms, prompt, cached, _m in calls:  # in completion order
        if tenant in seen:
            later_prompt += prompt
            later_cached += cached
            later_ms.append(ms)
        seen.add(tenant)
    per_member = {m: sum(1 for c in calls if c[5] == m) for m in members}
    if args.verbose:
        for c in calls:
            print(f"  {policy}: tenant {c[0]} turn {c[1]} on {c[5]}: {c[2]:.0f} ms, {c[4]}/{c[3]} cached")
    return {
        "policy": policy,
        "calls": len(calls),
        "ttft p50 ms": pct([c[2] for c in calls], 50),
        "p90": pct([c[2] for c in calls], 90),
        "p90 after tenant's 1st": pct(later_ms, 90),
        "cached share (all)": sum(c[4] for c in calls) / max(1, sum(c[3] for c in calls)),
        "cached (after tenant's 1st)": later_cached / max(1, later_prompt),
        "calls per member": " ".join(f"{m}:{n}" for m, n in per_member.items()),
        "busiest / mean": max(per_member.values()) / (len(calls) / len(members)),
        "wall s": took,
    }


def routing(binary: Path, model: Path, args: argparse.Namespace) -> None:
    logs = Path(tempfile.mkdtemp())
    replicas = [
        LlamaServer.launch(binary, model, log_path=logs / f"r{i}.log", parallel=1, threads=1, ctx=4096)
        for i in range(args.replicas)
    ]
    rows = []
    try:
        for policy in args.policies.split(","):
            rows.append(one_policy(policy, replicas, args))
            print(rows[-1], flush=True)
    finally:
        for r in replicas:
            r.stop()
    print_table(
        f"Routing policies on {args.replicas} llama-server replicas (SmolLM2, 1 thread, 1 slot each): "
        f"{args.tenants} tenants x {args.users} users x {args.turns} turns, Poisson arrivals {args.rate}/s",
        rows,
        digits=2,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--hedge-after", type=float, default=0.25)
    parser.add_argument("--outage", action="store_true", help="the kill/restart scenario instead")
    parser.add_argument("--phase", type=float, default=6.0, help="--outage: seconds per phase")
    parser.add_argument("--callers", type=int, default=4, help="--outage: threads calling in a loop")
    parser.add_argument("--routing", action="store_true", help="the routing policies side by side instead")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--users", type=int, default=3)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--verbose", action="store_true", help="--routing: every call")
    parser.add_argument("--policies", default="prefix,least_loaded,round_robin,affinity")
    parser.add_argument("--rate", type=float, default=0.25, help="--routing: conversations started per second")
    args = parser.parse_args()
    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        raise SystemExit("llama-server or the model is missing: run scripts/get_llama_server.sh, scripts/get_model.py")
    if args.outage:
        outage(binary, model, args.phase, args.callers)
        return
    if args.routing:
        routing(binary, model, args)
        return
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
