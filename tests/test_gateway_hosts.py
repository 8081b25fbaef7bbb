"""Several gateway hosts sharing one Redis (``serve --store``), as an operator runs them: two
gateway processes on separate loopback addresses behind a real nginx (round robin, no
stickiness, its config read from docs/resumable.md), a real ``redis-server`` started here, a
fake upstream on a real socket whose disconnect record is the evidence of a stop.

Each guarantee of docs/resumable.md's table: any host reads, resumes and cancels any background
response; stop records and cancels by request id cross hosts; keys hold the same everywhere; a
host killed with ``kill -9`` ends its responses ``owner_lost`` within its lease, its readers
getting everything before the death; a stale host is fenced; Redis killed is a 503 for new
background responses while foreground ones work, and it comes back without a restart;
``--workers`` uses the store, not its sockets.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess
from abstract_client.testing.processes import free_port

from .helpers import wait_until
from .network_servers import BlackholingProxy, Nginx, _binary, _end, _wait_listening

DOCS = Path(__file__).resolve().parent.parent / "docs" / "resumable.md"
LEASE = 3.0  # the hosts' lease here (the default is 5 s): a dead host is seen within it and a sweep
KEYS = {"a": "key-a", "b": "key-b", "admin": "admin-key"}


def _signal(proc: subprocess.Popen[bytes] | None, sig: int) -> None:
    assert proc is not None
    os.kill(proc.pid, sig)


class RedisServer:
    """Debian's ``redis-server`` on a free loopback port, no persistence (as the docs advise for
    tests); ``kill()`` is ``kill -9``, ``restart()`` comes back on the same port, empty."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [_binary("redis-server", "/usr/bin/redis-server"), "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.dir), "--logfile", str(self.dir / "log")]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        _wait_listening(self.port, self.proc, "redis-server", self.dir / "log")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(5)

    def restart(self) -> None:
        self.start()

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing answers (a Redis that hangs)."""
        _signal(self.proc, signal.SIGSTOP)

    def resume(self) -> None:
        _signal(self.proc, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            _end(self.proc)


class GatewayHost(GatewayProcess):
    """A gateway process bound to its own loopback address."""

    address = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @classmethod
    def on(cls, address: str, config: Path, log_path: Path, *extra: str) -> GatewayHost:
        port = free_port()
        argv = [sys.executable, "-m", "abstract_client", "serve", "--config", str(config), *extra]
        server = cls([*argv, "--host", address, "--port", str(port)], port, log_path)
        server.address = address
        server.start(60)
        return server

    def pause(self) -> None:
        """SIGSTOP: the host freezes (its lease lapses; its connections stay open)."""
        _signal(self.proc, signal.SIGSTOP)

    def resume(self) -> None:
        _signal(self.proc, signal.SIGCONT)


def round_robin(workdir: Path, hosts: list[GatewayHost]) -> Nginx:
    """nginx in front of ``hosts``, with the block docs/resumable.md gives (its upstream
    addresses replaced by the hosts')."""
    block = re.search(r"```nginx\n(upstream gateways.*?)```", DOCS.read_text(), re.S)
    assert block, "docs/resumable.md has no nginx block for several hosts"
    upstream, location = block.group(1).split("location", 1)
    for example, host in zip(re.findall(r"server (\S+);", upstream), hosts, strict=True):
        upstream = upstream.replace(example, f"{host.address}:{host.port}")
    return Nginx(workdir, None, None, location="location" + location, http_block=upstream)


def write_config(path: Path, upstream: FakeOpenAIServer, store: str) -> Path:
    path.write_text(
        f"""[server]
store = "{store}"
host_lease = {LEASE}
api_keys = ["{KEYS["a"]}", "{KEYS["b"]}"]
admin_key = "{KEYS["admin"]}"

[[backend]]
name = "fake-model"
provider = "vllm"
base_url = "{upstream.base_url}"
"""
    )
    return path


class Cluster:
    def __init__(self, redis: RedisServer, hosts: list[GatewayHost], front: Nginx) -> None:
        self.redis, self.hosts, self.front = redis, hosts, front

    @property
    def a(self) -> GatewayHost:
        return self.hosts[0]

    @property
    def b(self) -> GatewayHost:
        return self.hosts[1]


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.02, default_max_tokens=400) as server:
        yield server


