"""A web page on the same machine is hostile to a local gateway (docs/gateway.md, "Browsers").

Over a real socket to a keyless gateway on loopback (the default): a foreign ``Host`` (DNS
rebinding), a foreign ``Origin`` on any route, ``Origin: null``, and the bodies a page can send
without a preflight (``text/plain``, forms, multipart) are refused with an OpenAI error body,
and the upstream saw nothing. Then in a real browser (Debian's Chromium): a page served from
another origin tries the attacks of #40 with ``fetch(..., {mode: "no-cors"})`` and is refused;
the gateway's own page works under its Content-Security-Policy, which no other page can frame.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from abstract_client.gateway import BackendConfig, GatewayConfig
from abstract_client.gateway.http.browsers import BrowserPolicy
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway

from .test_chat_page import browser  # noqa: F401 - the module's Chromium fixture

CHAT = "/v1/chat/completions"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.0) as server:
        yield server


def gateway_of(upstream: FakeOpenAIServer, **server: Any) -> InProcessGateway:
    backend = BackendConfig(name="fake-model", provider="vllm", model="fake-model", base_url=upstream.base_url)
    return InProcessGateway(GatewayConfig(backends=[backend], **server))


@pytest.fixture
def gw(upstream: FakeOpenAIServer) -> Iterator[InProcessGateway]:
    with gateway_of(upstream, ui=True) as gateway:
        yield gateway


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


@pytest.mark.parametrize(
    "host", ["attacker.example", "attacker.example:8000", "127.0.0.1.nip.io", "", "[::1", "localhost:x"]
)
def test_a_foreign_host_is_refused(host: str, gw: InProcessGateway, upstream: FakeOpenAIServer) -> None:
    with httpx.Client(base_url=gw.url) as client:
        refused(client.post(CHAT, json=BODY, headers={"Host": host}), 403, "host_not_allowed")
        refused(client.get("/v1/models", headers={"Host": host}), 403, "host_not_allowed")
    assert upstream.requests() == []


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1", "https://localhost"])
def test_a_foreign_origin_is_refused_on_every_route(
    origin: str, gw: InProcessGateway, upstream: FakeOpenAIServer
) -> None:
    with httpx.Client(base_url=gw.url, headers={"Origin": origin}) as client:
        refused(client.post(CHAT, json=BODY), 403, "origin_not_allowed")
        refused(client.post("/v1/models/unload", json={"model": "fake-model"}), 403, "origin_not_allowed")
        refused(client.post("/v1/requests/r1/cancel"), 403, "origin_not_allowed")
        refused(client.get("/v1/models"), 403, "origin_not_allowed")
    assert upstream.requests() == []


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""]
)
def test_a_body_a_page_can_send_without_a_preflight_is_refused(
    content_type: str, gw: InProcessGateway, upstream: FakeOpenAIServer
) -> None:
    headers = {"Content-Type": content_type}
    with httpx.Client(base_url=gw.url) as client:
        refused(client.post(CHAT, content=json.dumps(BODY), headers=headers), 415, "unsupported_media_type")
        refused(
            client.post("/v1/models/unload", content=b'{"model":"fake-model"}', headers=headers),
            415,
            "unsupported_media_type",
        )
    assert upstream.requests() == []


def test_the_gateways_own_page_and_allowed_origins_pass(upstream: FakeOpenAIServer) -> None:
    with gateway_of(upstream, allowed_origins=["https://app.example"], allowed_hosts=["llm.internal"]) as gw:
        with httpx.Client(base_url=gw.url) as client:
            own = f"http://127.0.0.1:{gw.port}"
            assert client.post(CHAT, json=BODY, headers={"Origin": own}).status_code == 200
            assert client.post(CHAT, json=BODY, headers={"Origin": "https://app.example"}).status_code == 200
            assert client.get("/v1/models", headers={"Host": f"llm.internal:{gw.port}"}).status_code == 200
            assert client.get("/v1/models", headers={"Host": f"localhost:{gw.port}"}).status_code == 200
            charset = {"Content-Type": "application/json; charset=utf-8"}
            assert client.post(CHAT, content=json.dumps(BODY), headers=charset).status_code == 200
    with gateway_of(upstream, allowed_hosts=["*"]) as gw, httpx.Client(base_url=gw.url) as client:
        assert client.get("/v1/models", headers={"Host": "anything.example"}).status_code == 200


def test_the_policy_reads_hosts_as_browsers_send_them() -> None:
    policy = BrowserPolicy.of("0.0.0.0", ["LLM.Internal"], [])
    assert policy.refusal("GET", {b"host": b"[::1]:8000"}) is None
    assert policy.refusal("GET", {b"host": b"llm.internal"}) is None
    assert policy.refusal("GET", {b"host": b"0.0.0.0:8000"}) is not None  # a wildcard bind is no name
    assert BrowserPolicy.of("10.0.0.5", [], []).refusal("GET", {b"host": b"10.0.0.5:8000"}) is None


def test_the_chat_page_cannot_be_framed_or_sniffed(gw: InProcessGateway) -> None:
    page = httpx.get(gw.url + "/")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "'unsafe-inline'" not in policy
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"


# -- in a real browser ---------------------------------------------------------------------------------

ATTACKS = """
async ([gateway, chat]) => {
  const out = {};
  const tries = {
    unload: () => fetch(gateway + "/v1/models/unload", {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"}, body: '{"model":"fake-model"}'}),
    chat: () => fetch(gateway + "/v1/chat/completions", {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"}, body: JSON.stringify(chat)}),
    read: () => fetch(gateway + "/v1/models").then(r => r.text()),
  };
  for (const [name, run] of Object.entries(tries)) {
    try { out[name] = String(await run()); } catch (e) { out[name] = "blocked: " + e; }
  }
  return out;
}
"""


class _AttackerPage(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><title>a page the user happened to open</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_page_from_another_origin_cannot_drive_the_gateway(
    browser: Any,  # noqa: F811
    gw: InProcessGateway,
    upstream: FakeOpenAIServer,
) -> None:
    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AttackerPage)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    try:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{attacker.server_address[1]}/")
        outcome = page.evaluate(ATTACKS, [gw.url, BODY])
        page.close()
    finally:
        attacker.shutdown()
    assert upstream.requests() == [], outcome  # no chat reached the backend
    assert "blocked" in outcome["read"], outcome  # no CORS: the page could not read the models
    with httpx.Client(base_url=gw.url) as client:  # the model was not unloaded: still served
        assert client.post(CHAT, json=BODY).status_code == 200


def test_the_gateways_own_page_works_under_its_policy(browser: Any, gw: InProcessGateway) -> None:  # noqa: F811
    page = browser.new_page()  # no bypass_csp: the policy the page is served with applies
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(gw.url + "/")
    page.wait_for_selector("#model option", state="attached", timeout=15_000)
    assert page.eval_on_selector_all("#model option", "os => os.length") >= 1
    assert violations == []
    page.close()
