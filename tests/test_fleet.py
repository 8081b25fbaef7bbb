"""Fleet on protocol-faithful fake servers (real loopback sockets): routing, failover before the
first byte only, health that a stop never moves, hedging whose loser is stopped — each judged by
the servers' own records (requests received, disconnect timestamps, tokens written)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from abstract_client import (
    Fleet,
    GenerationCancelledError,
    InvalidRequestError,
    ServerUnavailableError,
    Timeout,
    TransportError,
    create_llm,
)
from abstract_client.fleet import counts_against, may_fail_over
from abstract_client.testing import FakeOpenAIServer

from .helpers import needs_mlx, wait_until

CHAT = "/v1/chat/completions"


@pytest.fixture
def servers() -> Iterator[list[FakeOpenAIServer]]:
    started = [FakeOpenAIServer().start() for _ in range(3)]
    yield started
    for s in started:
        s.stop()


def fleet_of(servers: list[FakeOpenAIServer], **options: object) -> Fleet:
    members = {
        f"m{i}": create_llm("openai-compatible", "fake-model", base_url=s.base_url) for i, s in enumerate(servers)
    }
    return Fleet(members, **options)  # type: ignore[arg-type]


def chats(server: FakeOpenAIServer) -> int:
    return len(server.requests(CHAT))


def test_round_robin_weighted_and_least_loaded(servers: list[FakeOpenAIServer]) -> None:
    with fleet_of(servers, policy="round_robin") as fleet:
        served = [fleet.generate("hi", max_tokens=2).member for _ in range(6)]
        assert Counter(served) == {"m0": 2, "m1": 2, "m2": 2}
    with fleet_of(servers, policy="weighted", weights=[3, 1, 1]) as fleet:
        served = [fleet.generate("hi", max_tokens=2).member for _ in range(10)]
        assert Counter(served) == {"m0": 6, "m1": 2, "m2": 2}
        assert served[:5].count("m0") == 3  # interleaved, not in a burst
    with fleet_of(servers, policy="least_loaded") as fleet:  # two long streams held, the third call goes free
        held = [fleet.stream("long", max_tokens=500) for _ in range(2)]
        for stream in held:
            next(iter(stream))
        busy = {m["name"] for m in fleet.status()["members"] if m["in_flight"]}
        assert len(busy) == 2
        assert fleet.generate("hi", max_tokens=2).member not in busy
        for stream in held:
            stream.close()


def members_of_a_conversation(fleet: Fleet, topic: str, turns: int = 4) -> set[str | None]:
    """The members that served the turns of a short conversation (system prompt "Be brief.")."""
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"a story about a {topic}"},
    ]
    members = set()
    for turn in range(turns):
        result = fleet.generate(messages=history, max_tokens=2)  # type: ignore[arg-type]
        members.add(result.member)
        history += [{"role": "assistant", "content": result.content}, {"role": "user", "content": f"more {turn}"}]
    return members


def test_affinity_keeps_a_conversation_on_one_member(servers: list[FakeOpenAIServer]) -> None:
    with fleet_of(servers, policy="affinity") as fleet:
        for topic in ("fox", "crow", "dog", "cat"):
            members = members_of_a_conversation(fleet, topic)
            assert len(members) == 1, (topic, members)
        by_session = {fleet.generate(f"turn {i}", session="s-1", max_tokens=2).member for i in range(4)}
        assert len(by_session) == 1
        # the session key is the fleet's: never sent to the server
        assert all("session" not in (r.body or {}) for s in servers for r in s.requests(CHAT))


def test_failover_before_the_first_byte(servers: list[FakeOpenAIServer]) -> None:
    a, b, _ = servers
    with fleet_of(servers, policy="round_robin", max_attempts=3) as fleet:
        a.stop()  # connection refused
        b.behavior.fault = "loading_503"
        for _ in range(3):
            result = fleet.generate("hi", max_tokens=2)
            assert result.member == "m2" and result.content
        status = {m["name"]: m for m in fleet.status()["members"]}
        assert status["m0"]["failed"] >= 1 and status["m1"]["failed"] >= 1 and status["m2"]["failed"] == 0
        # three failures in the window: m1 cools down, and while it does no call reaches it
        while fleet.status()["members"][1]["state"] == "healthy":
            assert fleet.generate("hi", max_tokens=2).member == "m2"
        asked = chats(b)
        for _ in range(10):
            assert fleet.generate("hi", max_tokens=2).member == "m2"
        assert chats(b) == asked
        # with one attempt only, the member's own error comes back, typed, naming the member
        single = fleet_of([b], max_attempts=1)
        with pytest.raises(ServerUnavailableError) as info:
            single.generate("hi", max_tokens=2)
        assert info.value.member == "m0"
        single.close()


def test_a_member_dying_mid_answer_is_a_typed_error_never_a_replay(servers: list[FakeOpenAIServer]) -> None:
    for s in servers:
        s.behavior.fault, s.behavior.fail_after_tokens = "drop", 3
    with fleet_of(servers, max_attempts=3) as fleet:
        with pytest.raises(TransportError) as info:
            fleet.generate("hi", max_tokens=50)
        err = info.value
        assert err.partial_text and err.member in {"m0", "m1", "m2"}
        assert sum(chats(s) for s in servers) == 1  # no other member was asked


def test_the_callers_stops_never_count_against_a_member(servers: list[FakeOpenAIServer]) -> None:
    """200 stops across the fleet (LiteLLM cools healthy deployments down for callers hanging up):
    every member stays healthy, nothing counted as failed, every server saw its disconnect."""
    with fleet_of(servers, failure_threshold=1) as fleet:
        for i in range(200):
            event = threading.Event()
            with pytest.raises(GenerationCancelledError):
                for n, _ in enumerate(fleet.stream("long", max_tokens=10_000, cancel_event=event), 1):
                    if n == 1 + i % 3:
                        event.set()
        # a stopped attempt leaves in_flight at once; it is counted stopped once its stream unwound
        assert wait_until(lambda: sum(m["stopped"] for m in fleet.status()["members"]) == 200, 10)
        status = fleet.status()["members"]
        assert all(m["in_flight"] == 0 for m in status), status
        assert all(m["state"] == "healthy" and m["failed"] == 0 and m["cooldowns"] == 0 for m in status), status
        records = [r for s in servers for r in s.requests(CHAT)]
        assert len(records) == 200
        assert wait_until(lambda: all(r.disconnected_at is not None for r in records), 10)


def test_request_errors_and_deadlines_are_not_the_members_failures(servers: list[FakeOpenAIServer]) -> None:
    a = servers[0]
    a.behavior.fault = "status_400"
    with fleet_of([a], failure_threshold=1) as fleet:
        for _ in range(3):
            with pytest.raises(InvalidRequestError):
                fleet.generate("hi", max_tokens=2)
        a.behavior.fault = None
        a.behavior.prefill_delay = 5
        for _ in range(3):
            with pytest.raises(Exception) as info:
                fleet.generate("hi", max_tokens=2, timeout=0.2)
            assert type(info.value).__name__ == "GenerationTimeoutError"
        (m,) = fleet.status()["members"]
        assert m["failed"] == 0 and m["state"] == "healthy", m


def test_cooldown_then_a_readiness_probe_then_back(servers: list[FakeOpenAIServer]) -> None:
    a, b, _ = servers
    port = a.port
    with fleet_of([a, b], policy="round_robin", failure_threshold=2, cooldown=0.3) as fleet:
        a.stop()
        for _ in range(6):
            assert fleet.generate("hi", max_tokens=2).member == "m1"
        assert fleet.status()["members"][0]["state"] in ("cooldown", "probe")
        revived = FakeOpenAIServer(port=port).start()
        try:
            assert wait_until(lambda: fleet.generate("hi", max_tokens=2).member == "m0", 10)
            assert revived.requests("/v1/models") or revived.requests("/health")  # probed, not a generation first
            assert fleet.status()["members"][0]["state"] == "healthy"
        finally:
            revived.stop()


def test_hedging_the_first_chunk_wins_and_the_loser_is_stopped(servers: list[FakeOpenAIServer]) -> None:
    slow, fast, _ = servers
    slow.behavior.prefill_delay = 5.0
    with fleet_of([slow, fast], policy="round_robin", hedge_after=0.2) as fleet:
        for _ in range(4):
            t0 = time.perf_counter()
            result = fleet.generate("hi", max_tokens=3)
            assert result.member == "m1" and result.content
            assert time.perf_counter() - t0 < 3  # not the slow member's 5 s
        status = fleet.status()
        assert status["hedges_won"] >= 2 and status["hedges_won"] == status["hedges_sent"]
        losers = slow.requests(CHAT)
        assert losers and wait_until(lambda: all(r.disconnected_at is not None for r in losers), 10)
        assert all(r.tokens_sent == 0 for r in losers)  # stopped before it wrote a token
        assert all(m["failed"] == 0 for m in status["members"])  # losing is not failing


def test_a_stop_during_the_hedge_race_stops_both(servers: list[FakeOpenAIServer]) -> None:
    a, b, _ = servers
    a.behavior.prefill_delay = b.behavior.prefill_delay = 10.0
    with fleet_of([a, b], hedge_after=0.1) as fleet:
        event = threading.Event()

        def stop_once_both_asked() -> None:  # the hedge is out: both members hold the request
            wait_until(lambda: len(a.requests(CHAT)) + len(b.requests(CHAT)) == 2, 30)
            event.set()

        threading.Thread(target=stop_once_both_asked).start()
        with pytest.raises(GenerationCancelledError):
            fleet.generate("hi", max_tokens=3, cancel_event=event)
        records = a.requests(CHAT) + b.requests(CHAT)
        assert len(records) == 2
        assert wait_until(lambda: all(r.disconnected_at is not None for r in records), 10)
        assert all(m["failed"] == 0 for m in fleet.status()["members"])


def test_cancel_by_request_id_reaches_the_member(servers: list[FakeOpenAIServer]) -> None:
    with fleet_of(servers) as fleet:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                for _ in fleet.stream("long", max_tokens=10_000, request_id="fleet-1"):
                    pass
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        assert wait_until(lambda: any(s.requests(CHAT) and s.last.tokens_sent > 2 for s in servers), 10)
        assert fleet.cancel("fleet-1")
        thread.join(10)
        assert [type(e) for e in errors] == [GenerationCancelledError]
        (record,) = [r for s in servers for r in s.requests(CHAT)]
        assert wait_until(lambda: record.disconnected_at is not None, 10)


async def test_async_stream_hedged_and_embed(servers: list[FakeOpenAIServer], anyio_backend: str) -> None:
    """asyncio and trio: the hedge race runs in a task group, the winner streams on in the caller's task."""
    servers[0].behavior.prefill_delay = 5.0
    fleet = fleet_of(servers[:2], policy="round_robin", hedge_after=0.1)
    for _ in range(2):
        async with fleet.astream("hi", max_tokens=20) as stream:
            chunks = [c async for c in stream]
        assert "".join(c.delta for c in chunks) and stream.result().member == "m1"
    result = await fleet.aembed(["a", "b"])
    assert len(result.vectors) == 2
    with anyio.fail_after(10):
        await fleet.aclose()


