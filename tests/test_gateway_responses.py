"""The gateway's ``/v1/responses`` (#42) in front of fake upstreams on real sockets, driven by
openai-python, httpx and this library's own ``wire="responses"`` lane.

* Foreground: the same answers as chat, and the same stop: the client's disconnect severs the
  upstream (the fake's disconnect record).
* Background: the generation belongs to the gateway: a reader's disconnect leaves it running
  (the upstream keeps writing), a resume reads on after the last event it had (no event lost or
  repeated), ``POST …/cancel`` stops it (the upstream is severed) — the owner's key or the
  admin's only. Bounded in count (429), retention (404) and bytes (failed, upstream severed).
* ``--workers 2``: a GET or cancel that lands on the other worker is relayed to the owner.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from abstract_client import GenerationCancelledError, NotSupportedError, create_llm
from abstract_client.gateway.config import BackendConfig, GatewayConfig
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess, InProcessGateway

from .cutting_proxy import CuttingProxy
from .helpers import WEATHER_TOOL, wait_until


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.01) as server:
        yield server


def gateway_of(upstream: FakeOpenAIServer, **server: Any) -> InProcessGateway:
    backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=upstream.base_url)
    return InProcessGateway(GatewayConfig(backends=[backend], **server))


@pytest.fixture
def gw(upstream: FakeOpenAIServer) -> Iterator[InProcessGateway]:
    with gateway_of(upstream) as gateway:
        yield gateway


def client(gw: Any, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def events_of(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: "):
            yield json.loads(line[6:])


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


# -- foreground ---------------------------------------------------------------------------------


def test_foreground_answers_whole_and_streamed_as_chat_does(upstream: FakeOpenAIServer, gw: InProcessGateway) -> None:
    upstream.behavior.answer = "one two three"
    api = client(gw)
    chat = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi there"}])
    whole = api.responses.create(model="m", input="hi there", instructions="Be brief.")
    assert whole.status == "completed" and whole.output_text == chat.choices[0].message.content == "one two three"
    assert whole.usage is not None and whole.usage.output_tokens == 3
    with api.responses.stream(model="m", input="hi there") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == "one two three" and kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and "response.output_item.done" in kinds
    sent = upstream.requests("/v1/chat/completions")[1].body  # the whole answer's: with instructions
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    cut = api.responses.create(model="m", input="x", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"


def test_foreground_tool_calls_and_structured_output(upstream: FakeOpenAIServer, gw: InProcessGateway) -> None:
    upstream.behavior.script = [
        {"tool": 0, "id": "call_a", "name": "get_weather", "arguments": '{"city": '},
        {"tool": 0, "arguments": '"Paris"}'},
    ]
    api = client(gw)
    tool = {"type": "function", **WEATHER_TOOL["function"]}
    answer = api.responses.create(model="m", input="weather?", tools=[tool])  # type: ignore[list-item]
    (call,) = [item for item in answer.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"} and call.call_id == "call_a"
    sent = upstream.requests("/v1/chat/completions")[-1].body
    assert sent["tools"] == [WEATHER_TOOL]
    # the call's result goes back as a function_call_output item: a tool message upstream
    upstream.behavior.script = None
    upstream.behavior.answer = '{"city": "Paris"}'
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    answer = api.responses.create(
        model="m",
        input=[
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        ],
        text={"format": {"type": "json_schema", "name": "city", "schema": schema}},
    )
    assert json.loads(answer.output_text) == {"city": "Paris"}
    sent = upstream.requests("/v1/chat/completions")[-1].body
    assert sent["messages"][1]["tool_calls"][0]["id"] == "call_a"
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "call_a", "content": "sunny"}
    assert sent["response_format"]["json_schema"]["schema"] == schema


def test_a_foreground_stream_stops_when_its_client_leaves(upstream: FakeOpenAIServer, gw: InProcessGateway) -> None:
    body = {"model": "m", "input": "x", "max_output_tokens": 100_000, "stream": True}
    with httpx.stream("POST", gw.url + "/v1/responses", json=body, timeout=30) as r:
        for n, _ in enumerate(events_of(r.iter_lines())):
            if n == 10:
                break
    record = upstream.requests("/v1/chat/completions")[-1]
    upstream.wait_for_disconnect(record, timeout=10)  # the upstream was severed
    assert record.tokens_sent < 100_000


def test_bad_responses_bodies_are_400(upstream: FakeOpenAIServer, gw: InProcessGateway) -> None:
    for body in (
        {"model": "m"},
        {"model": "m", "input": 5},
        {"model": "m", "input": "x", "previous_response_id": "resp_1"},
        {"model": "m", "input": "x", "background": True, "store": False},
        {"model": "m", "input": "x", "tools": [{"type": "web_search"}]},
        {"model": "m", "input": [{"type": "image_generation_call"}]},
        {"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}},
        # #48: each reached the upstream
        {
            "model": "m",
            "input": [
                {"role": "user", "content": [{"type": "input_image", "image_url": "data:,", "detail": {"x": 1}}]}
            ],
        },
        {
            "model": "m",
            "input": [{"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "Par'}],
        },
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "x"},
                {"type": "function_call_output", "call_id": "c9", "output": "42"},
            ],
        },
    ):
        answer = httpx.post(gw.url + "/v1/responses", json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"]["type"] == "invalid_request_error"
    assert upstream.requests() == []  # refused by the gateway, not by its upstream


def test_a_background_request_meets_the_foregrounds_checks_before_its_200(
    upstream: FakeOpenAIServer, gw: InProcessGateway
) -> None:
    """#48: with ``background: true`` these got 200 ``queued``, then ``failed`` (a NaN: a
    plain-text 500 and a traceback, after the task had started). Each is a 400 both ways, and
    nothing reaches the upstream."""
    weather = {"type": "function", "name": "w", "parameters": {"type": "object"}}
    bad: list[tuple[dict[str, Any], bytes | None]] = [
        ({"tools": [{**weather, "parameters": {"$ref": "#"}}]}, None),
        ({"tools": [weather, weather]}, None),  # duplicate names
        ({"top_p": 5}, None),
        ({"stop": 5}, None),
        ({"temperature": "hot"}, None),
        ({"max_output_tokens": 0}, None),
        ({}, b'"temperature": NaN'),  # what json.dumps would never write: a raw body
        ({}, b'"top_p": Infinity'),
        ({}, b'"seed": 1e400'),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/passwd"}]}]}, None),
    ]
    for extra, raw in bad:
        for background in (False, True):
            body = {"model": "m", "input": "x", "background": background, **extra}
            if raw is None:
                answer = httpx.post(gw.url + "/v1/responses", json=body)
            else:
                text = json.dumps(body)[:-1] + ", " + raw.decode() + "}"
                answer = httpx.post(
                    gw.url + "/v1/responses", content=text, headers={"content-type": "application/json"}
                )
            assert answer.status_code == 400, (extra, raw, background, answer.status_code, answer.text[:300])
            assert answer.json()["error"]["type"] == "invalid_request_error"
    assert upstream.requests("/v1/chat/completions") == []


def test_a_body_with_far_too_many_messages_is_refused_before_it_is_parsed(
    gw: InProcessGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#48: parsing 1M messages (28 MiB) held the worker's event loop for most of a second even
    on a thread (``json.loads`` holds the GIL); a count of the body's ``"role"`` keys refuses it
    first."""
    from abstract_client.gateway.http import reading as gateway_body

    read: list[int] = []
    real = gateway_body.json_depth
    monkeypatch.setattr(gateway_body, "json_depth", lambda raw: read.append(len(raw)) or real(raw))
    many = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}] * 200_000}).encode()
    answer = httpx.post(
        gw.url + "/v1/chat/completions", content=many, headers={"content-type": "application/json"}, timeout=60
    )
    assert answer.status_code == 400 and "at most 10000 messages" in answer.text, answer.text[:200]
    assert read == [], "the body was read past the count"


