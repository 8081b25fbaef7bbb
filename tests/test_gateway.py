"""``abstract-client serve`` in front of fake upstreams on real sockets, driven by clients no one
here wrote (openai-python sync and async, curl). A stop is proven by the upstream's evidence
(the fake server's disconnect timestamp, the tokens it wrote) and the gateway's own (its log
line and ``/metrics``)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from abstract_client import GenerationCancelledError, create_llm
from abstract_client.http.clients import KEEPALIVE
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess

from .helpers import WEATHER_TOOL, set_later, wait_until

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.02) as server:
        yield server


def launch(
    upstream: FakeOpenAIServer, tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> GatewayProcess:
    args = ["-p", "vllm", "-u", upstream.base_url, "-m", "fake-model", *extra]
    return GatewayProcess.launch(args, log_path=tmp_path / "gateway.log", env=env)


@pytest.fixture
def gateway(upstream: FakeOpenAIServer, tmp_path: Path) -> Iterator[GatewayProcess]:
    server = launch(upstream, tmp_path)
    yield server
    server.stop()


def client(gateway: GatewayProcess, **kw: object) -> openai.OpenAI:
    kw.setdefault("api_key", "unused")
    return openai.OpenAI(base_url=gateway.url + "/v1", max_retries=0, **kw)  # type: ignore[arg-type]


def last_upstream_disconnect(upstream: FakeOpenAIServer, n: int) -> float:
    """Wait for the n-th upstream generation to be severed; its disconnect timestamp."""
    record = upstream.wait_for_request(n, path=CHAT)
    record = upstream.requests(CHAT)[n - 1]
    at = upstream.wait_for_disconnect(record, timeout=10)
    assert not record.completed, "the upstream answer ran to its end"
    return at


def test_openai_python_sync_stream_break_stops_the_upstream(
    gateway: GatewayProcess, upstream: FakeOpenAIServer
) -> None:
    oa = client(gateway)
    answer = oa.chat.completions.create(model="fake-model", messages=HELLO, max_tokens=5)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 "
    assert answer.usage is not None and answer.usage.completion_tokens == 5
    stream = oa.chat.completions.create(model="fake-model", messages=HELLO, max_tokens=500, stream=True)  # type: ignore[arg-type]
    for n, _ in enumerate(stream):
        if n == 5:
            break
    stream.close()
    last_upstream_disconnect(upstream, 2)
    (stop,) = gateway.wait_for_stop(count=1, timeout=10)
    assert stop[1] == "client_disconnect"
    assert upstream.requests(CHAT)[1].tokens_sent < 100
    assert gateway.metric("abstract_client_gateway_stops_total", reason="client_disconnect") == 1
    assert wait_until(lambda: gateway.metric("abstract_client_gateway_requests_running") == 0)


def test_openai_python_async_stream_and_client_timeout(gateway: GatewayProcess, upstream: FakeOpenAIServer) -> None:
    async def main() -> None:
        oa = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
        stream = await oa.chat.completions.create(model="fake-model", messages=HELLO, max_tokens=500, stream=True)  # type: ignore[arg-type]
        n = 0
        async for _ in stream:
            n += 1
            if n == 5:
                break
        await stream.close()
        with pytest.raises(openai.APITimeoutError):  # a non-streaming call abandoned by the client
            await oa.with_options(timeout=0.5).chat.completions.create(
                model="fake-model",
                messages=HELLO,  # type: ignore[arg-type]
                max_tokens=500,
            )
        await oa.close()

    asyncio.run(main())
    last_upstream_disconnect(upstream, 1)
    last_upstream_disconnect(upstream, 2)
    assert [s[1] for s in gateway.wait_for_stop(count=2, timeout=10)] == ["client_disconnect"] * 2


def test_sync_non_streaming_abandoned_by_timeout(gateway: GatewayProcess, upstream: FakeOpenAIServer) -> None:
    with pytest.raises(openai.APITimeoutError):
        client(gateway, timeout=0.5).chat.completions.create(model="fake-model", messages=HELLO, max_tokens=500)  # type: ignore[arg-type]
    last_upstream_disconnect(upstream, 1)
    assert gateway.wait_for_stop(count=1, timeout=10)[0][1] == "client_disconnect"


@pytest.mark.parametrize("stream", [True, False])
def test_curl_max_time_stops_the_upstream(gateway: GatewayProcess, upstream: FakeOpenAIServer, stream: bool) -> None:
    body = json.dumps({"model": "fake-model", "messages": HELLO, "max_tokens": 500, "stream": stream})
    proc = subprocess.run(
        ["curl", "-sS", "--max-time", "0.5", "-H", "Content-Type: application/json", "-d", body, gateway.url + CHAT],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 28, proc.stderr  # curl: operation timed out
    last_upstream_disconnect(upstream, 1)
    assert gateway.wait_for_stop(count=1, timeout=10)[0][1] == "client_disconnect"


def test_cancel_endpoint_and_the_remote_lane(gateway: GatewayProcess, upstream: FakeOpenAIServer) -> None:
    # raw HTTP: a non-streaming call, cancelled by id from another client
    outcome: dict[str, httpx.Response] = {}

    def call() -> None:
        outcome["r"] = httpx.post(
            gateway.url + CHAT,
            json={"model": "fake-model", "messages": HELLO, "max_tokens": 500},
            headers={"X-Request-Id": "job-42"},
            timeout=30,
        )

    worker = threading.Thread(target=call)
    worker.start()
    record = upstream.wait_for_request(1, path=CHAT)
    assert wait_until(lambda: record.tokens_sent >= 3, 10)  # (tok0 sent 40 ms before: the gateway has it)
    assert httpx.post(gateway.url + "/v1/requests/job-42/cancel").json() == {"id": "job-42", "cancelled": True}
    worker.join(10)
    response = outcome["r"]
    assert response.status_code == 499 and response.headers["x-request-id"] == "job-42"
    assert response.json()["error"]["type"] == "cancelled" and response.json()["error"]["partial_text"].startswith(
        "tok0"
    )
    last_upstream_disconnect(upstream, 1)
    assert httpx.post(gateway.url + "/v1/requests/nope/cancel").status_code == 404
    # the remote lane: our request id becomes the gateway's, and cancel(id) reaches it
    with create_llm("remote", "fake-model", base_url=gateway.url) as llm:
        assert llm.generate("hi", max_tokens=3, request_id="mine-1").content == "tok0 tok1 tok2 "
        errors: list[BaseException] = []

        def generate() -> None:
            try:
                llm.generate("hi", max_tokens=500, request_id="mine-2")
            except GenerationCancelledError as err:
                errors.append(err)

        worker = threading.Thread(target=generate)
        worker.start()
        upstream.wait_for_request(3, path=CHAT)
        assert wait_until(lambda: "mine-2" in llm.in_flight)
        assert llm.cancel("mine-2")
        worker.join(10)
        assert len(errors) == 1
    last_upstream_disconnect(upstream, 3)
    stops = {s[0]: s[1] for s in gateway.wait_for_stop(count=2, timeout=10)}
    assert stops["job-42"] == "cancel_endpoint" and stops["mine-2"] in ("client_disconnect", "cancel_endpoint")


def test_request_id_on_every_response_and_the_api_key(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    secret = "s3cret-key-value"
    with launch(upstream, tmp_path, "--api-key-env", "GW_KEY", env={**os.environ, "GW_KEY": secret}) as gw:
        health = httpx.get(gw.url + "/health")  # no key needed
        assert health.status_code == 200 and health.headers["x-request-id"].startswith("req-")
        denied = httpx.get(gw.url + "/v1/models", headers={"X-Request-Id": "abc"})
        assert denied.status_code == 401 and denied.headers["x-request-id"] == "abc"
        wrong = httpx.get(gw.url + "/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {secret}"})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "fake-model"
        answer = client(gw, api_key=secret).chat.completions.with_raw_response.create(
            model="fake-model",
            messages=HELLO,  # type: ignore[arg-type]
            max_tokens=3,
            extra_headers={"X-Request-Id": "trace-7"},
        )
        assert answer.headers["x-request-id"] == "trace-7" and answer.parse().id == "trace-7"
        assert httpx.get(gw.url + "/metrics", headers={"X-Request-Id": "bad id!"}).status_code == 400
        assert secret not in gw.log_text()


def test_bounded_queue_503_and_a_queued_client_that_leaves(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    with launch(upstream, tmp_path, "--max-concurrent", "1", "--queue-timeout", "0.5") as gw:
        holder = client(gw).chat.completions.create(model="fake-model", messages=HELLO, max_tokens=2000, stream=True)  # type: ignore[arg-type]
        next(iter(holder))
        t0 = time.perf_counter()
        busy = httpx.post(gw.url + CHAT, json={"model": "fake-model", "messages": HELLO}, timeout=30)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert 0.4 < time.perf_counter() - t0 < 10
        assert busy.json()["error"]["code"] == "queue_timeout"
        # a client that leaves while queued: nothing reaches the upstream for it
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gw.url + CHAT, json={"model": "fake-model", "messages": HELLO}, timeout=0.2)
        # the gateway saw it leave the queue (499) before the slot frees up
        assert wait_until(lambda: gw.metric("abstract_client_gateway_requests_total", status="499") == 1)
        # a background response meets the same queue, run by the same runner: it fails with
        # queue_timeout and is counted as rejected, as the foreground one (#70: it was not)
        body = {"model": "fake-model", "input": "hi", "background": True}
        made = httpx.post(gw.url + "/v1/responses", json=body, timeout=30).json()

        def status() -> Any:
            return httpx.get(f"{gw.url}/v1/responses/{made['id']}", timeout=30).json()

        assert wait_until(lambda: status()["status"] == "failed", 10), status()
        assert status()["error"]["code"] == "queue_timeout"
        holder.close()
        last_upstream_disconnect(upstream, 1)
        assert wait_until(lambda: gw.metric("abstract_client_gateway_requests_running") == 0)
        assert len(upstream.requests(CHAT)) == 1 and upstream.requests("/v1/responses") == []
        assert gw.metric("abstract_client_gateway_queue_rejected_total") == 2


def test_a_request_cancelled_while_queued_leaves_a_stop_record(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    """Every stop has its record (``GET /v1/requests/{id}``): one made while the request waited
    for a slot was a 404."""
    with launch(upstream, tmp_path, "--max-concurrent", "1", "--queue-timeout", "60") as gw:
        holder = client(gw).chat.completions.create(model="fake-model", messages=HELLO, max_tokens=2000, stream=True)  # type: ignore[arg-type]
        next(iter(holder))
        answers: list[httpx.Response] = []
        body = {"model": "fake-model", "messages": HELLO}
        queued = set_later(
            lambda: answers.append(
                httpx.post(gw.url + CHAT, json=body, headers={"X-Request-Id": "queued-1"}, timeout=60)
            ),
            0,
        )

        def cancelled() -> bool:
            answer = httpx.post(gw.url + "/v1/requests/queued-1/cancel", timeout=30)
            return answer.status_code == 200 and answer.json()["cancelled"] is True

        assert wait_until(cancelled, 20, 0.1)
        queued.join(30)
        assert answers and answers[0].status_code == 499, answers
        record = httpx.get(gw.url + "/v1/requests/queued-1", timeout=30)
        assert record.status_code == 200, record.text
        assert record.json()["reason"] == "cancel_endpoint" and record.json()["generated_tokens"] == 0
        holder.close()
        assert len(upstream.requests(CHAT)) == 1  # nothing of it was sent


def test_errors_are_openai_error_bodies_and_a_failing_stream_ends_with_an_error_frame(
    gateway: GatewayProcess, upstream: FakeOpenAIServer
) -> None:
    upstream.behavior.models = {"other": True}
    missing = httpx.post(gateway.url + CHAT, json={"model": "fake-model", "messages": HELLO})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    bad = httpx.post(gateway.url + CHAT, json={"model": "fake-model", "messages": []})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    for stream in (False, True):  # arguments the SDK refuses: a 400, streaming or not
        refused = httpx.post(
            gateway.url + CHAT,
            json={"model": "fake-model", "messages": HELLO, "tool_choice": "sometimes", "stream": stream},
        )
        assert refused.status_code == 400 and "tool_choice" in refused.json()["error"]["message"]
    upstream.behavior.models = {"fake-model": True}
    upstream.inject("drop")  # the upstream dies after 2 tokens
    with httpx.stream("POST", gateway.url + CHAT, json={"model": "fake-model", "messages": HELLO, "stream": True}) as r:
        assert r.status_code == 200
        frames = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in frames[-1] and "error" in json.loads(frames[-1][6:])
    assert any("tok0" in f for f in frames)


def test_tools_structured_output_and_embeddings_through_the_gateway(
    gateway: GatewayProcess, upstream: FakeOpenAIServer
) -> None:
    upstream.behavior.script = [
        {"tool": 0, "id": "call_1", "name": "get_weather", "arguments": '{"city": '},
        {"tool": 0, "arguments": '"Paris"}'},
    ]
    oa = client(gateway)
    answer = oa.chat.completions.create(model="fake-model", messages=HELLO, tools=[WEATHER_TOOL])  # type: ignore[arg-type,list-item]
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert answer.choices[0].finish_reason == "tool_calls"
    pieces = [
        c.choices[0].delta.tool_calls[0]
        for c in oa.chat.completions.create(model="fake-model", messages=HELLO, tools=[WEATHER_TOOL], stream=True)  # type: ignore[arg-type,list-item]
        if c.choices and c.choices[0].delta.tool_calls
    ]
    assert "".join(p.function.arguments for p in pieces) == '{"city": "Paris"}'  # type: ignore[union-attr,misc]
    upstream.behavior.script = None
    upstream.behavior.answer = '{"city": "Oslo"}'
    schema = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "object"}}}
    oa.chat.completions.create(model="fake-model", messages=HELLO, response_format=schema)  # type: ignore[arg-type,call-overload]
    assert upstream.last.body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    vectors = oa.embeddings.create(model="fake-model", input=["a", "b"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == upstream.behavior.embed_dim


def test_200_concurrent_streams_with_random_disconnects_leak_nothing(tmp_path: Path) -> None:
    with FakeOpenAIServer(token_delay=0.01) as upstream:
        gw = launch(upstream, tmp_path, "--max-concurrent", "200", "--log-level", "warning")
        try:
            process = psutil.Process(gw.pid)
            httpx.post(gw.url + CHAT, json={"model": "fake-model", "messages": HELLO, "max_tokens": 2})  # warm
            time.sleep(0.5)
            fds, threads = process.num_fds(), process.num_threads()
            rng = random.Random(7)

            async def one(http: httpx.AsyncClient, i: int) -> str:
                leave_after = rng.choice([0, 1, 3, 8, None])  # None: read to the end
                body = {"model": "fake-model", "messages": HELLO, "max_tokens": 20, "stream": True}
                async with http.stream("POST", CHAT, json=body) as r:
                    n = 0
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            n += 1
                            if leave_after is not None and n > leave_after:
                                return "left"
                return "done"

            async def main() -> list[str]:
                limits = httpx.Limits(max_connections=250)
                async with httpx.AsyncClient(base_url=gw.url, timeout=60, limits=limits) as http:
                    return await asyncio.gather(*(one(http, i) for i in range(200)))

            outcomes = asyncio.run(main())
            assert outcomes.count("left") > 50 and outcomes.count("done") > 10
            # what stays open is the pool's idle keep-alive connections (answers read to the end;
            # at most KEEPALIVE), never a generation's
            kept = KEEPALIVE
            assert wait_until(lambda: upstream.open_connections() <= kept, timeout=20), upstream.open_connections()
            generations = upstream.requests(CHAT)
            assert len(generations) == 201
            assert wait_until(lambda: all(r.completed or r.disconnected_at for r in generations), timeout=20)
            assert wait_until(lambda: gw.metric("abstract_client_gateway_requests_running") == 0, timeout=20)
            # the gateway's own resources are back: every upstream socket closed, no thread left
            assert wait_until(
                lambda: process.num_fds() <= fds + 2 + kept and process.num_threads() <= threads, timeout=20
            ), (
                fds,
                process.num_fds(),
                threads,
                process.num_threads(),
            )
        finally:
            gw.stop()


def test_config_file_routes_by_model_and_admin_unload(tmp_path: Path) -> None:
    from abstract_client.testing import FakeOllamaServer

    with FakeOpenAIServer(answer="from A") as a, FakeOllamaServer(answer="from B", models={"llama3": True}) as b:
        config = tmp_path / "gateway.toml"
        config.write_text(
            f"""