def test_errors_are_classified_for_health_and_failover() -> None:
    from abstract_client.errors import (
        ContextOverflowError,
        GenerationTimeoutError,
        ProviderAPIError,
        RateLimitError,
    )

    assert counts_against(ServerUnavailableError("x")) and may_fail_over(ServerUnavailableError("x"))
    assert counts_against(TransportError("x")) and not may_fail_over(TransportError("x"))
    assert counts_against(ProviderAPIError("x", status=500)) and not may_fail_over(ProviderAPIError("x", status=500))
    assert may_fail_over(ProviderAPIError("x", status=502)) and may_fail_over(ProviderAPIError("x", status=504))
    assert not counts_against(RateLimitError("x")) and may_fail_over(RateLimitError("x"))
    for err in (
        GenerationCancelledError("x", reason="user"),
        GenerationTimeoutError("x", kind="total"),
        InvalidRequestError("x", status=400),
        ContextOverflowError("x"),
    ):
        assert not counts_against(err) and not may_fail_over(err), err
    assert counts_against(GenerationTimeoutError("x", kind="connect"))


def test_a_base_url_list_is_a_fleet(servers: list[FakeOpenAIServer]) -> None:
    fleet = create_llm("openai-compatible", "fake-model", base_url=[s.base_url for s in servers], policy="round_robin")
    assert isinstance(fleet, Fleet) and len(fleet.members) == 3
    assert {fleet.generate("hi", max_tokens=2).member for _ in range(3)} == {s.base_url for s in servers}
    fleet.close()