def test_request_checks_are_bounded_in_count_and_size(gw: InProcessGateway) -> None:
    """#48: 100k tools (each a JSON-schema check) held a worker's loop for minutes; 1M messages
    for 7 s. Past the caps, a typed 400 at once."""
    tool = {"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}
    many_tools = [{**tool, "function": {**tool["function"], "name": f"t{i}"}} for i in range(300)]
    for body in (
        {"model": "m", "messages": [{"role": "user", "content": "x"}] * 15_000},  # parsed, then refused
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": many_tools},  # ~25 KB
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [tool] * 20_000},  # ~1.5 MB
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "big", "schema": {"type": "object", "description": "x" * 2_000_000}},
            },
        },
    ):
        t0 = time.perf_counter()
        answer = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 400, answer.text[:300]
        assert time.perf_counter() - t0 < 10  # generous on a loaded machine; seconds to minutes before
    # the duplicate check is linear: 256 tools with one name twice
    tools = [*many_tools[:255], many_tools[0]]
    answer = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools},
        timeout=60,
    )
    assert answer.status_code == 400 and "unique" in answer.text


# -- background ---------------------------------------------------------------------------------


def test_a_background_response_outlives_its_reader_and_resumes_exactly(
    upstream: FakeOpenAIServer, gw: InProcessGateway
) -> None:
    """A reader that leaves after 10 events does not stop it (the upstream is never severed and
    writes on); reading on after the last event it had gives the rest: no event lost or repeated."""
    body = {"model": "m", "input": "x", "max_output_tokens": 200, "stream": True, "background": True}
    seen: list[dict[str, Any]] = []
    with httpx.stream("POST", gw.url + "/v1/responses", json=body, timeout=30) as r:
        for event in events_of(r.iter_lines()):
            seen.append(event)
            if len(seen) == 10:
                break
    response_id = seen[0]["response"]["id"]
    record = upstream.requests("/v1/chat/completions")[-1]
    tokens = record.tokens_sent
    assert wait_until(lambda: record.tokens_sent > tokens + 20, 10)  # it generates on, nobody reading
    assert record.disconnected_at is None
    url = f"{gw.url}/v1/responses/{response_id}"
    with httpx.stream("GET", url, params={"stream": "true", "starting_after": seen[-1]["sequence_number"]}) as r:
        rest = list(events_of(r.iter_lines()))
    everything = seen + rest
    assert [e["sequence_number"] for e in everything] == list(range(len(everything)))
    assert text_of(everything) == "".join(f"tok{i} " for i in range(200))
    assert everything[-1]["type"] == "response.incomplete"
    assert httpx.get(url).json()["status"] == "incomplete"
    assert record.completed and record.disconnected_at is None


