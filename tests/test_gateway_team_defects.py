"""The team gateway, attacked (#68): each defect found by probing it as an attacker or a careless
operator would, with the outcome it must have now. Real components: the gateway on loopback,
the real openai-python and anthropic SDKs, a real ``redis-server``, the gateway's own SQLite
file, an upstream on a real socket."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import http.server
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anthropic
import httpx
import pytest

from abstract_client.gateway.background import EVICTED, Background, BackgroundStore
from abstract_client.gateway.config import BackendConfig, ConfigError, GatewayConfig
from abstract_client.gateway.team.keys import Limits, NamedKey, hashed_name
from abstract_client.gateway.team.usage import UsageLog
from abstract_client.gateway.team.usage_records import UsageRecord
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway, metric_value

from .helpers import wait_until
from .test_gateway_hosts import RedisServer
from .test_gateway_usage_hosts import redis_fixture  # noqa: F401 (the `redis` fixture)

pytestmark = pytest.mark.timeout(120)

KEYS = [NamedKey("alice", "alice-key"), NamedKey("bob", "bob-key")]
ADMIN = {"Authorization": "Bearer root-key"}


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.001) as server:
        yield server


def gateway(base_url: str, tmp_path: Path, provider: str = "openai-compatible", **server: Any) -> InProcessGateway:
    backend = BackendConfig(name="m", provider=provider, model="fake-model", base_url=base_url)
    server.setdefault("keys", KEYS)
    server.setdefault("admin_key", "root-key")
    return InProcessGateway(GatewayConfig(backends=[backend], data_dir=str(tmp_path), **server))


def chat(gw: InProcessGateway, key: str, max_tokens: int = 2, client: httpx.Client | None = None) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens}
    return (client or httpx).post(  # type: ignore[attr-defined,no-any-return]
        gw.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def usage(gw: InProcessGateway, key: str = "root-key", **params: str) -> httpx.Response:
    return httpx.get(gw.url + "/v1/usage", params=params, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_3_per_key_series_are_the_admins_and_the_metrics_keys(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    with gateway(upstream.base_url, tmp_path, metrics_key="scrape-key") as gw:
        assert chat(gw, "bob-key").status_code == 200
        assert chat(gw, "alice-key").status_code == 200
        seen = httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer alice-key"}).text
        assert 'key="bob"' not in seen and 'key="alice"' not in seen  # not even its own: no names
        assert "abstract_client_gateway_requests_running" in seen  # the rest is there
        for key in ("root-key", "scrape-key"):
            text = httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {key}"}).text
            assert metric_value(text, "abstract_client_gateway_key_requests_total", key="bob") == 1
        # the metrics key reads /metrics and nothing else
        assert chat(gw, "scrape-key").status_code == 401
        assert usage(gw, "scrape-key").status_code == 401


def test_4_refusals_cost_the_store_a_counter_a_minute_not_a_row_each(
    upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    limits = {"alice": Limits(requests_per_minute=1)}
    with gateway(upstream.base_url, tmp_path, limits=limits) as gw:
        path = tmp_path / "usage.sqlite3"
        with httpx.Client() as client:  # one keep-alive connection, as the attacker's
            assert chat(gw, "alice-key", client=client).status_code == 200
            gw.gateway.accounting.log.flush()
            before = _wal(path) + path.stat().st_size
            for _ in range(3_000):
                assert chat(gw, "alice-key", client=client).status_code == 429
        gw.gateway.accounting.log.flush()
        grown = _wal(path) + path.stat().st_size - before
        assert grown < 100_000, grown
        db = sqlite3.connect(path)
        assert db.execute("SELECT COUNT(*) FROM usage WHERE outcome = 'refused'").fetchone()[0] == 0
        assert db.execute("SELECT SUM(requests) FROM refusals").fetchone()[0] == 3_000
        assert db.execute("SELECT COUNT(*) FROM refusals").fetchone()[0] <= 3  # a row a minute
        rows = usage(gw).json()["data"]
        assert [r["requests"] for r in rows if r["outcome"] == "refused"] == [3_000]
        text = httpx.get(gw.url + "/metrics", headers=ADMIN).text
        assert metric_value(text, "abstract_client_gateway_key_limited_total", key="alice") == 3_000


def _wal(path: Path) -> int:
    """Checkpoint the WAL into the database (it is reused, bounded by SQLite's checkpoint; what
    the database keeps is its file): 0 after it."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def test_5_count_tokens_is_inside_concurrency_and_requests_per_minute_and_recorded(
    upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    root = upstream.base_url.removesuffix("/v1")
    limits = {"alice": Limits(concurrent=1), "bob": Limits(requests_per_minute=2)}
    with gateway(root, tmp_path, provider="anthropic", limits=limits) as gw:

        def client(key: str) -> anthropic.Anthropic:
            return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)

        def count(key: str) -> int:
            return (
                client(key)
                .messages.count_tokens(model="m", messages=[{"role": "user", "content": "a b c"}])
                .input_tokens
            )

        assert count("bob-key") > 0 and count("bob-key") > 0
        with pytest.raises(anthropic.RateLimitError):
            count("bob-key")
        upstream.behavior.token_delay = 0.05
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # alice's one request, running
            running = pool.submit(
                lambda: client("alice-key").messages.create(
                    model="m", max_tokens=60, messages=[{"role": "user", "content": "x"}]
                )
            )
            assert wait_until(lambda: any(r.path == "/v1/messages" for r in upstream.records), 10)
            counts_before = sum(r.path.endswith("count_tokens") for r in upstream.records)
            with pytest.raises(anthropic.RateLimitError):
                count("alice-key")
            assert sum(r.path.endswith("count_tokens") for r in upstream.records) == counts_before  # never sent
            running.result()
        gw.gateway.accounting.log.flush()
        rows = gw.gateway.accounting.log._db.execute(
            "SELECT key, outcome, generated_tokens FROM usage WHERE route = 'count_tokens'"
        ).fetchall()
        assert rows == [("bob", "completed", 0), ("bob", "completed", 0)]