def test_the_gateway_serves_a_fleet_and_reports_its_members(servers: list[FakeOpenAIServer]) -> None:
    """A ``[[backend]]`` with several base URLs is one model served by a Fleet: a client's
    disconnect stops the member (its server sees it) and is counted as a stop, not a failure;
    ``/metrics`` carries every member's state."""
    import httpx

    from abstract_client.gateway.config import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    urls = [s.base_url for s in servers]
    config = GatewayConfig(
        backends=[BackendConfig(name="smol", provider="openai-compatible", model="fake-model", base_url=urls)]
    )
    with InProcessGateway(config) as gw:
        fleet = gw.gateway.backends["smol"].llm
        assert isinstance(fleet, Fleet)
        answers = [
            httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                timeout=30,
            )
            for _ in range(3)
        ]
        assert all(a.status_code == 200 and a.json()["choices"][0]["message"]["content"] for a in answers)
        body = {
            "model": "smol",
            "messages": [{"role": "user", "content": "long"}],
            "max_tokens": 10_000,
            "stream": True,
        }
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as response:
            for n, _ in enumerate(response.iter_lines(), 1):
                if n == 4:
                    break
        streamed = max((r for s in servers for r in s.requests(CHAT)), key=lambda r: r.received_at)
        assert wait_until(lambda: streamed.disconnected_at is not None, 10)
        assert wait_until(lambda: sum(m["stopped"] for m in fleet.status()["members"]) == 1, 10)
        metrics = httpx.get(gw.url + "/metrics", timeout=10).text
        for url in urls:
            assert f'abstract_client_gateway_fleet_member_healthy{{backend="smol",member="{url}"}} 1.0' in metrics
        assert "abstract_client_gateway_fleet_member_failed_total" in metrics
        assert all(m["failed"] == 0 for m in fleet.status()["members"])


