"""Fleet over three REAL llama-server replicas of SmolLM2, judged by the servers' own evidence:
their ``cancel task`` log lines, their slots, the cached-token counts they report."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from abstract_client import Fleet, GenerateResult, GenerationCancelledError, TransportError, create_llm
from abstract_client.testing.processes import LlamaServer

from .helpers import launch_llama_server, wait_until
from .test_llamacpp_real import CAPITAL

pytestmark = pytest.mark.llamacpp

STORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a very long story about a dragon."},
]
ENDLESS = {"ignore_eos": True}  # a stream that would run to max_tokens: only a stop ends it early


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LlamaServer]]:
    # two slots each: new calls still find room beside a long stream
    servers = [launch_llama_server(tmp_path_factory, f"replica{i}", threads=1, parallel=2) for i in range(3)]
    yield servers
    for s in servers:
        s.stop()


def fleet_of(servers: list[LlamaServer], **options: Any) -> Fleet:
    members = {f"r{i}": create_llm("llamacpp", "smollm2", base_url=s.url, max_retries=0) for i, s in enumerate(servers)}
    return Fleet(members, **options)


def all_idle(servers: list[LlamaServer]) -> None:
    for s in servers:
        assert s.wait_idle(30), "a replica is still busy:\n" + s.log_tail()


def test_affinity_reuses_the_members_cached_prompt(replicas: list[LlamaServer]) -> None:
    """A 10-turn conversation through the fleet: with affinity every turn after the first is
    served by the member that holds its prompt (llama-server's own cached-token count); round
    robin moves it, and the members' caches miss."""

    def converse(fleet: Fleet, opening: str) -> list[GenerateResult]:
        history: list[dict[str, str]] = [{"role": "system", "content": opening}]
        results = []
        for turn in range(10):
            history.append({"role": "user", "content": f"Tell me fact number {turn} about rivers."})
            result = fleet.generate(messages=history, max_tokens=12, temperature=0)  # type: ignore[arg-type]
            history.append({"role": "assistant", "content": result.content})
            results.append(result)
        return results

    all_idle(replicas)
    with fleet_of(replicas, policy="affinity") as fleet:
        sticky = converse(fleet, "You are a geography teacher. Answer in one sentence.")
    with fleet_of(replicas, policy="round_robin") as fleet:
        moved = converse(fleet, "You are a history teacher who also knows rivers. Answer in one sentence.")
    assert len({r.member for r in sticky}) == 1
    assert len({r.member for r in moved}) == 3
    for before, after in itertools.pairwise(sticky):
        assert after.usage is not None and before.usage is not None
        # the previous turn's whole prompt came from the member's cache
        assert (after.usage.cached_tokens or 0) >= (before.usage.prompt_tokens or 0) - 1, (before.usage, after.usage)
    # moved to another member, a turn finds little of its conversation in that member's cache
    misses = [
        b.usage and a.usage and (a.usage.cached_tokens or 0) < (b.usage.prompt_tokens or 0) - 1
        for b, a in itertools.pairwise(moved)
    ]
    assert misses[0] and sum(bool(m) for m in misses) >= 3, [(r.member, r.usage) for r in moved]


def test_hedging_around_a_busy_replica_and_the_loser_is_cancelled(replicas: list[LlamaServer]) -> None:
    """r0's two slots are busy with endless answers: a call that lands there would wait for them.
    With hedge_after the same request goes to r1 too and r1 answers. The loser, queued on r0, is
    severed at once; llama-server notices a queued request's disconnect when it takes the slot
    (here: once the blocker is stopped), and then cancels it before decoding a single token."""
    all_idle(replicas)
    busy, free = replicas[0], replicas[1]
    blocker = create_llm("llamacpp", "smollm2", base_url=busy.url, max_retries=0)
    streams = [blocker.stream(messages=STORY, max_tokens=100_000, extra=ENDLESS) for _ in range(2)]  # type: ignore[arg-type]
    for stream in streams:
        next(iter(stream))
    cancels = len(busy.cancelled_tasks())
    try:
        with fleet_of([busy, free], policy="round_robin", hedge_after=0.3) as fleet:
            for _ in range(4):
                t0 = time.perf_counter()
                result = fleet.generate(messages=CAPITAL, max_tokens=8)  # type: ignore[arg-type]
                assert result.member == "r1" and time.perf_counter() - t0 < 30
            status = fleet.status()
            prompt = result.usage.prompt_tokens if result.usage else None
    finally:
        for stream in streams:
            stream.close()
        blocker.close()
    assert status["hedges_sent"] >= 2 and status["hedges_won"] == status["hedges_sent"]
    assert all(m["failed"] == 0 for m in status["members"])
    # the blockers' own cancels, then each loser's as it took a slot
    expected = 2 + status["hedges_sent"]
    assert wait_until(lambda: len(busy.cancelled_tasks()) - cancels >= expected, 30), busy.log_tail()
    cancelled = busy.cancelled_tasks()[cancels:]

    def released(task: int) -> int | None:
        match = re.search(rf"task {task} \| stop processing: n_tokens = (\d+)", busy.log_text())
        return int(match.group(1)) if match else None

    assert wait_until(lambda: all(released(t) is not None for t in cancelled), 15), busy.log_tail()
    assert prompt is not None
    # the losers: cancelled with their prompt alone in the slot (the blockers held thousands)
    losers = [t for t in cancelled if (released(t) or 0) <= prompt + 1]
    assert len(losers) == status["hedges_sent"], (cancelled, [released(t) for t in cancelled], prompt)
    all_idle(replicas)


def test_two_hundred_stops_leave_every_replica_healthy(replicas: list[LlamaServer]) -> None:
    """LiteLLM's router cools deployments down when callers hang up (#42222): here 200 stops
    across the fleet leave every member healthy, and each replica logged its own cancels."""
    all_idle(replicas)
    before = [len(s.cancelled_tasks()) for s in replicas]
    with fleet_of(replicas, policy="least_loaded", failure_threshold=1) as fleet:
        for i in range(200):
            event = threading.Event()
            with pytest.raises(GenerationCancelledError):
                for n, _ in enumerate(
                    fleet.stream(messages=STORY, max_tokens=4000, cancel_event=event, extra=ENDLESS), 1
                ):  # type: ignore[arg-type]
                    if n == 1 + i % 3:
                        event.set()
        # a stopped attempt leaves in_flight at once; it is counted stopped once its stream unwound
        assert wait_until(lambda: sum(m["stopped"] for m in fleet.status()["members"]) == 200, 15)
        status = fleet.status()["members"]
    assert all(m["in_flight"] == 0 for m in status), status
    assert all(m["state"] == "healthy" and m["failed"] == 0 and m["cooldowns"] == 0 for m in status), status
    assert all(m["stopped"] > 20 for m in status)  # spread over the three
    cancelled = lambda: sum(len(s.cancelled_tasks()) - b for s, b in zip(replicas, before, strict=True))  # noqa: E731
    assert wait_until(lambda: cancelled() >= 200, 30), cancelled()
    all_idle(replicas)


def test_kill_9_a_replica_mid_stream(replicas: list[LlamaServer]) -> None:
    """Streams on all three; ``kill -9`` one: its stream ends typed with its partial text, the
    others go on; new calls go to the live two (none lost, none answered twice); the dead one
    cools down, and is taken back once restarted."""
    all_idle(replicas)
    fleet = fleet_of(
        replicas, policy="least_loaded", failure_threshold=2, cooldown=0.5, max_cooldown=2.0, max_attempts=3
    )
    outcomes: dict[str, Any] = {}
    progress: dict[str, int] = {}

    def consume(rid: str) -> None:
        try:
            for n, _ in enumerate(fleet.stream(messages=STORY, max_tokens=100_000, extra=ENDLESS, request_id=rid), 1):  # type: ignore[arg-type]
                progress[rid] = n
        except BaseException as exc:
            outcomes[rid] = exc

    threads = [threading.Thread(target=consume, args=(f"s{i}",)) for i in range(3)]
    for t in threads:
        t.start()
        assert wait_until(lambda t=t: progress.get(f"s{threads.index(t)}", 0) >= 3, 60)
    members = {m["name"]: m["in_flight"] for m in fleet.status()["members"]}
    assert members == {"r0": 1, "r1": 1, "r2": 1}, members  # least loaded: one stream each
    replicas[0].kill()
    assert wait_until(lambda: len(outcomes) >= 1, 30)
    ((rid, dead_error),) = outcomes.items()
    assert isinstance(dead_error, TransportError) and dead_error.member == "r0", dead_error
    assert dead_error.partial_text
    alive = dict(progress)
    assert wait_until(lambda: all(progress[r] > alive[r] for r in progress if r != rid), 30)  # the other two go on
    served = [fleet.generate(messages=CAPITAL, max_tokens=8).member for _ in range(6)]  # type: ignore[arg-type]
    assert len(served) == 6 and set(served) <= {"r1", "r2"}, served
    dead = next(m for m in fleet.status()["members"] if m["name"] == "r0")
    assert dead["failed"] >= 2 and dead["cooldowns"] >= 1, dead
    for other in progress:
        if other != rid:
            assert fleet.cancel(other)
    for t in threads:
        t.join(30)
    assert {type(e) for r, e in outcomes.items() if r != rid} == {GenerationCancelledError}
    replicas[0].start(120)  # the same port
    assert wait_until(lambda: fleet.generate(messages=CAPITAL, max_tokens=4).member == "r0", 60)  # type: ignore[arg-type]
    assert next(m for m in fleet.status()["members"] if m["name"] == "r0")["state"] == "healthy"
    fleet.close()


def test_a_request_queued_on_a_killed_replica_fails_over(
    replicas: list[LlamaServer], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A one-slot replica busy with a long stream; the fleet's next call is queued on it (the
    server's own ``requests_deferred``), then the replica is killed: nothing of a response was
    sent, so the call goes to the live member and is answered there — once."""
    single = launch_llama_server(tmp_path_factory, "single-slot", threads=1, parallel=1)
    hog = create_llm("llamacpp", "smollm2", base_url=single.url, max_retries=0)
    progress: list[int] = []
    hogged: list[BaseException] = []

    def hog_the_slot() -> None:
        try:
            for n, _ in enumerate(hog.stream(messages=STORY, max_tokens=100_000, extra=ENDLESS), 1):  # type: ignore[arg-type]
                progress.append(n)
        except BaseException as exc:
            hogged.append(exc)

    def deferred() -> float:
        for line in single.get_text("/metrics").splitlines():
            if line.startswith("llamacpp:requests_deferred"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    fleet = Fleet(
        {
            "single": create_llm("llamacpp", "smollm2", base_url=single.url, max_retries=0),
            "live": create_llm("llamacpp", "smollm2", base_url=replicas[1].url, max_retries=0),
        },
        policy="round_robin",
        max_attempts=2,
    )
    try:
        hogger = threading.Thread(target=hog_the_slot)
        hogger.start()
        assert wait_until(lambda: len(progress) >= 3, 60), single.log_tail()
        out: dict[str, Any] = {}
        caller = threading.Thread(target=lambda: out.setdefault("r", fleet.generate(messages=CAPITAL, max_tokens=8)))  # type: ignore[arg-type]
        caller.start()
        assert wait_until(lambda: deferred() >= 1, 30), "the call was never queued on the busy replica"
        single.kill()
        caller.join(60)
        result = out.get("r")
        assert isinstance(result, GenerateResult) and result.member == "live", out
        assert result.content
        hogger.join(30)
        assert hogged and isinstance(hogged[0], TransportError)  # the hog's own stream: mid-answer, typed
    finally:
        fleet.close()
        hog.close()
        single.stop()


def test_prefix_routing_serves_every_later_call_from_a_cache(replicas: list[LlamaServer]) -> None:
    """Three tenants (each its own system prompt), two users each, two turns a user, through
    ``policy="prefix"``: every call after its tenant's first finds its prompt in the serving
    replica's cache — llama-server's own ``timings.cache_n`` / ``prompt_n`` — and a tenant's
    calls stay on one replica."""
    all_idle(replicas)
    seen: set[int] = set()
    placed: dict[int, set[str | None]] = {0: set(), 1: set(), 2: set()}
    with fleet_of(replicas, policy="prefix") as fleet:
        for user in range(2):
            for tenant in range(3):
                system = f"You are the assistant of shop {tenant}. Answer in one short sentence. " * 20
                history = [{"role": "system", "content": system}]
                for turn in range(2):
                    history.append({"role": "user", "content": f"User {user}, question {turn}: when do you open?"})
                    result = fleet.generate(messages=history, max_tokens=6, temperature=0)  # type: ignore[arg-type]
                    history.append({"role": "assistant", "content": result.content})
                    placed[tenant].add(result.member)
                    usage = result.usage
                    assert usage is not None and usage.prompt_tokens
                    if tenant in seen:
                        assert (usage.cached_tokens or 0) >= 0.85 * usage.prompt_tokens, (tenant, user, turn, usage)
                    seen.add(tenant)
    assert all(len(members) == 1 for members in placed.values()), placed