@pytest.fixture
def cluster(upstream: FakeOpenAIServer, tmp_path: Path) -> Iterator[Cluster]:
    redis = RedisServer(tmp_path)
    config = write_config(tmp_path / "gateway.toml", upstream, redis.url)
    hosts: list[GatewayHost] = []
    front = None
    try:
        for n, address in enumerate(("127.0.0.2", "127.0.0.3")):
            hosts.append(GatewayHost.on(address, config, tmp_path / f"host-{n}.log"))
        front = round_robin(tmp_path, hosts)
        yield Cluster(redis, hosts, front)
    finally:
        if front is not None:
            front.stop()
        for host in hosts:
            if host.proc is not None and host.proc.poll() is None:
                host.resume()  # a test that froze it and failed before waking it
            host.stop()
        redis.stop()


def auth(key: str = "a") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[key]}"}


def start_background(url: str, max_tokens: int, key: str = "a") -> str:
    body = {"model": "fake-model", "input": "hi", "background": True, "max_output_tokens": max_tokens}
    answer = httpx.post(url + "/v1/responses", json=body, headers=auth(key), timeout=30)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def read_events(url: str, response_id: str, after: int | None = None, *, stop_after: int | None = None) -> list[Any]:
    """Events of a background response (``stop_after``: leave after that many, mid-stream)."""
    query = "?stream=true" + ("" if after is None else f"&starting_after={after}")
    events: list[Any] = []
    with httpx.stream("GET", f"{url}/v1/responses/{response_id}{query}", headers=auth(), timeout=60) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if stop_after is not None and len(events) >= stop_after:
                    break
    return events


def response(url: str, response_id: str, key: str = "a") -> httpx.Response:
    return httpx.get(f"{url}/v1/responses/{response_id}", headers=auth(key), timeout=30)


def test_any_host_reads_resumes_and_cancels_any_background_response(
    cluster: Cluster, upstream: FakeOpenAIServer
) -> None:
    """Through nginx (round robin: consecutive requests land on different hosts) and on each
    host directly: the same response, the same events, a reader cut and resumed elsewhere gets
    every event once; a cancel anywhere stops the upstream."""
    response_id = start_background(cluster.front.url, 60)
    for url in (cluster.a.url, cluster.b.url, cluster.front.url, cluster.front.url):
        assert response(url, response_id).json()["id"] == response_id
    first = read_events(cluster.a.url, response_id, stop_after=7)  # cut on one host...
    rest = read_events(cluster.b.url, response_id, after=first[-1]["sequence_number"])  # ...resumed on the other
    numbers = [e["sequence_number"] for e in first + rest]
    assert numbers == list(range(len(numbers))), numbers  # nothing lost, nothing repeated
    assert rest[-1]["type"] in ("response.completed", "response.incomplete")
    whole = read_events(cluster.front.url, response_id)
    assert whole == first + rest
    for host in cluster.hosts:
        assert response(host.url, response_id).json()["status"] == rest[-1]["response"]["status"]
    assert response(cluster.b.url, response_id, key="b").status_code == 404  # another key: not even there
    assert response(cluster.b.url, response_id, key="admin").status_code == 200

    long_id = start_background(cluster.a.url, 100_000)
    record = upstream.wait_for_request(2, timeout=15, path="/v1/chat/completions")
    assert wait_until(lambda: record.tokens_sent >= 5, 15)
    cancelled = httpx.post(f"{cluster.b.url}/v1/responses/{long_id}/cancel", headers=auth(), timeout=30)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    upstream.wait_for_disconnect(record, timeout=10)  # the engine stopped: the upstream's own record
    assert record.tokens_sent < 100_000
    events = read_events(cluster.front.url, long_id)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "response_cancelled"