@pytest.mark.parametrize("foreign", ["1.5", "0x10", " 7", "1e3", "inf", str(2**63 - 1), "wrong type"])
def test_6_a_foreign_value_in_the_redis_usage_store_costs_only_itself(
    upstream: FakeOpenAIServer, redis: RedisServer, tmp_path: Path, foreign: str
) -> None:
    import redis as redis_py

    day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    direct = redis_py.Redis.from_url(redis.url)
    if foreign == "wrong type":
        direct.set(f"ac:usage:{day}", "not a hash")
    else:
        direct.hset(f"ac:usage:{day}", "alice\tm\tcompleted\trequests", foreign)
    with gateway(upstream.base_url, tmp_path, store=redis.url) as gw:
        log = gw.gateway.accounting.log
        answer = usage(gw)
        assert answer.status_code == 200, answer.text  # read past it
        for _ in range(2):
            assert chat(gw, "alice-key").status_code == 200
            assert chat(gw, "bob-key").status_code == 200
        assert wait_until(lambda: not gw.gateway.flights, 10)
        log.flush()
        assert log.dropped == 0 and log.written == 4  # the whole batch, the foreign value replaced
        rows = {(r["key"], r["outcome"]): r["requests"] for r in usage(gw).json()["data"]}
        assert rows[("bob", "completed")] == 2 and rows[("alice", "completed")] in (2, 3)
    direct.close()


