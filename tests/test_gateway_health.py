"""The gateway an operator runs: ``/health`` and ``/ready`` that tell the truth, log lines worth
reading, errors that say what happened.

Against real components: a gateway process started with a ``--store`` where no Redis runs yet
and a backend address where nothing listens yet, then a real ``redis-server`` and a fake
upstream started on those very ports; the real openai-python and anthropic SDKs for the error
answers (each counted by the gateway's own ``/metrics``: a client that retried shows as more
than one request).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from abstract_client.gateway.config import BackendConfig, GatewayConfig
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess, InProcessGateway
from abstract_client.testing.processes import free_port

from .helpers import wait_until
from .test_gateway_hosts import RedisServer

pytestmark = pytest.mark.timeout(180)

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if " WARNING " in line or line.startswith("WARNING")]


def test_a_gateway_without_its_store_and_backend_says_so_once_and_says_when_they_are_back(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)
    redis.kill()  # its port, with nothing listening on it
    upstream_port = free_port()
    backend = ["-p", "vllm", "-u", f"http://127.0.0.1:{upstream_port}/v1", "--name", "fake-model"]
    gateway = GatewayProcess.launch(
        [*backend, "--store", redis.url, "--health-interval", "1"], log_path=tmp_path / "gateway.log"
    )
    try:
        # /health is liveness (200), its body the truth; /ready is what a load balancer acts on
        def unavailable() -> bool:
            return httpx.get(gateway.url + "/health").json()["status"] == "unavailable"

        assert wait_until(unavailable, 15), httpx.get(gateway.url + "/health").text
        health = httpx.get(gateway.url + "/health").json()
        assert health["backends"]["fake-model"]["state"] == "down" and health["store"]["state"] == "down"
        assert str(upstream_port) in health["backends"]["fake-model"]["error"]  # no key configured: details
        ready = httpx.get(gateway.url + "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "unavailable"
        # a request meanwhile: the refused upstream is a 502 said at once, the store a 503 said once
        assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT).status_code == 502
        body = {"model": "fake-model", "input": "hi", "background": True}
        refused = httpx.post(gateway.url + "/v1/responses", json=body, timeout=30).json()["error"]["message"]
        assert refused.count("the store") == 1, refused

        time.sleep(20)  # 20 probes of the backend and 100 lease renewals that fail
        warnings = _warnings(gateway.log_text())
        assert len(warnings) == 2, warnings  # one for the store, one for the backend: not one per retry
        assert any("store: unreachable" in w for w in warnings) and any("backend fake-model" in w for w in warnings)

        redis.restart()
        with FakeOpenAIServer(port=upstream_port) as back:

            def ready_again() -> bool:
                return httpx.get(gateway.url + "/ready").status_code == 200

            assert wait_until(ready_again, 20), httpx.get(gateway.url + "/health").text
            # reached (a connect-only probe: the fake counts it when its accept loop gets to it,
            # which may be after the kernel completed the handshake), and sent nothing
            assert wait_until(lambda: back.connections >= 1, 10) and back.requests() == []
            assert httpx.get(gateway.url + "/health").json()["status"] == "ok"
            assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT).status_code == 200
            text = gateway.log_text()
            assert "store: reachable at" in text and "backend fake-model: reachable again" in text, gateway.log_tail()
            assert len(_warnings(text)) == 2, _warnings(text)
        # the backend goes away while up (no probe runs then): the first call that cannot connect says so
        assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT).status_code == 502

        def not_ready() -> bool:
            return httpx.get(gateway.url + "/ready").status_code == 503

        assert wait_until(not_ready, 10), httpx.get(gateway.url + "/health").text
        assert len(_warnings(gateway.log_text())) == 3, _warnings(gateway.log_text())
    finally:
        gateway.stop()
        redis.stop()


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.001) as server:
        yield server


def test_a_reader_that_leaves_an_event_replay_is_no_warning(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    """``curl …?stream=true&starting_after=3 | head -12``: the reader closes while the gateway
    writes the replay. Before, asyncio logged ``socket.send() raised exception`` per write."""
    gateway = GatewayProcess.launch(
        ["-p", "vllm", "-u", upstream.base_url, "--name", "fake-model"], log_path=tmp_path / "gateway.log"
    )
    try:
        body = {"model": "fake-model", "input": "hi", "background": True, "max_output_tokens": 2000}
        response_id = httpx.post(gateway.url + "/v1/responses", json=body, timeout=30).json()["id"]

        def ended() -> bool:
            status = httpx.get(f"{gateway.url}/v1/responses/{response_id}").json()["status"]
            return bool(status in ("completed", "incomplete"))

        assert wait_until(ended, 30)
        url = f"{gateway.url}/v1/responses/{response_id}?stream=true&starting_after=3"
        for _ in range(5):
            subprocess.run(f"curl -sN '{url}' | head -12 > /dev/null", shell=True, check=False, timeout=30)
        assert httpx.get(gateway.url + "/health").json()["status"] == "ok"  # it serves on
        time.sleep(0.5)
        text = gateway.log_text()
        assert "socket.send() raised exception" not in text and _warnings(text) == [], gateway.log_tail()
    finally:
        gateway.stop()


def _requests(gw: InProcessGateway, endpoint: str, status: int) -> int:
    """The gateway's count of answered requests, once none runs (a request is counted just
    after its answer is sent: the client may read before that)."""
    metrics = gw.gateway.metrics
    assert wait_until(lambda: metrics.running["fake-model"] == 0, 10), metrics.running
    with metrics._lock:
        return int(metrics.requests[("fake-model", endpoint, status)])


@pytest.fixture
def refused_gateway() -> Iterator[InProcessGateway]:
    """A gateway whose backend's address has nothing listening."""
    backend = BackendConfig(name="fake-model", provider="vllm", base_url=f"http://127.0.0.1:{free_port()}/v1")
    with InProcessGateway(GatewayConfig([backend])) as gw:
        yield gw