def test_a_background_response_is_stopped_by_its_cancel(upstream: FakeOpenAIServer, gw: InProcessGateway) -> None:
    api = client(gw)
    started = api.responses.create(model="m", input="x", max_output_tokens=100_000, background=True)
    assert started.status in ("queued", "in_progress")
    upstream.wait_for_request(1, timeout=10)
    record = upstream.requests("/v1/chat/completions")[-1]
    assert wait_until(lambda: record.tokens_sent > 10, 10)
    reader: dict[str, Any] = {}

    def read() -> None:
        url = f"{gw.url}/v1/responses/{started.id}"
        with httpx.stream("GET", url, params={"stream": "true"}, timeout=30) as r:
            reader["last"] = list(events_of(r.iter_lines()))[-1]

    thread = threading.Thread(target=read)
    thread.start()
    cancelled = api.responses.cancel(started.id)
    assert cancelled.status == "cancelled" and cancelled.output_text
    upstream.wait_for_disconnect(record, timeout=10)  # the engine was told
    thread.join(10)
    assert reader["last"]["type"] == "error" and reader["last"]["code"] == "response_cancelled"
    stop = httpx.get(f"{gw.url}/v1/requests/{started.id}").json()
    assert stop["reason"] == "cancel_endpoint"


def test_only_the_owners_key_or_the_admins_reaches_a_background_response(upstream: FakeOpenAIServer) -> None:
    with gateway_of(upstream, api_keys=["alice-key", "bob-key"], admin_key="root-key") as gw:
        alice, bob, root = client(gw, "alice-key"), client(gw, "bob-key"), client(gw, "root-key")
        first = alice.responses.create(model="m", input="x", max_output_tokens=100_000, background=True)
        for call in (lambda: bob.responses.retrieve(first.id), lambda: bob.responses.cancel(first.id)):
            with pytest.raises(openai.NotFoundError):
                call()
        assert alice.responses.retrieve(first.id).status in ("queued", "in_progress")
        assert root.responses.cancel(first.id).status == "cancelled"
        second = alice.responses.create(model="m", input="x", max_output_tokens=100_000, background=True)
        assert alice.responses.cancel(second.id).status == "cancelled"
        for record in upstream.requests("/v1/chat/completions"):
            upstream.wait_for_disconnect(record, timeout=10)