[server]
log_level = "info"

[[backend]]
name = "alpha"
provider = "vllm"
base_url = "{a.base_url}"
model = "fake-model"

[[backend]]
name = "llama3"
provider = "ollama"
base_url = "{b.url}"
max_concurrent = 1
"""
        )
        with GatewayProcess.launch(["--config", str(config)], log_path=tmp_path / "gw.log") as gw:
            oa = client(gw)
            assert [m.id for m in oa.models.list().data] == ["alpha", "llama3"]
            assert oa.chat.completions.create(model="alpha", messages=HELLO).choices[0].message.content == "from A"  # type: ignore[arg-type]
            assert oa.chat.completions.create(model="llama3", messages=HELLO).choices[0].message.content == "from B"  # type: ignore[arg-type]
            assert b.last.body["model"] == "llama3"
            with pytest.raises(openai.NotFoundError):
                oa.chat.completions.create(model="nope", messages=HELLO)  # type: ignore[arg-type]
            unloaded = httpx.post(gw.url + "/v1/models/unload", json={"model": "llama3"}, timeout=30)
            assert unloaded.status_code == 200 and unloaded.json()["server_unloaded"] is True


@pytest.mark.parametrize("name", ['a"b', "back\\slash", "new\nline", "plain"])
def test_metrics_page_parses_whatever_a_backend_is_called(upstream: FakeOpenAIServer, name: str) -> None:
    """/metrics is written by prometheus_client: label values are escaped, and the page parses
    with its own parser, with the counts the requests made."""
    from prometheus_client.parser import text_string_to_metric_families

    from abstract_client.gateway import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    config = GatewayConfig(
        backends=[
            BackendConfig(name=name, provider="openai-compatible", model="fake-model", base_url=upstream.base_url)
        ]
    )
    with InProcessGateway(config) as gw:
        body = {"model": name, "messages": HELLO, "max_tokens": 3}
        assert httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        page = httpx.get(gw.url + "/metrics", timeout=30)
    assert page.headers["content-type"].startswith("text/plain; version=")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page.text)
        for s in family.samples
    }
    key = ("abstract_client_gateway_requests_total", (("backend", name), ("endpoint", "chat"), ("status", "200")))
    assert samples[key] == 1.0
    assert samples[("abstract_client_gateway_requests_running", (("backend", name),))] == 0.0


def test_the_access_log_is_off_unless_asked_for(tmp_path: Path) -> None:
    """uvicorn's line per request costs a small request ~6 % of its gateway CPU: off by default,
    on with ``[server] access_log = true`` (or ``--access-log``)."""
    from abstract_client.gateway.app import create_app
    from abstract_client.gateway.config import load_config
    from abstract_client.gateway.server import uvicorn_config

    path = tmp_path / "gateway.toml"
    for line, expected in (("", False), ("access_log = true\n", True)):
        path.write_text(f'[server]\n{line}[[backend]]\nname = "m"\nprovider = "openai-compatible"\n')
        config = load_config(path)
        assert uvicorn_config(create_app(config), config).access_log is expected


def test_a_request_stopped_before_it_starts_gives_its_slot_back(tmp_path: Path) -> None:
    """The client left (or the request was cancelled) after its slot was free but before its
    generation started: a 499, nothing runs, and the slot is free again for the next request."""
    from abstract_client.gateway.app import create_app
    from abstract_client.gateway.config import load_config
    from abstract_client.gateway.flight import Flight
    from abstract_client.gateway.runner import Job
    from abstract_client.gateway.sinks import ClientWhole

    path = tmp_path / "gateway.toml"
    path.write_text('[[backend]]\nname = "m"\nprovider = "openai-compatible"\nmax_concurrent = 1\n')
    gateway = create_app(load_config(path)).state.gateway
    backend = gateway.backends["m"]
    ran: list[object] = []

    async def main() -> list[int]:
        sent: list[dict[str, object]] = []

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        statuses = []
        for i in range(3):
            job = Job("chat", backend, f"r{i}", "generate", {"messages": HELLO}, body_of=ran.append)
            flight = Flight(f"r{i}", backend, loop=asyncio.get_running_loop())
            flight.stop("cancel_endpoint")
            statuses.append(await gateway.runner._in_slot(flight, job, ClientWhole(send, flight, ran.append)))
        assert sent[0]["status"] == 499
        return statuses

    assert asyncio.run(main()) == [499, 499, 499]
    assert ran == [] and backend.slots.value == 1
