"""``policy="prefix"``: a call goes where the longest opening of its prompt is cached, within a
bound on load. Placement judged on fake servers (real loopback sockets: which server received
each request) and on the rule itself (``fleet/prefix.py``); the caches' own figures are in
tests/test_fleet_real.py."""

# ruff: noqa: F811  (the tests take the fixture "servers" imported from test_fleet)
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pytest

from abstract_client import Fleet, create_llm
from abstract_client.fleet.prefix import PrefixTable, load_limit, place, prefix_blocks
from abstract_client.testing import FakeOpenAIServer
from abstract_client.types import GenerationRequest

from .helpers import wait_until
from .test_fleet import (
    fleet_of,
    members_of_a_conversation,
    servers,  # noqa: F401  (the fixture: three fake servers, shared)
)

CHAT = "/v1/chat/completions"
ASSISTANT = "You are the support assistant of a bicycle shop. " * 12  # ~150 tokens, shared by every user


def ask(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def test_users_of_one_system_prompt_share_a_member(servers: list[FakeOpenAIServer]) -> None:
    """12 users x 6 questions of one assistant: under "prefix" every call lands where the
    system prompt is cached; "affinity" (hashing the opening question too) scatters them."""

    def members_used(policy: str) -> set[str | None]:
        with fleet_of(servers, policy=policy) as fleet:
            return {
                fleet.generate(messages=ask(ASSISTANT, f"user {u}, question {q}"), max_tokens=2).member  # type: ignore[arg-type]
                for u in range(12)
                for q in range(6)
            }

    assert len(members_used("prefix")) == 1
    assert len(members_used("affinity")) == 3


def test_a_conversations_next_turn_follows_its_previous_one(servers: list[FakeOpenAIServer]) -> None:
    """Short conversations (no block of their opening is full) still stick: a block never
    spans two messages, so turn n's blocks are the first blocks of turn n+1."""
    with fleet_of(servers, policy="prefix") as fleet:
        homes = set()
        for topic in ("fox", "crow", "dog", "cat", "owl", "eel"):
            members = members_of_a_conversation(fleet, topic)
            assert len(members) == 1, (topic, members)
            homes |= members
        # "Be brief." is a prefix too: every conversation shares it, so one member holds them all
        assert len(homes) == 1
        # distinct system prompts spread (rendezvous hashing on a prompt's first block)
        spread = {
            fleet.generate(messages=ask(f"You are assistant number {i}.", "hi"), max_tokens=2).member for i in range(12)
        }  # type: ignore[arg-type]
        assert len(spread) == 3


def test_the_deepest_cache_wins_over_the_prompts_home(servers: list[FakeOpenAIServer]) -> None:
    """A conversation that spilled (its system prompt's home was busy) stays where its turns are
    cached once the home is free again: the member holding more of the prompt ranks first."""
    with fleet_of(servers, policy="prefix") as fleet:
        held = [fleet.stream(messages=ask(ASSISTANT, f"hold {i}"), max_tokens=10_000) for i in range(2)]  # type: ignore[arg-type]
        for stream in held:
            next(iter(stream))
        (home,) = {m["name"] for m in fleet.status()["members"] if m["in_flight"]}
        history = ask(ASSISTANT, "my chain keeps slipping")
        first = fleet.generate(messages=history, max_tokens=2)  # type: ignore[arg-type]
        assert first.member != home  # the home holds two: above the bound, the call spilled
        for stream in held:
            stream.close()
        assert wait_until(lambda: all(m["in_flight"] == 0 for m in fleet.status()["members"]), 10)
        for turn in range(3):
            history += [{"role": "assistant", "content": first.content}, {"role": "user", "content": f"and {turn}?"}]
            assert fleet.generate(messages=history, max_tokens=2).member == first.member  # type: ignore[arg-type]
        # a new user of the same assistant still goes home (ties: rendezvous on the first block)
        assert fleet.generate(messages=ask(ASSISTANT, "new user"), max_tokens=2).member == home  # type: ignore[arg-type]


@dataclass(eq=False)
class _Member:
    name: str
    in_flight: int = 0


def test_a_hot_prefix_spills_to_its_next_best_members_not_to_all() -> None:
    """60 calls held at once on 4 members, 60 % sharing one system prompt: no member above
    the bound (1.25 times the mean), the hot prefix on two members (the fewest that can hold it
    within the bound), the cold ones around it."""
    members = [_Member(f"m{i}") for i in range(4)]
    table = PrefixTable()
    hot: Counter[str] = Counter()
    for i in range(60):
        system = ASSISTANT if i % 5 < 3 else f"You are cold assistant {i}. " * 10
        blocks = prefix_blocks(GenerationRequest(messages=ask(system, f"q{i}"), model="m"))  # type: ignore[arg-type]
        member = place(members, blocks, table, 1.25)  # type: ignore[arg-type]
        table.record(blocks, member.name)
        member.in_flight += 1
        assert max(m.in_flight for m in members) <= math.ceil(1.25 * max(1, (i + 1) / 4))
        if i % 5 < 3:
            hot[member.name] += 1
    assert len(hot) == 2, hot
    assert max(m.in_flight for m in members) <= math.ceil(1.25 * 60 / 4)
    # a bound of 1 is strict balance; at low load a member may hold ceil(bound) calls
    assert load_limit(members, 1.0) == 16  # type: ignore[arg-type]
    assert load_limit([_Member("a"), _Member("b")], 1.25) == 2  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="load_bound"):
        Fleet([create_llm("openai-compatible", "m", base_url="http://127.0.0.1:9/v1")], policy="prefix", load_bound=0.5)