class SeveredProvider:
    """A member whose stream, once its stop is set, fails the way a severed connection does
    (``TransportError``) before any cancellation reaches it: the race a real socket can lose."""

    @staticmethod
    def make() -> object:
        from abstract_client.provider import Provider
        from abstract_client.types import StreamChunk

        class _Severed(Provider):
            name = "severed"
            complete_over_stream = True
            plain_route = False

            async def _chunks(self, ctx: object) -> object:
                token = ctx.token  # type: ignore[attr-defined]
                for i in range(10_000):
                    with anyio.CancelScope(shield=True):  # the read wakes on the sever, not the cancel
                        await anyio.sleep(0.005)
                    if token.is_set:
                        raise TransportError("connection lost: ReadError")
                    yield StreamChunk(delta=f"t{i} ")

            def stream(self, request: object, ctx: object) -> object:  # type: ignore[override]
                return self._chunks(ctx)

        return _Severed(model="m")


def test_an_error_surfacing_from_a_stopped_member_is_not_its_failure() -> None:
    from abstract_client import LLM

    members = {f"s{i}": LLM(SeveredProvider.make()) for i in range(2)}  # type: ignore[arg-type]
    with Fleet(members, failure_threshold=1) as fleet:
        for i in range(20):
            # stopped from another thread while the caller waits for the next chunk (the read in
            # flight); the timer starts at the first chunk, when a member holds the call (one
            # started before could fire before the call was admitted: then no member had it)
            event = threading.Event()
            timer = threading.Timer(0.003 * i, event.set)
            with pytest.raises(GenerationCancelledError):
                for n, _ in enumerate(fleet.stream("hi", cancel_event=event)):
                    if n == 0:
                        timer.start()
            timer.join()
        assert wait_until(lambda: sum(m["stopped"] for m in fleet.status()["members"]) == 20, 10)
        status = fleet.status()["members"]
        assert all(m["failed"] == 0 and m["state"] == "healthy" and m["in_flight"] == 0 for m in status), status


