"""A key's limits as steps on its state (``gateway/limits.py``): the rules in Python, sans-io, and
their Lua twin on a real ``redis-server`` run on the same random operations, verdict for verdict
and state for state; the prompt's bound against a real tokenizer; a dead process's reservations
coming back within a lease."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from abstract_client.gateway.team.keys import Limits
from abstract_client.gateway.team.limit_steps import admit_step, fresh_state, release_step, renew_step, sane
from abstract_client.gateway.team.limit_stores import MemoryLimits, RedisLimits, SQLiteLimits
from abstract_client.gateway.team.limits import DEFAULT_RESERVE, Admission, Limiter, Refusal, prompt_bound

from .helpers import needs_module
from .test_gateway_hosts import RedisServer
from .test_gateway_usage_hosts import redis_fixture  # noqa: F401 (the `redis` fixture)

pytestmark = pytest.mark.timeout(120)

T0 = 1_800_000_000_000  # ms
LEASE = 10_000
END = T0 + 86_400_000


def admit(state: dict[str, Any], now: int, ticket: str, want: int, **limits: int) -> list[Any]:
    lim = {"concurrent": -1, "rpm": -1, "tpm": -1, "budget": -1, **limits}
    return admit_step(
        state, now, ticket, want, LEASE, 0, END, False, lim["concurrent"], lim["rpm"], lim["tpm"], lim["budget"]
    )


def test_the_steps_hold_each_limit() -> None:
    s = fresh_state()
    # concurrency: exact
    assert admit(s, T0, "a", 10, concurrent=2)[0] == 1
    assert admit(s, T0, "b", 10, concurrent=2)[0] == 1
    assert admit(s, T0, "c", 10, concurrent=2)[:3] == [0, "concurrent", 1]
    release_step(s, T0 + 5, "a", 7)
    assert admit(s, T0 + 6, "c", 10, concurrent=2)[0] == 1
    # a budget: a reservation counts the prompt with max_tokens, at most what is left
    s = fresh_state()
    verdicts = [admit(s, T0, f"t{i}", 3_000 + 1, budget=1_000) for i in range(6)]
    assert [v[0] for v in verdicts] == [1, 0, 0, 0, 0, 0]
    assert verdicts[0][3] == 1_000 and verdicts[1][1] == "token_budget"
    release_step(s, T0 + 1, "t0", 3_001)  # it cost what the engine counted: past the budget
    assert admit(s, T0 + 2, "t9", 1, budget=1_000)[1] == "token_budget"
    # tokens per minute: settled ones leave the window after 60 s
    s = fresh_state()
    assert admit(s, T0, "a", 800, tpm=1_000)[3] == 800
    release_step(s, T0 + 100, "a", 1_000)
    refused = admit(s, T0 + 200, "b", 10, tpm=1_000)
    assert refused[:2] == [0, "tokens_per_minute"] and 59 <= refused[2] <= 60
    assert admit(s, T0 + 60_100, "b", 10, tpm=1_000)[0] == 1
    # requests per minute, and 0: a 429 to every request (a key suspended), never an error
    s = fresh_state()
    assert [admit(s, T0 + i, f"r{i}", 1, rpm=2)[0] for i in range(3)] == [1, 1, 0]
    assert admit(fresh_state(), T0, "z", 1, rpm=0)[:3] == [0, "requests_per_minute", 60]
    assert admit(fresh_state(), T0, "z", 1, concurrent=0)[1] == "concurrent"


def test_a_dead_processs_reservations_come_back_within_a_lease() -> None:
    s = fresh_state()
    assert admit(s, T0, "alive", 100, concurrent=2, budget=1_000)[0] == 1
    assert admit(s, T0, "dead", 100, concurrent=2, budget=1_000)[0] == 1
    assert admit(s, T0 + 1, "x", 100, concurrent=2)[1] == "concurrent"
    for at in range(T0 + LEASE // 3, T0 + 3 * LEASE, LEASE // 3):  # the living process renews its own
        renew_step(s, at, LEASE, ["alive"])
    # the dead one's lapsed: its slot and its tokens are back at the next decision
    assert admit(s, T0 + 3 * LEASE, "next", 100, concurrent=2, budget=1_000)[0] == 1
    assert set(s["f"]) == {"alive", "next"}


def _random_ops(rng: random.Random, n: int) -> Iterator[tuple[str, tuple[Any, ...]]]:
    now, tickets = T0, []
    for i in range(n):
        now += rng.choice([0, 1, 7, 450, 999, 1_000, 3_500, 20_000, 61_000])
        op = rng.random()
        if op < 0.55 or not tickets:
            ticket = f"t{i}"
            tickets.append(ticket)
            limits = [rng.choice([-1, -1, 0, 1, 2, 3, 5]), rng.choice([-1, -1, 0, 2, 4, 9])]
            limits += [rng.choice([-1, -1, 0, 50, 500, 5_000]), rng.choice([-1, -1, 0, 100, 1_000, 20_000])]
            end = T0 + rng.choice([86_400_000, 3_600_000, 120_000])
            want = rng.choice([1, 17, 300, 1_024, 9_000])
            yield "admit", (now, ticket, want, LEASE, rng.choice([0, 50, 900]), end, rng.random() < 0.2, *limits)
        elif op < 0.85:
            yield "release", (now, rng.choice(tickets), rng.choice([0, 0, 1, 40, 700, 3_000]))
        else:
            yield "renew", (now, LEASE, rng.sample(tickets, min(len(tickets), rng.randint(1, 3))))


def test_the_lua_twin_decides_as_the_python_steps_do(redis: RedisServer) -> None:
    """400 random operations on four keys (every limit, none, 0, periods ending, leases lapsing,
    releases of unknown tickets, renewals): every verdict and every state the same."""
    import redis as redis_py

    steps = {"admit": admit_step, "release": release_step, "renew": renew_step}
    store = RedisLimits(redis.url, timeout=5.0)
    direct = redis_py.Redis.from_url(redis.url)

    async def run() -> None:
        rng = random.Random(20261207)
        states = {f"k{i}": fresh_state() for i in range(4)}
        for n, (op, args) in enumerate(_random_ops(rng, 400)):
            key = rng.choice(sorted(states))
            want = steps[op](states[key], *args)
            got = await store.step(key, op, *args)
            assert got == want, (n, op, args, got, want)
            raw = direct.get(f"ac:limits:{key}")
            theirs = sane(json.loads(raw)) if raw else fresh_state()
            assert theirs == sane(states[key]), (n, op, theirs, states[key])
        await store.aclose()

    asyncio.run(run())
    # a value that is not a state of ours (an operator's edit, another type) is a fresh state
    direct.set("ac:limits:odd", b"\xff not json")
    direct.hset("ac:limits:hashed", "x", "1")

    async def foreign() -> None:
        for key in ("odd", "hashed"):
            assert (await store.step(key, "admit", T0, "t", 5, LEASE, 0, END, False, 1, -1, -1, -1))[0] == 1
        await store.aclose()

    asyncio.run(foreign())
    direct.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_limiter_admits_against_its_store_and_settles_once(kind: str, tmp_path: Path) -> None:
    store = MemoryLimits() if kind == "memory" else SQLiteLimits(tmp_path / "limits.sqlite3")
    limiter = Limiter({"alice": Limits(concurrent=3, token_budget=2_000, budget_period="day")}, store=store)

    async def run() -> None:
        first = await limiter.admit("alice", 100, prompt_tokens=50)
        assert isinstance(first, Admission) and first.reserved == 150
        second = await limiter.admit("alice", None)
        assert isinstance(second, Admission) and second.reserved == DEFAULT_RESERVE
        # more than is left, with requests in flight: it waits for them (one overshoot at most)
        waits = await limiter.admit("alice", 10_000)
        assert isinstance(waits, Refusal) and (waits.limit, waits.retry_after) == ("token_budget", 1)
        small = await limiter.admit("alice", 1)
        assert isinstance(small, Admission)
        refused = await limiter.admit("alice", 1)
        assert isinstance(refused, Refusal) and refused.limit == "concurrent"
        for admission, cost in ((first, 120), (first, 120), (second, 30), (small, 1)):  # each once
            admission.settle(cost)
        alone = await limiter.admit("alice", 10_000)  # nothing in flight: what is left
        assert isinstance(alone, Admission) and alone.reserved == 2_000 - 151
        assert isinstance(await limiter.admit("bob", 1), Admission)  # no limits: nothing counted

    asyncio.run(run())
    if isinstance(store, SQLiteLimits):  # every worker opening the file sees the same counts
        other = SQLiteLimits(tmp_path / "limits.sqlite3")
        state = json.loads(other.db.execute("SELECT state FROM limits WHERE key = 'alice'").fetchone()[0])
        assert len(state["f"]) == 1 and state["s"] == 151


@needs_module("tokenizers", "mlx")
def test_the_prompt_bound_is_never_below_a_real_tokenizers_count() -> None:
    """SmolLM2's byte-level BPE tokenizer (the model the suite runs), on texts in several
    scripts, emoji and markup: the bound is above the chat template's whole count."""
    from tokenizers import Tokenizer

    from abstract_client.app.assets import smollm2_mlx

    tok = Tokenizer.from_file(str(smollm2_mlx() / "tokenizer.json"))
    rng = random.Random(7)
    alphabet = "abc xyz 0123 ,.;{}<>\n\t é ß Ж 中文 日本 🙂👍🏽 \u200d ḁ̈"
    for _ in range(200):
        messages = [
            {
                "role": rng.choice(["system", "user", "assistant"]),
                "content": "".join(rng.choices(alphabet, k=rng.randint(0, 400))),
            }
            for _ in range(rng.randint(1, 4))
        ]
        templated = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        counted = len(tok.encode(templated + "<|im_start|>assistant\n").ids)
        assert prompt_bound({"messages": messages}) >= counted
