"""abstract_client.sdk on a company network, with real components: openai-python through a forward
proxy (tinyproxy) to a TLS server (nginx, a CA made here) — the network settings given to
``sdk.http_client()`` are honoured, and a stop still reaches the server through the tunnel (the
upstream behind nginx records the disconnect)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from abstract_client import GenerationCancelledError, sdk
from abstract_client.testing import FakeOpenAIServer

from .helpers import press_when
from .network_servers import Certificates, Nginx, Tinyproxy

CHAT = [{"role": "user", "content": "Tell me a long story"}]


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=4000) as server:
        yield server


@pytest.fixture
def network(tmp_path: Path, upstream: FakeOpenAIServer) -> Iterator[tuple[Tinyproxy, Nginx, Certificates]]:
    certs = Certificates.make(tmp_path / "certs")
    proxy = Tinyproxy(tmp_path)
    tls = Nginx(tmp_path, certs, upstream.port)
    yield proxy, tls, certs
    tls.stop()
    proxy.stop()


def test_openai_through_a_proxy_tunnel_to_a_private_ca_stops_at_the_server(
    network: tuple[Tinyproxy, Nginx, Certificates], upstream: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, tls, certs = network
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    http = sdk.http_client(proxy=proxy.url(), verify=str(certs.ca_pem))
    client = openai.OpenAI(base_url=f"{tls.url}/v1", api_key="k", http_client=http)
    answer = client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "tok0 tok1 "
    assert f"CONNECT 127.0.0.1:{tls.port}" in proxy.requests()

    stop = threading.Event()
    before = len(upstream.requests())
    press = press_when(lambda: len(upstream.requests()) > before and upstream.last.tokens_sent >= 5, stop.set)
    with pytest.raises(GenerationCancelledError), sdk.stop_on(stop):
        client.chat.completions.create(model="fake-model", messages=CHAT)  # type: ignore[arg-type]
    assert time.perf_counter() - press.wait() < 2.0
    record = upstream.last
    upstream.wait_for_disconnect(record, 10)  # through the tunnel and nginx, as the lanes' stops go
    assert record.tokens_sent_after(press.wait()) < 100 and not record.completed
    assert len(upstream.requests()) == before + 1  # not retried

    with pytest.raises(openai.APIConnectionError):  # the CA is the one that makes it trusted
        openai.OpenAI(
            base_url=f"{tls.url}/v1", api_key="k", max_retries=0, http_client=sdk.http_client(proxy=proxy.url())
        ).chat.completions.create(model="fake-model", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
    client.close()