def test_background_responses_are_bounded_in_count_time_and_bytes(upstream: FakeOpenAIServer) -> None:
    with gateway_of(upstream, max_background=1, background_retention=1.0, background_max_bytes=8192) as gw:
        api = client(gw)
        big = api.responses.create(model="m", input="x", max_output_tokens=100_000, background=True)
        with pytest.raises(openai.RateLimitError) as refused:  # one is held: the next is refused
            api.responses.create(model="m", input="x", background=True)
        assert refused.value.code == "too_many_background_responses"
        record = upstream.wait_for_request(1, timeout=10, path="/v1/chat/completions")
        upstream.wait_for_disconnect(record, timeout=10)  # past 8 KiB of events it was stopped
        assert record.tokens_sent < 1000
        assert wait_until(lambda: api.responses.retrieve(big.id).status == "failed", 10)
        failed = api.responses.retrieve(big.id)
        assert failed.error is not None and failed.error.code == "response_too_large"  # type: ignore[comparison-overlap]
        time.sleep(1.2)  # past its retention: forgotten, and its room is free
        with pytest.raises(openai.NotFoundError):
            api.responses.retrieve(big.id)
        assert api.responses.create(model="m", input="x", max_output_tokens=3, background=True).id


# -- this library's own Responses lane, through the gateway ------------------------------------


def _cut_by(port: int, socks: list[Any]) -> int:
    """How many of ``socks`` the server on ``port`` has closed, seen from its side without reading
    (our end cannot tell: its FIN waits behind the megabytes still queued to us)."""
    import psutil

    ours = {s.getsockname()[1] for s in socks}
    open_ = {
        c.raddr.port
        for c in psutil.net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.raddr and c.status == psutil.CONN_ESTABLISHED
    }
    return len(ours - open_)


