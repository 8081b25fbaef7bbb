"""Usage across several gateway hosts (``--store redis://``): any host answers for all, a budget
spent on one host holds on the other after a restart, and a Redis that dies loses only the
records of the batches it could not take — counted exactly, said once, never a failed request.

Two in-process gateways on one real ``redis-server``, a fake upstream on a loopback socket."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from abstract_client.gateway.config import BackendConfig, GatewayConfig
from abstract_client.gateway.team.keys import Limits, NamedKey
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway

from .helpers import wait_until
from .test_gateway_hosts import RedisServer

pytestmark = pytest.mark.timeout(120)

KEYS = [NamedKey("alice", "alice-key"), NamedKey("bob", "bob-key")]


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.001) as server:
        yield server


@pytest.fixture(name="redis")
def redis_fixture(tmp_path: Path) -> Iterator[RedisServer]:
    """A real ``redis-server`` on a free loopback port, empty (the usage and limits tests')."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()


def host(upstream: FakeOpenAIServer, redis: RedisServer, tmp_path: Path, **server: object) -> InProcessGateway:
    backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=upstream.base_url)
    config = GatewayConfig(
        backends=[backend], keys=KEYS, admin_key="root-key", store=redis.url, data_dir=str(tmp_path), **server
    )
    return InProcessGateway(config)


def ask(gw: InProcessGateway, key: str, max_tokens: int) -> openai.types.chat.ChatCompletion:
    api = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)
    return api.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=max_tokens)


def settled(gw: InProcessGateway) -> None:
    """Every request of ``gw`` accounted: its client has its answer a moment before (the record
    is made as the request ends, after the last byte is sent)."""
    assert wait_until(lambda: not gw.gateway.flights, 10), list(gw.gateway.flights)


def rows(gw: InProcessGateway, key: str = "root-key") -> list[dict[str, object]]:
    gw.gateway.accounting.log.flush()
    answer = httpx.get(gw.url + "/v1/usage", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    data: list[dict[str, object]] = answer.json()["data"]
    return data


def test_any_host_answers_for_all_and_a_budget_holds_across_hosts(
    upstream: FakeOpenAIServer, redis: RedisServer, tmp_path: Path
) -> None:
    limits = {"alice": Limits(token_budget=20, budget_period="week")}
    with host(upstream, redis, tmp_path / "a", limits=limits) as a, host(upstream, redis, tmp_path / "b") as b:
        ask(a, "alice-key", 12)
        ask(a, "bob-key", 3)
        ask(b, "bob-key", 4)
        settled(a)
        settled(b)
        a.gateway.accounting.log.flush()
        seen = {(r["key"], r["requests"], r["generated_tokens"]) for r in rows(b)}
        assert seen == {("alice", 1, 12), ("bob", 2, 7)}
        assert rows(a) == rows(b)
        assert [r["key"] for r in rows(b, "bob-key")] == ["bob"]  # a client key: its own only
    # a host started now reads what alice spent this week (13 of 20) from the usage records in
    # the store, where the limits' own counts are gone (they expire a day after the period; an
    # operator's flush of them)
    import redis as redis_py

    redis_py.Redis.from_url(redis.url).delete("ac:limits:alice")
    with host(upstream, redis, tmp_path / "c", limits=limits) as c:
        ask(c, "alice-key", 6)  # 13 spent: admitted, and 13 + 7 = 20 spends the budget
        settled(c)
        with pytest.raises(openai.RateLimitError) as spent:
            ask(c, "alice-key", 1)
        assert spent.value.code == "token_budget"


def test_a_dead_store_drops_exactly_the_records_it_could_not_take(
    upstream: FakeOpenAIServer, redis: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="abstract_client.gateway")
    with host(upstream, redis, tmp_path) as gw:
        log = gw.gateway.accounting.log
        ask(gw, "alice-key", 2)
        settled(gw)
        log.flush()
        assert log.written == 1
        redis.kill()
        for _ in range(3):  # every request is served: the store is off their path
            assert ask(gw, "alice-key", 2).choices[0].finish_reason == "length"
        assert wait_until(lambda: log.dropped == 3, 15), (log.dropped, log.written)
        refused = httpx.get(gw.url + "/v1/usage", headers={"Authorization": "Bearer root-key"}, timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "store_unavailable"
        redis.restart()  # empty: what it held is gone with it
        ask(gw, "alice-key", 2)
        assert wait_until(lambda: log.written == 2, 15)
        assert log.dropped == 3
        text = httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer root-key"}).text
        assert "abstract_client_gateway_usage_records_dropped_total 3.0" in text
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "usage:" in r.getMessage()]
    assert len(errors) == 1 and "not written" in errors[0]  # once for the streak, not once a batch
    back = [r.getMessage() for r in caplog.records if "usage: writing to" in r.getMessage()]
    assert len(back) == 1 and back[0].endswith("(3 dropped since start)")


def test_a_malformed_counter_and_a_hanging_store_cost_nothing_but_their_own(
    upstream: FakeOpenAIServer, redis: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's edit (a counter that is not ours) is skipped and said once: the usage
    answer and a starting host's budgets read the rest. A Redis that hangs (SIGSTOP: the
    connection open, nothing answering, as a network that drops it silently) never costs a
    request; the batch it held is counted dropped, and written once the store applied it."""
    import datetime as dt

    import redis as redis_py

    caplog.set_level(logging.INFO, logger="abstract_client.gateway")
    day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    direct = redis_py.Redis.from_url(redis.url)
    direct.hset(f"ac:usage:{day}", mapping={"not a counter": "1", "alice\tm\tcompleted\tcomputed": "many"})
    limits = {"alice": Limits(token_budget=1000, budget_period="day")}
    with host(upstream, redis, tmp_path, limits=limits) as gw:  # the budget read past the bad fields
        ask(gw, "alice-key", 2)
        settled(gw)
        assert [(r["key"], r["generated_tokens"]) for r in rows(gw)] == [("alice", 2)]
        log = gw.gateway.accounting.log
        redis.pause()
        try:
            assert ask(gw, "alice-key", 2).choices[0].finish_reason == "length"  # served meanwhile
            assert wait_until(lambda: log.dropped == 1, 20), (log.dropped, log.written)
        finally:
            redis.resume()
        ask(gw, "alice-key", 2)
        # the batch the store held while it hung was applied when it woke: counted written, once
        assert wait_until(lambda: log.written == 3 and log.dropped == 0, 20), (log.dropped, log.written)
    warned = [r.getMessage() for r in caplog.records if "malformed counter" in r.getMessage()]
    assert len(warned) == 1
    direct.close()