def test_stop_records_and_cancels_by_request_id_reach_across_hosts(
    cluster: Cluster, upstream: FakeOpenAIServer
) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body["max_tokens"] = 100_000
    headers = {**auth(), "X-Request-Id": "cross-1"}
    with httpx.stream("POST", cluster.a.url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as s:
        lines = s.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        record = upstream.requests("/v1/chat/completions")[-1]
        # another key cannot cancel it from the other host; its owner can, and the admin could
        refused = httpx.post(cluster.b.url + "/v1/requests/cross-1/cancel", headers=auth("b"), timeout=30)
        assert refused.status_code == 404
        answer = httpx.post(cluster.b.url + "/v1/requests/cross-1/cancel", headers=auth(), timeout=30)
        assert answer.status_code == 200 and answer.json()["cancelled"] is True
        upstream.wait_for_disconnect(record, timeout=10)
    assert record.tokens_sent < 100_000

    def recorded() -> bool:
        return httpx.get(cluster.b.url + "/v1/requests/cross-1", headers=auth(), timeout=10).status_code == 200

    assert wait_until(recorded, 10), "host B never saw host A's stop record"
    stop = httpx.get(cluster.b.url + "/v1/requests/cross-1", headers=auth(), timeout=10).json()
    assert stop["reason"] == "cancel_endpoint" and stop["request_id"] == "cross-1"
    assert httpx.get(cluster.b.url + "/v1/requests/cross-1", headers=auth("b"), timeout=10).status_code == 404
    assert httpx.get(cluster.b.url + "/v1/requests/cross-1", headers=auth("admin"), timeout=10).status_code == 200
    missing = httpx.post(cluster.b.url + "/v1/requests/nobody/cancel", headers=auth(), timeout=30)
    assert missing.status_code == 404


def test_a_killed_host_ends_its_responses_owner_lost_and_its_readers_get_all_before(
    cluster: Cluster, upstream: FakeOpenAIServer
) -> None:
    """``kill -9`` of the host that runs a response, mid-stream: a reader on the other host gets
    every event made before the death, in order, then an ``error`` event (``owner_lost``) within
    the lease; a GET says ``failed``; the upstream was cut by the death itself."""
    response_id = start_background(cluster.a.url, 100_000)
    unread = start_background(cluster.a.url, 100_000)  # nobody reads it: the hosts' sweep ends it
    before = read_events(cluster.b.url, response_id, stop_after=20)
    cluster.a.kill()
    died = time.monotonic()
    rest = read_events(cluster.b.url, response_id, after=before[-1]["sequence_number"])
    learned = time.monotonic() - died
    events = before + rest
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "error" and events[-1]["code"] == "owner_lost"
    assert learned < LEASE + 8, f"the readers learned of the death {learned:.1f}s after it"
    failed = response(cluster.front.url, response_id).json()  # nginx passes a dead host's GET on
    assert failed["status"] == "failed" and failed["error"]["code"] == "owner_lost"

    def swept() -> bool:
        return bool(response(cluster.b.url, unread).json()["status"] == "failed")

    assert wait_until(swept, LEASE + 8, 0.1), response(cluster.b.url, unread).json()


def test_a_stale_host_is_fenced_and_stops_its_generation(cluster: Cluster, upstream: FakeOpenAIServer) -> None:
    """A host frozen past its lease (SIGSTOP) is taken for dead: another host ends its response
    ``owner_lost``. Woken, it cannot append a single event more (the token moved on), and it
    stops its generation: the upstream's disconnect is the evidence."""
    response_id = start_background(cluster.a.url, 100_000)
    record = upstream.wait_for_request(1, timeout=15, path="/v1/chat/completions")
    read_events(cluster.b.url, response_id, stop_after=10)
    cluster.a.pause()
    try:
        events = read_events(cluster.b.url, response_id)  # ends once B found A's lease gone
        assert events[-1]["code"] == "owner_lost"
    finally:
        cluster.a.resume()
    upstream.wait_for_disconnect(record, timeout=15)  # A, fenced, stopped its generation
    assert wait_until(lambda: "fenced by another host" in cluster.a.log_text(), 10), cluster.a.log_tail()
    after = read_events(cluster.b.url, response_id)
    assert after == events  # nothing appended after the owner_lost end


def test_redis_killed_is_a_503_for_background_responses_only_and_it_comes_back(
    cluster: Cluster, upstream: FakeOpenAIServer
) -> None:
    body = {"model": "fake-model", "input": "hi", "background": True, "max_output_tokens": 5}
    cluster.redis.pause()  # a Redis that hangs: bounded by store_timeout
    try:
        began = time.monotonic()
        refused = httpx.post(cluster.a.url + "/v1/responses", json=body, headers=auth(), timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "store_unavailable"
        assert time.monotonic() - began < 10  # store_timeout (2 s), with room for a loaded machine
    finally:
        cluster.redis.resume()
    running = start_background(cluster.a.url, 100_000)
    record = upstream.wait_for_request(1, timeout=15, path="/v1/chat/completions")
    cluster.redis.kill()
    # its owner cannot write what it makes: it stops the generation after a lease without the store
    upstream.wait_for_disconnect(record, timeout=LEASE + 10)
    assert "store is gone" in cluster.a.log_text() and running
    began = time.monotonic()
    refused = httpx.post(cluster.a.url + "/v1/responses", json=body, headers=auth(), timeout=30)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "store_unavailable"
    assert refused.headers["retry-after"] == "1"
    assert time.monotonic() - began < 10  # bounded by store_timeout (2 s), with room for a loaded machine
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    for url in (cluster.a.url, cluster.b.url, cluster.front.url):  # foreground generations never wait on it
        answer = httpx.post(url + "/v1/chat/completions", json=chat, headers=auth(), timeout=30)
        assert answer.status_code == 200, answer.text
    cluster.redis.restart()

    def works_again() -> bool:
        answer = httpx.post(cluster.b.url + "/v1/responses", json=body, headers=auth(), timeout=30)
        return answer.status_code == 200

    assert wait_until(works_again, 20, 0.5), "background responses did not come back with Redis"
    response_id = start_background(cluster.front.url, 5)
    last = read_events(cluster.front.url, response_id)[-1]
    assert last["type"] in ("response.completed", "response.incomplete"), last


def test_a_cancel_reaches_an_owner_that_writes_nothing_over_pub_sub(
    cluster: Cluster, upstream: FakeOpenAIServer
) -> None:
    """The upstream computes a long prompt before its first token: the owner has nothing to
    append, so only the message to its channel can stop it (the cancel written into the
    response is read at an append)."""
    upstream.behavior.prefill_delay = 60
    upstream.behavior.headers_before_prefill = True
    response_id = start_background(cluster.a.url, 100)
    record = upstream.wait_for_request(1, timeout=15, path="/v1/chat/completions")
    began = time.monotonic()
    cancelled = httpx.post(f"{cluster.b.url}/v1/responses/{response_id}/cancel", headers=auth(), timeout=30)
    assert cancelled.json()["status"] == "cancelled"
    upstream.wait_for_disconnect(record, timeout=10)
    assert time.monotonic() - began < 10


def test_workers_of_one_host_share_the_store_not_their_sockets(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)
    config = write_config(tmp_path / "gateway.toml", upstream, redis.url)
    host = GatewayHost.on("127.0.0.1", config, tmp_path / "host.log", "--workers", "2")
    try:
        response_id = start_background(host.url, 100_000)
        assert not re.match(r"resp_w\d+_", response_id)  # no worker in the id: the store knows the owner
        for _ in range(8):  # the kernel spreads these over both workers
            answer = response(host.url, response_id)
            assert answer.status_code == 200 and "x-abstract-client-relayed-from" not in answer.headers
        record = upstream.wait_for_request(1, timeout=15, path="/v1/chat/completions")
        cancelled = httpx.post(f"{host.url}/v1/responses/{response_id}/cancel", headers=auth(), timeout=30)
        assert cancelled.json()["status"] == "cancelled"
        upstream.wait_for_disconnect(record, timeout=10)
    finally:
        host.stop()
        redis.stop()


def test_a_bad_store_url_is_refused_at_start(tmp_path: Path, upstream: FakeOpenAIServer) -> None:
    config = write_config(tmp_path / "gateway.toml", upstream, "http://127.0.0.1:1/0")
    argv = [sys.executable, "-m", "abstract_client", "serve", "--config", str(config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "store must be a redis://" in done.stderr


# -- the store's own rules, on the real Redis (hosts.py) -------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RedisServer]:
    redis = RedisServer(tmp_path)
    yield redis
    redis.stop()


def _hosts(url: str) -> Any:
    from abstract_client.gateway.config import BackendConfig, GatewayConfig
    from abstract_client.gateway.hosts.store import Hosts

    backend = BackendConfig(name="m", provider="vllm", base_url="http://127.0.0.1:1")
    return Hosts(GatewayConfig(backends=[backend], store=url, host_lease=LEASE, store_timeout=1.0))


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the gateway runs on asyncio (uvicorn)
async def test_an_append_is_idempotent_fenced_and_carries_a_cancel(store: RedisServer) -> None:
    owner, other = _hosts(store.url), _hosts(store.url)
    await owner.start()
    try:
        token = await owner.create("resp_x", "key", {"status": "queued", "id": "resp_x"})
        assert await owner.append("resp_x", token, 0, [b"e0", b"e1"], size=4) == 0
        # a retried append (its answer was lost) never repeats an event
        assert await owner.append("resp_x", token, 0, [b"e0", b"e1", b"e2"], size=6) == 0
        assert await owner.append("resp_x", "999", 3, [b"e3"], size=8) == -1  # another token: fenced
        await other.ask_cancel("resp_x", owner.id)  # written into the response...
        assert await owner.append("resp_x", token, 3, [b"e3"], size=8) == 1  # ...read at the next append
        meta = await other.meta("resp_x")
        assert meta is not None and meta["next"] == "4"
        # the owner is alive: nobody may end its response
        assert not await other.end_owner_lost("resp_x", meta)
        await owner.redis.delete(f"ac:host:{owner.id}")  # its lease lapsed
        assert await other.end_owner_lost("resp_x", meta)
        assert not await other.end_owner_lost("resp_x", meta)  # once, whoever asks
        assert await owner.append("resp_x", token, 4, [b"e4"], size=10) == -1  # the stale writer
        events = [e async for e in other.events("resp_x", None)]
        assert events[:4] == [b"e0", b"e1", b"e2", b"e3"] and len(events) == 5
        assert b'"code": "owner_lost"' in events[4] and b'"sequence_number": 4}' in events[4]
    finally:
        await owner.aclose()
        await other.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_store_that_hangs_is_unavailable_within_its_timeout(store: RedisServer) -> None:
    from abstract_client.gateway.hosts.store import StoreUnavailable

    hosts = _hosts(store.url)
    await hosts.start()
    store.pause()
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await hosts.create("resp_y", None, {"status": "queued"})
        assert time.monotonic() - began < 5
    finally:
        store.resume()
        await hosts.aclose()


def test_a_lost_cancel_message_still_stops_the_owner_at_its_next_token(
    cluster: Cluster, upstream: FakeOpenAIServer
) -> None:
    """Redis pub/sub delivers at most once: a cancel whose message never reached the owner (sent
    here to a host that does not exist) is read from the response at the owner's next append."""
    import asyncio

    response_id = start_background(cluster.a.url, 100_000)
    record = upstream.wait_for_request(1, timeout=15, path="/v1/chat/completions")
    assert wait_until(lambda: record.tokens_sent >= 5, 15)

    async def lost_message() -> None:
        hosts = _hosts(cluster.redis.url)
        try:
            await hosts.ask_cancel(response_id, "h-nobody")
        finally:
            await hosts.aclose()

    asyncio.run(lost_message())
    upstream.wait_for_disconnect(record, timeout=10)
    assert read_events(cluster.b.url, response_id)[-1]["code"] == "response_cancelled"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_host_that_creates_a_response_holds_a_lease_even_after_a_store_restart(store: RedisServer) -> None:
    """A store restarted empty has no lease at all; the host that creates a response takes its
    lease with it, so no sweep can take the response for a dead host's before the lease loop
    comes round (found by the restart test above, once)."""
    owner, other = _hosts(store.url), _hosts(store.url)  # no lease loops: only create() takes one
    try:
        await owner.redis.flushall()  # the restart
        await owner.create("resp_z", None, {"status": "queued", "id": "resp_z"})
        await other.sweep()
        meta = await other.meta("resp_z")
        assert meta is not None and meta["status"] == "queued"
    finally:
        await owner.aclose()
        await other.aclose()


# -- faults an operator meets (docs/resumable.md "Faults") ------------------------------------------


def test_a_store_outage_longer_than_the_lease_ends_the_response_failed_on_every_host(
    cluster: Cluster, upstream: FakeOpenAIServer
) -> None:
    """Redis hangs for longer than a lease: the owner stops the generation (nobody can read it)
    and, once the store answers again, writes its end (``failed``, ``store_lost``) for every
    reader on every host. Host B is frozen meanwhile, so that no other host's sweep can end the
    response for the owner: only the owner's own write can."""
    import redis as redis_py

    response_id = start_background(cluster.a.url, 100_000)
    record = upstream.wait_for_request(1, timeout=15, path="/v1/chat/completions")
    read_events(cluster.b.url, response_id, stop_after=5)
    store = redis_py.Redis.from_url(cluster.redis.url)
    cluster.b.pause()
    try:
        cluster.redis.pause()
        try:
            upstream.wait_for_disconnect(record, timeout=LEASE + 15)  # the owner stopped it
        finally:
            cluster.redis.resume()
        status = lambda: store.hget(f"ac:resp:{response_id}", "status")  # noqa: E731
        assert wait_until(lambda: status() == b"failed", 20), f"still {status()!r} after the store came back"
    finally:
        cluster.b.resume()
    for url in (cluster.b.url, cluster.a.url):
        last = read_events(url, response_id)[-1]
        assert last["type"] == "response.failed" and last["response"]["error"]["code"] == "store_lost", last
        assert response(url, response_id).json()["status"] == "failed"
    assert not store.sismember("ac:running", response_id)
    began = time.monotonic()
    cancelled = httpx.post(f"{cluster.b.url}/v1/responses/{response_id}/cancel", headers=auth(), timeout=30)
    assert cancelled.json()["status"] == "failed" and time.monotonic() - began < 5
    assert "the store is gone" in cluster.a.log_text()


def _lapses(hosts: list[Any], seconds: float) -> Any:
    """Watch the hosts' leases for ``seconds``: how many looks found one gone."""
    import asyncio

    async def watch() -> int:
        gone = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for host in hosts:
                gone += not await host.redis.exists(f"ac:host:{host.id}")
            await asyncio.sleep(0.2)
        return gone

    return watch()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_malformed_record_is_skipped_and_logged_and_every_lease_is_renewed(
    store: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A hash without its ``host`` field in the running set ended the loop that renews the lease,
    on every host at once, for good. Now it is said once and skipped; the lease is renewed, and
    a dead host's response beside it is still swept."""
    caplog.set_level("WARNING", "abstract_client.gateway")
    owner, dead = _hosts(store.url), _hosts(store.url)
    await owner.start()
    try:
        await owner.redis.hset("ac:resp:bad", mapping={"status": "in_progress", "token": "1"})
        fields = {"host": owner.id, "token": "1", "status": "in_progress", "next": "0", "snapshot": "{}"}
        await owner.redis.hset("ac:resp:noowner", mapping=fields)  # no owner: a 500 once
        await owner.redis.sadd("ac:running", "bad", "noowner")
        # a dead host's record whose snapshot is not JSON: skipped too, the sweep goes on past it
        await owner.redis.hset("ac:resp:badjson", mapping={**fields, "host": "h-gone", "owner": "", "snapshot": "{"})
        await owner.redis.sadd("ac:running", "badjson")
        await dead.create("resp_dead", None, {"status": "in_progress", "id": "resp_dead"})
        await dead.redis.delete(f"ac:host:{dead.id}")  # its host died (its loops never ran)
        assert await _lapses([owner], 2 * LEASE) == 0
        meta = await owner.meta("resp_dead")
        assert meta is not None and meta["status"] == "failed"  # swept: owner_lost
        assert await owner.meta("noowner") is None and await owner.meta("bad") is None
        said = [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]
        assert sorted(m.split()[4] for m in said) == ["bad", "badjson", "noowner"], said  # once each
        assert await owner.redis.sismember("ac:running", "bad")  # skipped, not dropped: another version's
    finally:
        await owner.aclose()
        await dead.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_loop_that_fails_is_started_again(store: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    hosts = _hosts(store.url)
    calls: list[float] = []
    sweep = hosts.sweep

    async def fails_once() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("a bug the sweep met")
        await sweep()

    hosts.sweep = fails_once
    await hosts.start()
    try:
        for _ in range(100):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.1)
        assert len(calls) >= 2, "the sweep's loop was not started again"
        assert any("the sweep loop failed; starting it again" in r.getMessage() for r in caplog.records)
    finally:
        await hosts.aclose()


async def fill_running(redis: Any, n: int, host: str) -> None:
    """``n`` running responses of ``host`` in the store (``many_0`` ...), in one pipeline."""
    fields = {"owner": "", "host": host, "token": "1", "status": "in_progress", "next": "0", "snapshot": "{}"}
    pipe = redis.pipeline(transaction=False)
    for i in range(n):
        pipe.hset(f"ac:resp:many_{i}", mapping=fields)
        pipe.sadd("ac:running", f"many_{i}")
    await pipe.execute()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_large_running_set_never_delays_a_lease_nor_ends_a_live_response(store: RedisServer) -> None:
    """20,000 running entries of a live host: the sweep reads them in batches, off the lease's
    loop; no lease lapses, no live response is ended ``owner_lost``."""
    owner, live = _hosts(store.url), _hosts(store.url)
    await owner.start()
    await live.start()
    try:
        await live.create("resp_live", None, {"status": "in_progress", "id": "resp_live"})
        await fill_running(owner.redis, 20_000, live.id)
        began = time.monotonic()
        await owner.sweep()
        took = time.monotonic() - began
        assert took < 10 * LEASE, f"a sweep of 20,000 entries took {took:.1f}s"  # once: 4.4 s beside a build
        assert await _lapses([owner, live], 2 * LEASE) == 0
        meta = await owner.meta("resp_live")
        assert meta is not None and meta["status"] == "in_progress"
        assert await owner.redis.scard("ac:running") == 20_001
    finally:
        await owner.aclose()
        await live.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_sweep_slower_than_a_lease_never_lapses_it(store: RedisServer) -> None:
    """A sweep that takes two leases (a huge running set, a slow store): the lease is renewed on
    a loop of its own meanwhile, so it never lapses. (Timing-free: the sweep is made slow here,
    where the 20,000-entry test depends on how fast the machine sweeps.)"""
    import asyncio

    host = _hosts(store.url)

    async def slow_sweep() -> None:
        await asyncio.sleep(2 * LEASE)

    host.sweep = slow_sweep  # type: ignore[method-assign]
    await host.start()
    try:
        assert await _lapses([host], 2 * LEASE) == 0
    finally:
        await host.aclose()


def test_a_listener_whose_connection_the_network_dropped_silently_resubscribes(
    upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    """Host A reaches Redis through a relay that goes silent (a NAT forgetting the connection):
    A's subscriber hears nothing, for ever, unless it notices. A cancel by request id sent to
    host B must still reach A's generation (the upstream's disconnect record)."""
    redis = RedisServer(tmp_path)
    proxy = BlackholingProxy(redis.port)
    hosts: list[GatewayHost] = []
    try:
        a_config = write_config(tmp_path / "a.toml", upstream, proxy.url())
        hosts.append(GatewayHost.on("127.0.0.2", a_config, tmp_path / "a.log"))
        b_config = write_config(tmp_path / "b.toml", upstream, redis.url)
        hosts.append(GatewayHost.on("127.0.0.3", b_config, tmp_path / "b.log"))
        a, b = hosts
        assert wait_until(lambda: "store: reachable" in a.log_text(), 15), a.log_tail()
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        body["max_tokens"] = 100_000
        headers = {**auth(), "X-Request-Id": "deaf-1"}
        with httpx.stream("POST", a.url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as s:
            lines = s.iter_lines()  # held: a dropped iterator closes the response (a client that left)
            assert next(line for line in lines if line.startswith("data: {"))
            record = upstream.requests("/v1/chat/completions")[-1]
            proxy.blackhole()
            began = time.monotonic()
            while record.disconnected_at is None and time.monotonic() - began < 30:
                answer = httpx.post(b.url + "/v1/requests/deaf-1/cancel", headers=auth(), timeout=30)
                if answer.status_code == 200:
                    break
                time.sleep(1)
            upstream.wait_for_disconnect(record, timeout=10)
            assert record.tokens_sent < 100_000
        assert time.monotonic() - began < 40
        # the upstream sees the sever first (the stop's TELL step); A logs its stop record after
        stopped = "stopped deaf-1 backend=fake-model reason=cancel_endpoint"
        assert wait_until(lambda: stopped in a.log_text(), 10), a.log_tail()
        assert "the listener lost its connection" in a.log_text()
    finally:
        for host in hosts:
            host.stop()
        proxy.close()
        redis.stop()