def test_the_bound_holds_on_real_sockets(servers: list[FakeOpenAIServer]) -> None:
    """The same through a fleet: 30 streams held open, 60 % one hot prompt, 3 members."""
    with fleet_of(servers, policy="prefix", load_bound=1.25) as fleet:
        held = []
        for i in range(30):
            system = ASSISTANT if i % 5 < 3 else f"You are cold assistant {i}. " * 10
            stream = fleet.stream(messages=ask(system, f"q{i}"), max_tokens=10_000)  # type: ignore[arg-type]
            next(iter(stream))
            held.append(stream)
        loads = [m["in_flight"] for m in fleet.status()["members"]]
        assert sum(loads) == 30 and max(loads) <= math.ceil(1.25 * 30 / 3), loads
        hot = Counter(
            name
            for name, s in zip(("m0", "m1", "m2"), servers, strict=True)
            for r in s.requests(CHAT)
            if r.body and r.body["messages"][0]["content"] == ASSISTANT
        )
        assert len(hot) == 2, hot  # the next-best member took the spill; the third did not
        for stream in held:
            stream.close()


def test_a_member_that_leaves_moves_only_its_prefixes_and_they_return(servers: list[FakeOpenAIServer]) -> None:
    systems = [f"You are the assistant of tenant {t}. " * 8 for t in range(9)]
    with fleet_of(servers, policy="prefix", failure_threshold=1, cooldown=0.2, probe_interval=0.1) as fleet:

        def placement() -> dict[int, str]:
            return {t: fleet.generate(messages=ask(s, "hello"), max_tokens=2).member for t, s in enumerate(systems)}  # type: ignore[arg-type]

        before = placement()
        assert len(set(before.values())) == 3  # nine tenants over three members
        gone = servers[1]
        port = gone.port
        gone.stop()
        during = placement()
        assert all(during[t] == before[t] for t in before if before[t] != "m1")  # the others stay
        assert all(during[t] != "m1" for t in before)
        revived = FakeOpenAIServer(port=port).start()
        try:
            assert wait_until(lambda: fleet.status()["members"][1]["state"] == "healthy", 10)
            assert placement() == before  # its tenants come back
        finally:
            revived.stop()


def test_hedges_go_to_the_next_best_member_and_sessions_win(servers: list[FakeOpenAIServer]) -> None:
    with fleet_of(servers, policy="prefix") as fleet:
        home = fleet.generate(messages=ask(ASSISTANT, "first"), max_tokens=2).member  # type: ignore[arg-type]
        spill = fleet.generate(messages=ask(ASSISTANT, "second"), max_tokens=2).member  # type: ignore[arg-type]
        assert spill == home
    slow_index = int(home[1:])
    servers[slow_index].behavior.prefill_delay = 5.0
    with fleet_of(servers, policy="prefix", hedge_after=0.2) as fleet:
        # a second member learns the prompt: the hedge of a later call goes there, never to the third
        blocks_on = Counter()
        for q in range(3):
            result = fleet.generate(messages=ask(ASSISTANT, f"q{q}"), max_tokens=2)  # type: ignore[arg-type]
            blocks_on[result.member] += 1
        assert len(blocks_on) == 1 and home not in blocks_on
        hedged_to = next(iter(blocks_on))
        third = ({"m0", "m1", "m2"} - {home, hedged_to}).pop()
        assert not servers[int(third[1:])].requests(CHAT)
        # embeddings keep their policy (no prompt to place by): they go least loaded
        fleet.embed(["a", "b"])
    servers[slow_index].behavior.prefill_delay = 0.0
    with fleet_of(servers, policy="prefix") as fleet:
        # session= wins over the prompt: one member for the session, whatever the prompt
        spread = {fleet.generate(messages=ask(f"system {i}", "x"), max_tokens=2).member for i in range(8)}  # type: ignore[arg-type]
        by_session = {
            fleet.generate(messages=ask(f"system {i}", "x"), session="s1", max_tokens=2).member for i in range(8)
        }  # type: ignore[arg-type]
        assert len(spread) > 1 and len(by_session) == 1


def test_behind_the_gateway_on_chat_and_messages(servers: list[FakeOpenAIServer]) -> None:
    """A ``[[backend]]`` with several base URLs and ``policy = "prefix"``: requests of one
    system prompt on the chat and the Messages routes land on one member (the one whose cache
    holds it); another system prompt may land elsewhere."""
    import httpx

    from abstract_client.gateway.config import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    urls = [s.base_url for s in servers]
    backend = BackendConfig(
        name="smol",
        provider="openai-compatible",
        model="fake-model",
        base_url=urls,
        options={"policy": "prefix", "load_bound": 1.5},
    )
    with InProcessGateway(GatewayConfig(backends=[backend])) as gw:
        fleet = gw.gateway.backends["smol"].llm
        assert isinstance(fleet, Fleet) and fleet.provider.router.load_bound == 1.5
        for i in range(4):
            chat = {"model": "smol", "messages": ask(ASSISTANT, f"chat {i}"), "max_tokens": 3}
            assert httpx.post(gw.url + "/v1/chat/completions", json=chat, timeout=30).status_code == 200
            message = {
                "model": "smol",
                "system": ASSISTANT,
                "messages": [{"role": "user", "content": f"msg {i}"}],
                "max_tokens": 3,
            }
            assert httpx.post(gw.url + "/v1/messages", json=message, timeout=30).status_code == 200
        asked = [len(s.requests(CHAT)) for s in servers]
        assert sorted(asked) == [0, 0, 8], asked