class _OddUpstream(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible upstream whose usage numbers are whatever the test puts in ``USAGE``."""

    USAGE: ClassVar[dict[str, Any]] = {}

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "fake-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": self.USAGE,
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


def test_7_an_upstreams_usage_numbers_are_clamped_and_never_refund_or_kill_the_writer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OddUpstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    limits = {"alice": Limits(token_budget=1_000, budget_period="day")}
    try:
        with gateway(base, tmp_path, limits=limits) as gw:
            log = gw.gateway.accounting.log
            _OddUpstream.USAGE = {"prompt_tokens": 10**20, "completion_tokens": 2, "total_tokens": 10**20}
            assert chat(gw, "bob-key").status_code == 200
            _OddUpstream.USAGE = {"prompt_tokens": 1, "completion_tokens": -1_000_000, "total_tokens": 1}
            assert chat(gw, "alice-key").status_code == 200
            assert wait_until(lambda: not gw.gateway.flights, 10)
            log.flush()
            assert log.dropped == 0 and log.written == 2 and gw.gateway.accounting.clamped == 2
            rows = log._db.execute("SELECT key, prompt_tokens, generated_tokens FROM usage ORDER BY key").fetchall()
            assert rows == [("alice", 1, 0), ("bob", 10**12, 2)]
            # a negative count refunded nothing: alice's budget is what she spent
            _OddUpstream.USAGE = {"prompt_tokens": 1, "completion_tokens": 200, "total_tokens": 201}
            statuses = [chat(gw, "alice-key", 200).status_code for _ in range(8)]
            assert statuses.count(200) <= 5, statuses
            # the writer survives anything a batch meets (here, a defect of its own)
            assert wait_until(lambda: not gw.gateway.flights, 10)
            log.flush()
            broken = log.store.write

            def explode(*args: Any) -> None:
                raise RuntimeError("a defect")

            log.store.write = explode  # type: ignore[method-assign]
            assert chat(gw, "bob-key").status_code == 200
            assert wait_until(lambda: log.dropped == 1, 10)
            log.store.write = broken  # type: ignore[method-assign]
            assert chat(gw, "bob-key").status_code == 200
            assert wait_until(lambda: log.written >= 2 + statuses.count(200) + 1, 10)
            assert log._thread.is_alive()
    finally:
        server.shutdown()
    assert any("out of range" in r.getMessage() for r in caplog.records)


def test_8_a_usage_range_costs_what_the_retention_costs(
    upstream: FakeOpenAIServer, redis: RedisServer, tmp_path: Path
) -> None:
    with gateway(upstream.base_url, tmp_path, store=redis.url, usage_retention_days=30) as gw:
        assert chat(gw, "alice-key").status_code == 200
        assert wait_until(lambda: not gw.gateway.flights, 10)
        gw.gateway.accounting.log.flush()
        started = time.monotonic()
        answer = usage(gw, "alice-key", start="0001-01-01", end="9999-12-31")
        assert answer.status_code == 200 and time.monotonic() - started < 5
        assert [r["requests"] for r in answer.json()["data"]] == [1]
        assert len(gw.gateway.accounting.log.store._days("0001-01-01", "9999-12-31")) <= 32


def test_9_a_batch_a_paused_redis_applies_late_is_counted_once(
    upstream: FakeOpenAIServer, redis: RedisServer, tmp_path: Path
) -> None:
    import redis as redis_py

    with gateway(upstream.base_url, tmp_path, store=redis.url) as gw:
        log = gw.gateway.accounting.log
        assert chat(gw, "alice-key").status_code == 200  # the store knows the writer's script
        assert wait_until(lambda: log.written == 1, 10)
        sent = 1
        redis.pause()
        try:
            for _ in range(6):  # served while the store hangs: the writer's batch times out
                assert chat(gw, "alice-key").status_code == 200
                sent += 1
            assert wait_until(lambda: log.dropped >= 1, 15)
            time.sleep(1.5)
        finally:
            redis.resume()
        for _ in range(3):
            assert chat(gw, "alice-key").status_code == 200
            sent += 1
        assert wait_until(lambda: not gw.gateway.flights, 10)
        assert wait_until(lambda: log.written + log.dropped == sent and log.written == sent, 20), (
            log.written,
            log.dropped,
        )
        day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        stored = redis_py.Redis.from_url(redis.url).hget(f"ac:usage:{day}", "alice\tm\tcompleted\trequests")
        assert int(stored or 0) == log.written  # what the store holds is what is counted written
        assert usage(gw).json()["records_dropped"] == 0


def test_10_a_gateway_killed_with_9_loses_no_record(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    """40 requests in one burst, then ``kill -9`` at once (before the writer's next batch): the
    next gateway to start on the same data directory writes them from the dead one's journal,
    once; a second start writes nothing more."""
    from abstract_client.testing.gateway import GatewayProcess

    data = tmp_path / "data"
    config = tmp_path / "g.toml"
    config.write_text(
        f'[server]\ndata_dir = "{data}"\n[[backend]]\nname = "m"\nprovider = "openai-compatible"\n'
        f'model = "fake-model"\nbase_url = "{upstream.base_url}"\nmax_concurrent = 40\n'
    )
    dead = GatewayProcess.launch(["--config", str(config)], log_path=tmp_path / "dead.log")
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            answers = list(
                pool.map(lambda _: httpx.post(dead.url + "/v1/chat/completions", json=body, timeout=30), range(40))
            )
        assert all(a.status_code == 200 for a in answers)
        dead.kill()
    finally:
        dead.stop()
    db = data / "usage.sqlite3"
    before = sqlite3.connect(db).execute("SELECT COUNT(*) FROM usage").fetchone()[0]
    assert list(data.glob("usage-journal-*.jsonl"))  # what it had not written yet is there
    for _ in range(2):
        log = UsageLog(db)
        log.close()
        counted = sqlite3.connect(db).execute("SELECT COUNT(*), SUM(generated_tokens) FROM usage").fetchone()
        assert counted == (40, 120), (before, counted)
    assert not list(data.glob("usage-journal-*.jsonl"))


def _serve(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ABSTRACT_CLIENT_DATA_DIR": "/nonexistent-unused"}
    argv = [sys.executable, "-m", "abstract_client", "serve", *args, "--port", "1"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_11_a_usage_database_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    """A file that opens read-only (SQLite then takes BEGIN IMMEDIATE, and fails only when it
    writes): as a user without write permission sees it, through ``mode=ro``."""
    import abstract_client.gateway.team.usage_stores as usage_module

    data = tmp_path / "data"
    data.mkdir()
    usage_module.SQLiteUsage(data / "usage.sqlite3").close()  # a database a gateway wrote before
    real = usage_module.sqlite3.connect

    def read_only(path: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        return real(f"file:{path}?mode=ro", *args, uri=True, **kwargs)

    usage_module.sqlite3.connect = read_only  # type: ignore[assignment]
    try:
        with pytest.raises(usage_module.UsageUnwritable, match="cannot be written"):
            usage_module.SQLiteUsage(data / "usage.sqlite3")
    finally:
        usage_module.sqlite3.connect = real  # type: ignore[assignment]
    # a real file nobody may write, root included: immutable (ext4's attribute, as an
    # operator's chattr +i); `serve` refuses it in one line, exit 2
    immutable = subprocess.run(["chattr", "+i", str(data / "usage.sqlite3")], capture_output=True)
    if immutable.returncode != 0:  # a file system without the attribute: the read-only open above stands
        return
    try:
        config = tmp_path / "g.toml"
        config.write_text(
            f'[server]\ndata_dir = "{data}"\n[[backend]]\nname = "m"\nprovider = "openai-compatible"\n'
            'base_url = "http://127.0.0.1:9/v1"\n'
        )
        done = _serve(["--config", str(config)])
        assert done.returncode == 2 and "cannot be written" in done.stderr, done.stderr[-2000:]
        assert len([line for line in done.stderr.splitlines() if line.strip()]) == 1
    finally:
        subprocess.run(["chattr", "-i", str(data / "usage.sqlite3")], check=True)


def test_12_a_zero_limit_refuses_every_request(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    limits = {"alice": Limits(requests_per_minute=0), "bob": Limits(concurrent=0)}
    with gateway(upstream.base_url, tmp_path, limits=limits) as gw:
        for key, limit in (("alice-key", "requests_per_minute"), ("bob-key", "concurrent")):
            answer = chat(gw, key)
            assert answer.status_code == 429 and answer.json()["error"]["code"] == limit
    assert not upstream.records


@pytest.mark.parametrize(
    "name",
    ["alice\n", "Admin", "ANONYMOUS", "Default", "METRICS", hashed_name("other-key"), hashed_name("other-key").upper()],
)
def test_13_14_names_the_gateway_gives_are_not_a_keys_to_take(name: str) -> None:
    backend = BackendConfig(name="m", provider="openai-compatible", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError):
        GatewayConfig(backends=[backend], keys=[NamedKey(name, "k1")], api_key="other-key")


def test_13_a_client_key_never_reads_every_keys_usage_without_an_admin_key(
    upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    with gateway(upstream.base_url, tmp_path, admin_key=None, api_key="plain-key") as gw:
        assert chat(gw, "bob-key").status_code == 200
        assert chat(gw, "plain-key").status_code == 200
        assert wait_until(lambda: not gw.gateway.flights, 10)
        seen = {r["key"] for r in usage(gw, "plain-key").json()["data"]}
        assert seen == {hashed_name("plain-key")}


@pytest.mark.parametrize("days", [1_000_000, 1e300, 0])
def test_15_retention_is_bounded(days: float) -> None:
    backend = BackendConfig(name="m", provider="openai-compatible", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="usage_retention_days"):
        GatewayConfig(backends=[backend], usage_retention_days=days)


@pytest.mark.parametrize("day", ["2026-W01-1", "2026-001", "20260101", "\uff12\uff10\uff12\uff16-01-01", "2026-1-01"])
def test_16_a_day_is_yyyy_mm_dd_and_nothing_else(upstream: FakeOpenAIServer, tmp_path: Path, day: str) -> None:
    with gateway(upstream.base_url, tmp_path) as gw:
        answer = usage(gw, start=day)
        assert answer.status_code == 400 and "YYYY-MM-DD" in answer.json()["error"]["message"]


def test_17_a_broken_local_database_is_said_as_the_usage_database(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    with gateway(upstream.base_url, tmp_path) as gw:
        db = gw.gateway.accounting.log._db
        db.execute("DROP TABLE usage")  # what a corrupt file answers: an error for every read
        answer = usage(gw)
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert error["code"] == "usage_unavailable" and error["message"].startswith("the usage database")
        assert "hosts" not in error["message"]


def test_18_a_reader_of_an_evicted_response_is_told_and_holds_nothing(tmp_path: Path) -> None:
    """A reader stalled on a response the store lets go: the events are released at once (the
    reader holds one event at a time, never a copy of the rest), and the reader reads that it
    was evicted, then the end of its stream."""
    backend = BackendConfig(name="m", provider="openai-compatible", base_url="http://127.0.0.1:9/v1")
    config = GatewayConfig(backends=[backend], max_background=2, background_retention=600)

    class _Flight:
        def stop(self, reason: str) -> None:
            return

    class _Builder:
        def __init__(self, n: int) -> None:
            self.id = f"resp_{n}"

    async def run() -> None:
        store = BackgroundStore(config)
        records = []
        for n in range(3):
            record = Background(_Builder(n), _Flight(), None)  # type: ignore[arg-type]
            for _ in range(4):
                record.events.append(b"x" * 1_000_000)
            record.end()
            if n < 2:
                store.items[record.id] = record
            records.append(record)
        reader = records[0].follow(None)
        assert await reader.__anext__() == b"x" * 1_000_000
        assert store.room()  # makes room: the oldest finished one goes
        assert records[0].evicted and len(records[0].events) == 0 and not records[0].events._buffers
        rest = [chunk async for chunk in reader]
        assert rest == [EVICTED]
        assert [len(e) for e in [records[1].events[i] for i in range(4)]] == [1_000_000] * 4

    asyncio.run(run())


def test_the_usage_log_counts_refusals_into_its_batches(tmp_path: Path) -> None:
    log = UsageLog(tmp_path / "u.sqlite3")
    try:
        now = time.time()
        for _ in range(5):
            log.add_refusal(now, "alice", "m", "chat", "concurrent")
        log.add(UsageRecord(now, "alice", "m", "chat", "r1", "completed", generated_tokens=3))
        log.flush()
        assert log.written == 6
        rows = {r["outcome"]: r["requests"] for r in log.rows(key="alice")}
        assert rows == {"completed": 1, "refused": 5}
    finally:
        log.close()


def test_refusals_are_not_logged_as_warnings(
    upstream: FakeOpenAIServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="abstract_client")
    with gateway(upstream.base_url, tmp_path, limits={"alice": Limits(concurrent=0)}) as gw:
        for _ in range(3):
            assert chat(gw, "alice-key").status_code == 429
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
