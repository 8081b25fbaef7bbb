"""A gateway a team shares: usage per key, exact and stopped answers included, limits per key
(429 + Retry-After in the route's own shape, decided before anything goes upstream), a fair
share of a busy backend's slots, and a usage store that survives a locked or full database.

Against a fake upstream on a real loopback socket (its own record of what it sent is the
evidence), the real openai-python and anthropic SDKs, and the gateway's own SQLite file."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from abstract_client.gateway.config import BackendConfig, ConfigError, GatewayConfig, load_config
from abstract_client.gateway.team.fair import FairSlots
from abstract_client.gateway.team.keys import Limits, NamedKey
from abstract_client.gateway.team.usage import UsageLog
from abstract_client.gateway.team.usage_records import UsageRecord
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway, metric_value

from .helpers import wait_until

pytestmark = pytest.mark.timeout(120)

KEYS = [NamedKey("alice", "alice-key"), NamedKey("bob", "bob-key")]


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.002) as server:
        yield server


def gateway_of(upstream: FakeOpenAIServer, tmp_path: Path, **server: Any) -> InProcessGateway:
    backend = BackendConfig(
        name="m",
        provider="openai-compatible",
        model="fake-model",
        base_url=upstream.base_url,
        max_concurrent=server.pop("max_concurrent", 4),
        reserved_slots=server.pop("reserved_slots", 0),
    )
    server.setdefault("keys", KEYS)
    server.setdefault("admin_key", "root-key")
    return InProcessGateway(GatewayConfig(backends=[backend], data_dir=str(tmp_path), **server))


def chat_client(gw: InProcessGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def usage(gw: InProcessGateway, secret: str, **params: str) -> httpx.Response:
    return httpx.get(gw.url + "/v1/usage", params=params, headers={"Authorization": f"Bearer {secret}"}, timeout=30)


def records(gw: InProcessGateway) -> list[UsageRecord]:
    log = gw.gateway.accounting.log
    log.flush()
    rows = log._db.execute("SELECT * FROM usage ORDER BY started_at").fetchall()
    names = [d[0] for d in log._db.execute("SELECT * FROM usage LIMIT 0").description]
    return [UsageRecord(**{k: v for k, v in zip(names, row, strict=True) if k != "day"}) for row in rows]


def test_every_route_is_billed_to_its_key_as_the_engine_counted_it(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    """Chat (whole and streamed), Messages, Responses (foreground and background) and embeddings:
    each request is one record under its key's name, with the upstream's own counts."""
    with gateway_of(upstream, tmp_path) as gw:
        alice, bob = chat_client(gw, "alice-key"), chat_client(gw, "bob-key")
        alice.chat.completions.create(model="m", messages=[{"role": "user", "content": "one two"}], max_tokens=7)
        stream = alice.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "one two three"}], max_tokens=9, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        claude = anthropic.Anthropic(base_url=gw.url, api_key="bob-key", max_retries=0)
        with claude.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "hello"}]) as answer:
            answer.until_done()
        bob.responses.create(model="m", input="hi there", max_output_tokens=4)
        bob.embeddings.create(model="m", input=["a b c", "d e"])
        started = bob.responses.create(model="m", input="again", max_output_tokens=6, background=True)
        assert wait_until(lambda: bob.responses.retrieve(started.id).status == "incomplete", 30)  # at its max
        assert wait_until(lambda: len(records(gw)) == 6, 10), records(gw)

        got = records(gw)
        assert [(r.key, r.route, r.outcome) for r in got] == [
            ("alice", "chat", "completed"),
            ("alice", "chat", "completed"),
            ("bob", "messages", "completed"),
            ("bob", "responses", "completed"),
            ("bob", "embeddings", "completed"),
            ("bob", "responses", "completed"),
        ]
        sent = upstream.requests()
        generated = [r.generated_tokens for r in got]
        assert generated == [7, 9, 5, 4, 0, 6]  # the upstream's own usage: max_tokens of an endless answer
        # every generation's prompt tokens are the upstream's count (words of the prompt it was sent)
        chats = [r for r in sent if r.path == "/v1/chat/completions"]
        assert len(chats) == 5
        assert all(r.prompt_tokens > 0 for r in got)
        assert all(r.total_ms is not None and r.queued_ms is not None for r in got)
        assert got[1].first_token_ms is not None and got[1].first_token_ms <= got[1].total_ms  # a stream's

        # GET /v1/usage: the admin reads every key's, a client its own; grouped by day, key, model, outcome
        every = usage(gw, "root-key").json()
        assert {(row["key"], row["outcome"]) for row in every["data"]} == {("alice", "completed"), ("bob", "completed")}
        alices = usage(gw, "alice-key").json()["data"]
        assert [(r["key"], r["requests"], r["generated_tokens"]) for r in alices] == [("alice", 2, 16)]
        assert usage(gw, "alice-key", key="alice").status_code == 200

        # Prometheus: per key and model, bounded by the configured keys
        text = httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer root-key"}).text
        prefix = "abstract_client_gateway"
        assert metric_value(text, f"{prefix}_key_tokens_total", key="alice", model="m", kind="generated") == 16
        assert metric_value(text, f"{prefix}_key_requests_total", key="bob", outcome="completed") == 4


def test_a_stopped_answer_is_billed_what_the_engine_did_and_a_refused_one_nothing(
    upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    upstream.behavior.token_delay = 0.01
    with gateway_of(upstream, tmp_path, limits={"bob": Limits(concurrent=1)}) as gw:
        body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "max_tokens": 5000, "stream": True}
        headers = {"Authorization": "Bearer bob-key"}
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
            lines = r.iter_lines()  # held: a generator let go of closes the response (the client leaves)
            seen = 0
            while seen < 20:
                seen += "tok" in next(lines)
            # a second request while the first runs: over bob's limit, refused before the upstream
            refused = httpx.post(gw.url + "/v1/chat/completions", json={**body, "stream": False}, headers=headers)
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert refused.json()["error"]["code"] == "concurrent"
            assert len(upstream.requests()) == 1
        record = upstream.requests()[0]
        upstream.wait_for_disconnect(record, timeout=10)
        assert wait_until(lambda: len(records(gw)) == 1, 10)
        (stopped,) = records(gw)
        # a refusal costs nothing and is counted per key, limit and minute (not a record each)
        refusals = gw.gateway.accounting.log._db.execute("SELECT key, reason, requests FROM refusals").fetchall()
        assert refusals == [("bob", "concurrent", 1)]
        assert stopped.outcome == "stopped" and stopped.reason == "client_disconnect"
        # billed what reached the gateway before the stop: at most what the upstream wrote, never
        # more; the frames still in the sockets when it was severed are the difference
        assert 20 <= stopped.generated_tokens <= record.tokens_sent
        rows = usage(gw, "bob-key").json()["data"]
        assert {r["outcome"] for r in rows} == {"stopped", "refused"}


def test_limits_answer_429_with_retry_after_in_the_routes_own_shape(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    limits = {"alice": Limits(requests_per_minute=2), "default": Limits(tokens_per_minute=30)}
    with gateway_of(upstream, tmp_path, limits=limits) as gw:
        alice = chat_client(gw, "alice-key")
        for _ in range(2):
            alice.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3)
        with pytest.raises(openai.RateLimitError) as over:
            alice.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3)
        assert over.value.code == "requests_per_minute"
        assert 1 <= int(over.value.response.headers["retry-after"]) <= 60
        claude = anthropic.Anthropic(base_url=gw.url, api_key="alice-key", max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as shaped:  # Anthropic's clients read only their shape
            claude.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "x"}])
        assert shaped.value.body["type"] == "error"
        assert shaped.value.body["error"]["type"] == "rate_limit_error"
        assert len(upstream.requests()) == 2  # nothing refused reached the upstream

        # bob has the default: 30 tokens a minute, reserved from max_tokens, settled to the engine's count
        bob = chat_client(gw, "bob-key")
        first = bob.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=10)
        assert first.usage is not None and first.usage.completion_tokens == 10
        bob.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=10)
        # 2 x (10 generated + 1 prompt) = 22 used, 8 left: a request asking 500 is admitted (8 reserved,
        # never more than is left) and settles to what the engine did, 501: the next is refused
        third = bob.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=500)
        assert third.usage is not None and third.usage.completion_tokens == 500
        assert wait_until(lambda: not gw.gateway.flights, 10)  # settled to what the engine did
        with pytest.raises(openai.RateLimitError) as tokens:
            bob.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert tokens.value.code == "tokens_per_minute"
        assert 1 <= int(tokens.value.response.headers["retry-after"]) <= 60
        # a background response meets the same limits, before its 200
        with pytest.raises(openai.RateLimitError):
            bob.responses.create(model="m", input="x", max_output_tokens=3, background=True)


def test_a_token_budget_holds_across_a_restart(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    limits = {"alice": Limits(token_budget=25, budget_period="day")}
    with gateway_of(upstream, tmp_path, limits=limits) as gw:
        alice = chat_client(gw, "alice-key")
        for _ in range(2):  # 2 x (12 + 1) = 26: the second crosses the budget and finishes all the same
            answer = alice.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], max_tokens=12
            )
            assert answer.choices[0].finish_reason == "length"
        assert wait_until(lambda: not gw.gateway.flights, 10)  # both accounted
        with pytest.raises(openai.RateLimitError) as spent:
            alice.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert spent.value.code == "token_budget"
        assert 1 <= int(spent.value.response.headers["retry-after"]) <= 86400  # until midnight UTC
    with gateway_of(upstream, tmp_path, limits=limits) as gw:  # the budget is read back from the database
        with pytest.raises(openai.RateLimitError):
            chat_client(gw, "alice-key").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
        chat_client(gw, "bob-key").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )


def test_usage_queries_refuse_bad_dates_and_other_keys(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    with gateway_of(upstream, tmp_path) as gw:
        for params in ({"start": "2026-13-01"}, {"end": "yesterday"}, {"start": "2026-1-7"}, {"day": "2026-12-01"}):
            bad = usage(gw, "alice-key", **params)
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_query", bad.text
        # another key's name, existing or not, is "not found" to a client key
        for name in ("bob", "nobody"):
            other = usage(gw, "alice-key", key=name)
            assert other.status_code == 404 and "error" in other.json()
        assert usage(gw, "root-key", key="bob").status_code == 200
        assert usage(gw, "root-key", start="2026-12-07", end="2026-12-01").json()["data"] == []  # an empty range
        assert usage(gw, "root-key", key="nobody").status_code == 404
        assert usage(gw, "wrong-key").status_code == 401


def test_a_busy_backends_next_slot_goes_to_the_key_using_it_least(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    """One slot, held by an endless answer of alice's; alice queues four more, then bob one short
    question; the endless one is cancelled: bob's reaches the upstream second, not sixth. A queued request whose client
    leaves never reaches it."""
    upstream.behavior.token_delay = 0.01
    with gateway_of(upstream, tmp_path, max_concurrent=1) as gw:
        slots = gw.gateway.backends["m"].slots
        numbers = itertools.count()

        def send(key: str, content: str, max_tokens: int) -> threading.Thread:
            body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
            headers = {"Authorization": f"Bearer {key}", "X-Request-Id": f"{content}-{next(numbers)}"}
            thread = threading.Thread(
                target=lambda: httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
            )
            thread.start()
            return thread

        # the slot's holder runs until it is cancelled: everything below happens while it runs
        threads: list[threading.Thread] = []
        threads.append(send("alice-key", "first", 100_000))
        assert wait_until(lambda: len(upstream.requests()) == 1, 30)
        threads += [send("alice-key", "more", 3) for _ in range(4)]
        assert wait_until(lambda: slots.waiting == 4, 30)
        # bob's first request leaves while queued (its socket closed): no slot, no upstream request
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "gone"}], "max_tokens": 3})
        leaving = socket.create_connection(("127.0.0.1", gw.port))
        leaving.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer bob-key\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        assert wait_until(lambda: slots.waiting == 5, 30)
        leaving.close()
        assert wait_until(lambda: slots.waiting == 4, 30)
        threads.append(send("bob-key", "short", 2))
        assert wait_until(lambda: slots.waiting == 5, 30)
        assert len(upstream.requests()) == 1  # still the first: the order below is the queue's
        cancel = httpx.post(gw.url + "/v1/requests/first-0/cancel", headers={"Authorization": "Bearer root-key"})
        assert cancel.status_code == 200, cancel.text
        for t in threads:
            t.join(120)
        prompts = [r.body["messages"][-1]["content"] for r in upstream.requests()]
        assert prompts == ["first", "short", "more", "more", "more", "more"], prompts
        assert wait_until(lambda: len(records(gw)) == 7, 10)
        gone = [r for r in records(gw) if r.key == "bob" and r.outcome == "stopped"]
        assert len(gone) == 1 and gone[0].generated_tokens == 0 and gone[0].prompt_tokens == 0


def test_fair_slots_rules() -> None:
    """The scheduler alone: weighted turns, first come first served when asked, a waiter that
    leaves frees its place, reserved slots kept for another key."""

    async def main() -> None:
        slots = FairSlots(1)
        order: list[str] = []

        async def take(key: str, weight: int = 1) -> None:
            await slots.acquire(key, weight)
            order.append(key)
            await asyncio.sleep(0)
            slots.release(key)

        assert slots.try_acquire("a")
        tasks = [asyncio.create_task(take("a")) for _ in range(3)] + [asyncio.create_task(take("b"))]
        await asyncio.sleep(0.01)
        slots.release("a")
        await asyncio.gather(*tasks)
        assert order == ["b", "a", "a", "a"]  # a was served last: the freed slot is b's

        fcfs = FairSlots(1, fair=False)
        order.clear()
        slots = fcfs
        assert slots.try_acquire("a")
        tasks = [asyncio.create_task(take("a")) for _ in range(3)] + [asyncio.create_task(take("b"))]
        await asyncio.sleep(0.01)
        slots.release("a")
        await asyncio.gather(*tasks)
        assert order == ["a", "a", "a", "b"]

        slots = FairSlots(1)
        assert slots.try_acquire("a")
        leaving = asyncio.create_task(slots.acquire("b"))
        staying = asyncio.create_task(slots.acquire("c"))
        await asyncio.sleep(0.01)
        leaving.cancel()
        await asyncio.sleep(0)
        assert slots.waiting == 1
        slots.release("a")
        await staying
        assert slots.held == {"c": 1} and slots.free == 0

        reserved = FairSlots(3, reserved=1)
        assert reserved.try_acquire("a") and reserved.try_acquire("a")
        assert not reserved.try_acquire("a")  # the last slot is another key's
        queued = asyncio.create_task(reserved.acquire("a"))
        await asyncio.sleep(0.01)
        assert not queued.done() and reserved.waiting == 1
        # another key's request takes the reserved slot at once, though a's waits in the queue
        await asyncio.wait_for(reserved.acquire("b"), 1)
        assert reserved.held == {"a": 2, "b": 1} and not queued.done()
        reserved.release("a")  # one free: still kept from a, which holds one
        await asyncio.sleep(0.01)
        assert not queued.done()
        reserved.release("b")  # two free: a may take one
        await asyncio.wait_for(queued, 1)
        assert reserved.held == {"a": 2}

    asyncio.run(main())


def test_the_usage_log_survives_a_locked_and_a_full_database(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="abstract_client.gateway")
    log = UsageLog(tmp_path / "usage.sqlite3")
    log._closed = True  # its writer thread stopped: the test takes every batch itself, whole
    log._wake.set()
    log._thread.join(5)
    try:

        def record(n: int) -> UsageRecord:
            return UsageRecord(time.time(), "alice", "m", "chat", f"r{n}", "completed", generated_tokens=n)

        for n in range(3):
            log.add(record(n))
        log.flush()
        assert log.written == 3 and log.dropped == 0
        # another process holds the database past the busy timeout: that batch is dropped, counted
        other = sqlite3.connect(tmp_path / "usage.sqlite3", isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        for n in range(5):
            log.add(record(n))
        log.flush()
        assert log.dropped == 5 and log.written == 3
        other.execute("ROLLBACK")
        other.close()
        log.add(record(9))
        log.flush()
        assert log.written == 4
        # a full disk (SQLite's own SQLITE_FULL): the batch is dropped, counted; nothing raises
        pages = log._db.execute("PRAGMA page_count").fetchone()[0]
        log._db.execute(f"PRAGMA max_page_count = {pages}")
        for n in range(400):
            log.add(UsageRecord(time.time(), "alice", "m", "chat", "x" * 200 + str(n), "completed"))
        log.flush()
        assert log.dropped == 405 and log.written == 4
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 2, errors
        assert "5 record(s) not written" in errors[0] and "locked" in errors[0]
        assert "400 record(s) not written" in errors[1] and "full" in errors[1] and "405 dropped" in errors[1]
        assert any("writing to" in r.getMessage() and "again" in r.getMessage() for r in caplog.records)
    finally:
        log._db.execute("PRAGMA max_page_count = 1073741823")
        log.close()


def _serve(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "abstract_client", "serve", *args, "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("tables", "said"),
    [
        ("[limits.carol]\nconcurrent = 2\n", "no key is named 'carol'"),
        ("[limits.alice]\nconcurrent = -1\n", "concurrent must be >= 0"),
        ("[limits.alice]\ntokens_per_minute = 1.5\n", "tokens_per_minute must be a whole number"),
        ("[limits.alice]\nrequests_per_hour = 5\n", "unknown limit(s) ['requests_per_hour']"),
        ('[limits.default]\nbudget_period = "year"\n', "budget_period must be one of"),
    ],
)
def test_a_bad_limits_config_is_one_line_and_exit_2(tmp_path: Path, tables: str, said: str) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[[backend]]\nname = "m"\nprovider = "vllm"\n\n[[key]]\nname = "alice"\nkey = "alice-key"\n\n' + tables
    )
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config(config)
    done = _serve(["--config", str(config)])
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr


def test_an_unwritable_usage_database_is_one_line_and_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = _serve(["-p", "vllm", "--data-dir", str(blocker / "data")])
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "usage database" in done.stderr and "cannot be written" in done.stderr


def test_the_usage_command_prints_the_table(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    with gateway_of(upstream, tmp_path) as gw:
        chat_client(gw, "alice-key").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3
        )
        assert wait_until(lambda: not gw.gateway.flights, 10)  # accounted: it ends after its last byte
        env = {**__import__("os").environ, "ROOT_KEY": "root-key", "ALICE_KEY": "alice-key"}
        command = [sys.executable, "-m", "abstract_client", "usage"]
        over_http = subprocess.run(
            [*command, "--url", gw.url, "--api-key-env", "ALICE_KEY", "--json"], capture_output=True, text=True, env=env
        )
        assert over_http.returncode == 0, over_http.stderr
        assert [(r["key"], r["generated_tokens"]) for r in json.loads(over_http.stdout)] == [("alice", 3)]
        gw.gateway.accounting.log.flush()
        table = subprocess.run([*command, "--data-dir", str(tmp_path)], capture_output=True, text=True)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == ["day", "key", "model", "outcome", "requests", "prompt", "cached", "generated"]
        assert lines[2].split()[1:] == ["alice", "m", "completed", "1", "1", "0", "3"]
        assert lines[-1].split() == ["total", "1", "1", "0", "3"]
        bad = subprocess.run(
            [*command, "--data-dir", str(tmp_path), "--start", "12/01/2026"], capture_output=True, text=True
        )
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "YYYY-MM-DD" in bad.stderr
        other = subprocess.run(
            [*command, "--url", gw.url, "--api-key-env", "ALICE_KEY", "--key", "bob"],
            capture_output=True,
            text=True,
            env=env,
        )
        assert other.returncode == 2 and "404" in other.stderr