def test_a_reader_that_stops_reading_is_cut_after_the_write_timeout(upstream: FakeOpenAIServer) -> None:
    """#48: background readers had no write timeout: a reader whose TCP window stayed shut
    held its response's events after the store had dropped it (16 stalled readers: RSS +200 MiB
    and growing). Directly and through the relay, a stalled reader is now cut."""
    import socket

    upstream.behavior.token_delay = 0.002
    # 1 KB tokens: the kernel's send buffer (up to 4 MB on loopback) fills in seconds, not minutes
    upstream.behavior.answer = ("x" * 1000 + " ") * 200_000
    backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=upstream.base_url)
    config = GatewayConfig(backends=[backend], write_timeout=1.0, background_max_bytes=1 << 30)
    with InProcessGateway(config) as gw:
        started = httpx.post(
            gw.url + "/v1/responses",
            json={"model": "m", "input": "x", "max_output_tokens": 1_000_000, "background": True},
        ).json()
        readers = []
        for _ in range(3):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a window that fills at once
            sock.connect(("127.0.0.1", gw.port))
            sock.sendall(f"GET /v1/responses/{started['id']}?stream=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            readers.append(sock)  # ... and never read
        # the response generates on and fills the readers' windows; each is cut once a write
        # waited past 1 s (read nothing until then: reading would open the window)
        assert wait_until(lambda: _cut_by(gw.port, readers) == len(readers), 60), "a reader was never cut"
        deadline = time.monotonic() + 60
        for sock in readers:
            sock.settimeout(5)
            ended = False
            while time.monotonic() < deadline:
                try:
                    if not sock.recv(1 << 20):  # what was buffered, then the gateway's close
                        ended = True
                        break
                except TimeoutError:
                    break
                except ConnectionResetError:
                    ended = True
                    break
            sock.close()
            assert ended, "a reader that read nothing was never cut"
        status = httpx.get(f"{gw.url}/v1/responses/{started['id']}").json()["status"]
        assert status == "in_progress"  # readers are cut, never the response
        assert httpx.post(f"{gw.url}/v1/responses/{started['id']}/cancel").json()["status"] == "cancelled"


def test_the_librarys_resumable_stream_through_the_gateway_survives_cuts_and_stops_by_cancel(
    upstream: FakeOpenAIServer, gw: InProcessGateway
) -> None:
    with create_llm("openai-compatible", "m", base_url=gw.url + "/v1", wire="responses") as direct:
        reference = "".join(c.delta for c in direct.stream("x", max_tokens=300))
    proxy = CuttingProxy(gw.port, seed=7, cuts=4, cut_after=(1_500, 6_000))
    try:
        with create_llm("openai-compatible", "m", base_url=proxy.url + "/v1", wire="responses", max_retries=0) as llm:
            text = "".join(c.delta for c in llm.stream("x", max_tokens=300, resumable=True))
            assert len(proxy.cut_at) == 4 and text == reference
            stop = threading.Event()
            with pytest.raises(GenerationCancelledError):
                for n, _ in enumerate(llm.stream("x", max_tokens=100_000, resumable=True, cancel_event=stop)):
                    if n == 5:
                        stop.set()
    finally:
        proxy.close()
    last = upstream.requests("/v1/chat/completions")[-1]
    upstream.wait_for_disconnect(last, timeout=10)  # the gateway's background generation was cancelled
    assert last.tokens_sent < 100_000


@contextlib.contextmanager
def _two_workers(upstream: FakeOpenAIServer, tmp_path: Path) -> Iterator[tuple[GatewayProcess, dict[str, Any]]]:
    """A gateway of two workers, and a long background response one of them runs."""
    args = ["-p", "openai-compatible", "-u", upstream.base_url, "-m", "fake-model", "--name", "m", "--workers", "2"]
    with GatewayProcess.launch(args, log_path=tmp_path / "gw.log") as gw:
        started = httpx.post(
            gw.url + "/v1/responses",
            json={"model": "m", "input": "x", "max_output_tokens": 100_000, "background": True},
        ).json()
        yield gw, started


def test_workers_relay_a_background_response_to_the_worker_that_runs_it(
    upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    with _two_workers(upstream, tmp_path) as (gw, started):
        assert started["id"].startswith(("resp_w0_", "resp_w1_"))
        statuses = set()
        for _ in range(12):  # new connections: the kernel spreads them over both workers
            with httpx.Client() as fresh:
                answer = fresh.get(f"{gw.url}/v1/responses/{started['id']}")
                statuses.add(answer.status_code)
                assert answer.json()["id"] == started["id"]
        assert statuses == {200}
        with (
            httpx.Client() as fresh,
            fresh.stream(
                "GET", f"{gw.url}/v1/responses/{started['id']}", params={"stream": "true", "starting_after": 2}
            ) as r,
        ):
            first = next(events_of(r.iter_lines()))
            assert first["sequence_number"] == 3
        with httpx.Client() as fresh:
            assert fresh.post(f"{gw.url}/v1/responses/{started['id']}/cancel").json()["status"] == "cancelled"
        upstream.wait_for_disconnect(upstream.requests("/v1/chat/completions")[-1], timeout=10)


def _worker_pid(gw: GatewayProcess, index: int) -> int:
    """The pid of the worker listening on its peers' socket ``worker-<index>.sock``."""
    import psutil

    for child in psutil.Process(gw.pid).children(recursive=True):
        for conn in child.net_connections(kind="unix"):
            if str(conn.laddr).endswith(f"worker-{index}.sock"):
                return int(child.pid)
    raise AssertionError(f"no process listens on worker-{index}.sock")


def test_workers_agree_on_reads_and_readers_of_a_dead_owner_get_an_error_event(
    upstream: FakeOpenAIServer, tmp_path: Path
) -> None:
    """#48: the relay and the owner parse a read's query with one parser (a negative or a
    non-ASCII ``starting_after`` is a 400 on every worker, never an index from the end); a burst
    of reads is never a 404; a relayed reader of an owner that is killed gets an ``error``
    event, never a clean end."""
    import asyncio
    import contextlib
    import os
    import signal

    upstream.behavior.token_delay = 0.05
    with _two_workers(upstream, tmp_path) as (gw, started):
        url = f"{gw.url}/v1/responses/{started['id']}"
        for bad in ["-5", "-1000000", "\u0663", " 3", "1_0", "3.0", "x"]:
            for _ in range(6):  # fresh connections: both workers answer
                with httpx.Client() as fresh:
                    answer = fresh.get(url, params={"stream": "true", "starting_after": bad})
                assert answer.status_code == 400, (bad, answer.status_code, answer.text[:200])
        for _ in range(6):
            with httpx.Client() as fresh:
                assert fresh.get(url, params={"stream": "yes"}).status_code == 400

        async def burst(n: int) -> list[int]:
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
            async with httpx.AsyncClient(limits=limits, timeout=60) as client:
                answers = await asyncio.gather(*(client.get(url) for _ in range(n)))
            return [a.status_code for a in answers]

        statuses = asyncio.run(burst(300))
        assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}

        owner = int(started["id"].split("_")[1][1:])
        with contextlib.ExitStack() as stack:
            for _ in range(60):  # until a reader lands on the other worker
                reading = contextlib.ExitStack()
                client = reading.enter_context(httpx.Client(timeout=30))
                params = {"stream": "true", "starting_after": 0}
                reader = reading.enter_context(client.stream("GET", url, params=params))
                if reader.headers.get("x-abstract-client-relayed-from"):
                    stack.push(reading.pop_all())
                    break
                reading.close()
            else:
                pytest.fail("no read was relayed in 60 fresh connections")
            events = events_of(reader.iter_lines())
            assert next(events)["sequence_number"] == 1
            os.kill(_worker_pid(gw, owner), signal.SIGKILL)
            rest = list(events)
        assert rest and rest[-1]["type"] == "error" and rest[-1]["code"] == "owner_lost", rest[-3:]
        with httpx.Client() as fresh:  # an owner that cannot be reached is not "no such response"
            gone = fresh.get(url)
        assert gone.status_code == 503 and gone.headers.get("retry-after"), gone.text
        assert gone.json()["error"]["code"] == "owner_unreachable"


def test_the_remote_lane_speaks_the_gateways_responses_wire(upstream: FakeOpenAIServer, gw: InProcessGateway) -> None:
    upstream.behavior.answer = "one two three"
    with create_llm("remote", "m", base_url=gw.url, wire="responses") as remote:
        assert remote.generate("hi").content == "one two three"
        assert "".join(c.delta for c in remote.stream("hi", resumable=True)) == "one two three"
    with create_llm("remote", "m", base_url=gw.url) as chat, pytest.raises(NotSupportedError):
        chat.generate("hi", resumable=True)  # the chat wire has no background responses