def test_an_unreachable_backend_is_a_502_api_error_that_no_sdk_retries(refused_gateway: InProcessGateway) -> None:
    gw = refused_gateway
    for stream in (False, True):
        answer = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": stream})
        assert answer.status_code == 502 and answer.headers["x-should-retry"] == "false"
        assert answer.json()["error"]["type"] == "api_error"
        assert answer.json()["error"]["code"] == "upstream_unreachable"
    messages = {"model": "fake-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(gw.url + "/v1/messages", json=messages)
    assert answer.status_code == 502 and answer.json()["error"]["type"] == "api_error", answer.text

    # the real SDKs, with their default retries (2): each sends its request once, and says 502
    before = _requests(gw, "messages", 502)
    claude = anthropic.Anthropic(base_url=gw.url, api_key="unused")
    with pytest.raises(anthropic.APIStatusError) as raised:
        claude.messages.create(**messages)
    assert raised.value.status_code == 502 and raised.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert _requests(gw, "messages", 502) == before + 1
    before = _requests(gw, "chat", 502)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused")
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(**CHAT)
    assert failed.value.status_code == 502
    assert _requests(gw, "chat", 502) == before + 1


def test_a_stopped_streams_error_frame_says_the_reason_its_stop_record_says(upstream: FakeOpenAIServer) -> None:
    backend = BackendConfig(name="fake-model", provider="vllm", base_url=upstream.base_url)
    with InProcessGateway(GatewayConfig([backend])) as gw:
        frames: list[Any] = []
        body = {**CHAT, "max_tokens": 100_000, "stream": True}
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "frame-1"}) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                frames.append(json.loads(line[6:]))
                if len(frames) == 3:
                    assert httpx.post(gw.url + "/v1/requests/frame-1/cancel").status_code == 200
        error = frames[-1]["error"]
        assert error["type"] == "cancelled"

        def recorded() -> bool:
            return httpx.get(gw.url + "/v1/requests/frame-1").status_code == 200

        assert wait_until(recorded, 10)
        record = httpx.get(gw.url + "/v1/requests/frame-1").json()
        assert error["code"] == record["reason"] == "cancel_endpoint"


def test_strict_model_names_refuse_a_name_that_is_not_the_backends(upstream: FakeOpenAIServer) -> None:
    backend = BackendConfig(name="fake-model", provider="vllm", base_url=upstream.base_url)
    with InProcessGateway(GatewayConfig([backend])) as lenient:  # the default: any name reaches it
        answer = httpx.post(lenient.url + "/v1/chat/completions", json={**CHAT, "model": "gpt-4o"})
        assert answer.status_code == 200 and answer.json()["model"] == "gpt-4o"
    served = len(upstream.requests("/v1/chat/completions"))
    with InProcessGateway(GatewayConfig([backend], strict_model_names=True)) as strict:
        answer = httpx.post(strict.url + "/v1/chat/completions", json={**CHAT, "model": "gpt-4o"})
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"
        messages = {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(strict.url + "/v1/messages", json=messages)
        assert answer.status_code == 404 and answer.json()["error"]["type"] == "not_found_error"
        assert len(upstream.requests("/v1/chat/completions")) == served  # nothing sent upstream
        assert httpx.post(strict.url + "/v1/chat/completions", json=CHAT).status_code == 200


def test_health_shows_addresses_and_errors_only_to_a_key(tmp_path: Path) -> None:
    backend = BackendConfig(name="fake-model", provider="vllm", base_url=f"http://127.0.0.1:{free_port()}/v1")
    with InProcessGateway(GatewayConfig([backend], api_key="sekrit")) as gw:
        assert wait_until(lambda: httpx.get(gw.url + "/health").json()["status"] != "starting", 15)
        anonymous = httpx.get(gw.url + "/health").json()["backends"]["fake-model"]
        assert anonymous["state"] == "down" and "url" not in anonymous and "error" not in anonymous
        keyed = httpx.get(gw.url + "/health", headers={"Authorization": "Bearer sekrit"}).json()
        assert re.search(r"127\.0\.0\.1:\d+", keyed["backends"]["fake-model"]["url"])
        assert keyed["backends"]["fake-model"]["error"]
        assert httpx.get(gw.url + "/ready").status_code == 503  # no key needed either