# -- under failure: the prober, backoff, failover of a request that got no response byte ----------


class Listener:
    """A member that is not a server: it accepts connections and, per ``mode``, ``hangs`` (reads
    and never answers: a wedged replica, a blackholed route) or ``closes`` after reading the
    request (a replica killed with the request queued). Counts the connections it holds at once."""

    def __init__(self, mode: str) -> None:
        import socket

        self.mode = mode
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.requests: list[str] = []
        self.open_now = 0
        self.most_open = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: object) -> None:
        import socket

        assert isinstance(conn, socket.socket)
        with self._lock:
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            with self._lock:
                self.requests.append(data.split(b" ", 2)[1].decode())
            if self.mode == "half-head":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-")
                return
            if self.mode == "hangs":
                conn.settimeout(0.05)
                while not self._closed.is_set():  # until the client leaves, or the test ends
                    try:
                        if conn.recv(65536) == b"":
                            return
                    except TimeoutError:
                        continue
        except OSError:
            return
        finally:
            with self._lock:
                self.open_now -= 1
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self._sock.close()


def test_no_caller_waits_on_a_probe_of_a_wedged_member(servers: list[FakeOpenAIServer]) -> None:
    """A member whose readiness route hangs (10 s probe timeout): once it is down, callers go to
    the healthy member and never wait on its probe; its probes run one at a time."""
    wedged = Listener("hangs")
    members = {
        "wedged": create_llm("openai-compatible", "fake-model", base_url=wedged.base_url),
        "ok": create_llm("openai-compatible", "fake-model", base_url=servers[0].base_url),
    }
    fleet = Fleet(
        members,
        failure_threshold=1,
        cooldown=0.05,
        probe_timeout=10.0,
        probe_interval=0.05,
        timeout=Timeout(first_token=3.0),  # a call sent to the wedged member fails in 3 s, not never
    )
    try:
        fleet.members[0].health.failed()  # down (as a call that failed on it would put it)
        assert wait_until(lambda: fleet.provider.prober.probes >= 1, 10)
        # its cooldown has ended; its probe hangs (10 s): still unconfirmed, so not for callers
        assert wait_until(lambda: not fleet.members[0].health.cooling(), 10)
        took: list[float] = []

        def call() -> None:
            t0 = time.monotonic()
            assert fleet.generate("hi", max_tokens=2).member == "ok"
            took.append(time.monotonic() - t0)

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(took) == 8 and max(took) < 2.5, took  # a probe holds for 10 s: nobody waited on one
        time.sleep(0.5)  # ten probe intervals: none may start while the first still hangs (10 s)
        assert fleet.provider.prober.probes == 1 and wedged.most_open == 1
        assert all(r == "/v1/models" for r in wedged.requests)
        assert fleet.status()["members"][0]["state"] != "healthy"
    finally:
        fleet.close()
        wedged.close()


def test_backoff_is_one_step_per_failed_probe_and_capped(servers: list[FakeOpenAIServer]) -> None:
    dead = create_llm("openai-compatible", "fake-model", base_url="http://127.0.0.1:9/v1")
    fleet = Fleet(
        {"dead": dead, "ok": create_llm("openai-compatible", "fake-model", base_url=servers[0].base_url)},
        failure_threshold=1,
        cooldown=0.05,
        max_cooldown=0.4,
        probe_interval=0.05,
    )
    try:
        fleet.members[0].health.failed()
        assert wait_until(lambda: fleet.provider.prober.probes >= 10, 20)
        for _ in range(8):
            assert fleet.generate("hi", max_tokens=2).member == "ok"
        health = fleet.members[0].health
        probes = fleet.provider.prober.probes
        assert health.cooldowns <= 1 + probes  # one step per failed probe, never more
        assert health.cooldown_until - time.monotonic() <= 0.4 * 1.25  # capped (with its jitter)
    finally:
        fleet.close()


def test_a_restarted_member_is_taken_back_before_its_cooldown_ends(servers: list[FakeOpenAIServer]) -> None:
    a, b, _ = servers
    port = a.port
    with fleet_of([a, b], policy="round_robin", failure_threshold=1, cooldown=60.0, probe_interval=0.05) as fleet:
        a.stop()
        assert fleet.generate("hi", max_tokens=2).member == "m1"  # m0 refused: failed over, down for ~60 s
        assert fleet.status()["members"][0]["state"] == "cooldown"
        revived = FakeOpenAIServer(port=port).start()
        try:
            assert wait_until(lambda: fleet.status()["members"][0]["state"] == "healthy", 15)
            assert fleet.status()["members"][0]["cooldown_left_s"] == 0
            assert revived.requests("/v1/models") and not revived.requests(CHAT)  # probed, no generation
            assert any(fleet.generate("hi", max_tokens=2).member == "m0" for _ in range(4))
        finally:
            revived.stop()


def listener_first(listener: Listener, ok: FakeOpenAIServer) -> Fleet:
    """A round-robin fleet whose first member is ``listener``, its second a live fake server."""
    members = {
        "listener": create_llm("openai-compatible", "fake-model", base_url=listener.base_url),
        "ok": create_llm("openai-compatible", "fake-model", base_url=ok.base_url),
    }
    return Fleet(members, policy="round_robin", max_attempts=2, failure_threshold=100)


def test_a_request_a_member_took_and_never_answered_fails_over(servers: list[FakeOpenAIServer]) -> None:
    """A member that reads the request and closes (killed with it queued): no response byte,
    so the call goes to the next member — never a replay after a byte (tested above)."""
    dying = Listener("closes")
    fleet = listener_first(dying, servers[0])
    try:
        for _ in range(4):
            result = fleet.generate("hi", max_tokens=2)
            assert result.member == "ok" and result.content == "tok0 tok1 "
        assert len(dying.requests) >= 2  # it took requests and never answered them
        stream = fleet.stream("hi", max_tokens=2)
        assert "".join(c.delta for c in stream) == "tok0 tok1 "
        alone = Fleet({"listener": create_llm("openai-compatible", "fake-model", base_url=dying.base_url)})
        with pytest.raises(TransportError) as info:
            alone.generate("hi", max_tokens=2)
        assert info.value.no_response and not info.value.retryable and info.value.partial_text == ""
        alone.close()
    finally:
        fleet.close()
        dying.close()


def test_a_response_cut_inside_its_head_is_not_failed_over(servers: list[FakeOpenAIServer]) -> None:
    """Bytes of a response came (a head cut short): never a replay on another member."""
    cut = Listener("half-head")
    fleet = listener_first(cut, servers[0])
    try:
        with pytest.raises(TransportError) as info:
            fleet.generate("hi", max_tokens=2)
        assert info.value.member == "listener" and not info.value.no_response
        assert chats(servers[0]) == 0
    finally:
        fleet.close()
        cut.close()


def test_a_probe_of_a_refusing_member_is_one_request() -> None:
    """'Connection refused' is the probe's answer, not a reason to poll until probe_timeout."""
    from abstract_client.fleet.prober import probe_once

    fleet = Fleet({"dead": create_llm("openai-compatible", "fake-model", base_url="http://127.0.0.1:9/v1")})
    try:
        t0 = time.monotonic()
        assert anyio.run(probe_once, fleet.members[0], 5.0) is False
        assert time.monotonic() - t0 < 2.5  # half the probe's timeout: it did not keep polling
        assert fleet.members[0].health.probe_due
    finally:
        fleet.close()


def test_a_member_in_cooldown_gets_no_call_even_as_a_last_resort(servers: list[FakeOpenAIServer]) -> None:
    # still loading: the background probe that its fall wakes must not bring it back meanwhile
    servers[0].behavior.fault = "loading_503"
    member = create_llm("llamacpp", "fake-model", base_url=servers[0].url)
    with Fleet({"m0": member}, failure_threshold=1, cooldown=60.0) as fleet:
        fleet.members[0].health.failed()
        with pytest.raises(ServerUnavailableError, match="cooling down"):
            fleet.generate("hi", max_tokens=2)
        assert chats(servers[0]) == 0


@needs_mlx
def test_a_fleet_of_in_process_members_reports_the_engines_own_count_on_a_stop(tiny_dir: Any) -> None:
    """A stopped call through a fleet reports what its member's engine counted (the fleet hands
    on its member's engine record), and names the member."""
    with Fleet({"a": create_llm("mlx", str(tiny_dir))}) as fleet:
        stop = threading.Event()
        options: dict[str, Any] = {"max_tokens": 100_000, "extra": {"logit_bias": {1: -1e9}}, "request_id": "f-1"}
        with pytest.raises(GenerationCancelledError) as info:
            for n, _ in enumerate(fleet.stream("hello", cancel_event=stop, **options)):
                if n == 3:
                    stop.set()
        err = info.value
        engine: Any = fleet.provider.members[0].llm.provider  # type: ignore[attr-defined]
        assert wait_until(lambda: (s := engine.stats("f-1")) is not None and s.settled, 20)
        stats = engine.stats("f-1")
        assert err.member == "a"
        assert err.usage is not None and err.usage.prompt_tokens == stats.prompt_tokens
        assert 0 < (err.usage.completion_tokens or 0) <= stats.tokens


def test_status_right_after_a_stop_shows_the_call_gone(servers: list[FakeOpenAIServer]) -> None:
    """The caller gets its stop, reads ``status()`` at once: no call in flight (before, the
    attempt left the count only once its stream had unwound, milliseconds later)."""
    with fleet_of(servers) as fleet:
        for i in range(30):
            event = threading.Event()
            with pytest.raises(GenerationCancelledError):
                for n, _ in enumerate(fleet.stream("long", max_tokens=10_000, cancel_event=event), 1):
                    if n == 2:
                        # from another thread, as a Stop button does; the caller is woken by it
                        threading.Thread(target=event.set).start()
            status = fleet.status()["members"]
            assert [m["in_flight"] for m in status] == [0, 0, 0], (i, status)

        async def stopped_by_a_cancelled_task() -> list[int]:
            async def call() -> None:
                async for _ in fleet.astream("long", max_tokens=10_000):
                    pass

            with anyio.move_on_after(0.2):
                await call()
            return [m["in_flight"] for m in fleet.status()["members"]]

        for backend in ("asyncio", "trio"):
            assert anyio.run(stopped_by_a_cancelled_task, backend=backend) == [0, 0, 0], backend
