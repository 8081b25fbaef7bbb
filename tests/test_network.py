"""Network settings on real components: a forward proxy (tinyproxy), TLS termination and client
certificates (nginx), certificates made in the test (trustme) — and the stop through all of them.

* ``proxy=`` and the environment's proxies (``trust_env=True``, chosen exactly as httpx chooses
  them: compared with httpx itself); http forwarded, https through ``CONNECT``; the proxy's log
  is the evidence of what went through it.
* ``verify=`` / ``SSL_CERT_FILE`` / ``cert=`` read per client; a missing CA file is a clear error at
  ``create_llm``.
* A stop through the proxy, streaming and not, http and https, and during ``CONNECT``: the
  upstream server (behind the proxy, and behind nginx for https) records the disconnect.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from abstract_client import (
    AbortController,
    GenerationCancelledError,
    ProxyError,
    TLSCertificateError,
    create_llm,
)
from abstract_client.http.network import NetworkSettings, resolve_network
from abstract_client.testing import FakeOpenAIServer

from .helpers import wait_until
from .network_servers import Certificates, Nginx, Tinyproxy

PROXY_VARS = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
)
SSL_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS + SSL_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Tinyproxy]:
    server = Tinyproxy(tmp_path)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates.make(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=4000) as server:
        yield server


@pytest.fixture
def tls(tmp_path: Path, certs: Certificates, upstream: FakeOpenAIServer) -> Iterator[Nginx]:
    front = Nginx(tmp_path, certs, upstream.port)
    yield front
    front.stop()


def v1(url: str) -> str:
    return url + "/v1"


# -- which proxy: exactly httpx's choice ---------------------------------------------------------

ENVIRONMENTS: list[dict[str, str]] = [
    {"HTTP_PROXY": "http://p1:3128"},
    {"https_proxy": "http://p2:3128"},
    {"ALL_PROXY": "http://p3:3128", "NO_PROXY": "localhost,127.0.0.1"},
    {"HTTP_PROXY": "http://p1:3128", "HTTPS_PROXY": "http://p2:3128", "no_proxy": ".corp.example"},
    {"all_proxy": "p4:8080", "no_proxy": "corp.example,::1"},
    {"HTTP_PROXY": "http://p1:3128", "NO_PROXY": "*"},
    {"ALL_PROXY": "http://p3:3128", "HTTPS_PROXY": "https://p5:443", "NO_PROXY": "http://llm.corp.example"},
    {"HTTPS_PROXY": "http://u:pw@p6:3128", "NO_PROXY": "10.0.0.7"},
]
URLS = [
    "http://127.0.0.1:8080/v1",
    "https://127.0.0.1:8443/v1",
    "http://localhost:11434",
    "https://llm.corp.example/v1",
    "http://llm.corp.example/v1",
    "https://corp.example/v1",
    "http://[::1]:8080/v1",
    "http://10.0.0.7:8000/v1",
    "https://api.example.com/v1",
]


def httpx_choice(url: str) -> str | None:
    """The proxy an ``httpx.AsyncClient(trust_env=True)`` sends ``url`` through."""
    client = httpx.AsyncClient(trust_env=True)
    transport = client._transport_for_url(httpx.URL(url))
    if transport is client._transport:
        return None
    proxy_url = transport._pool._proxy_url  # type: ignore[attr-defined]
    return f"{proxy_url.scheme.decode()}://{proxy_url.host.decode()}:{proxy_url.port}"


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_the_environments_proxy_is_chosen_exactly_as_httpx_chooses_it(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for url in URLS:
        ours = resolve_network(url).proxy
        chosen = None if ours is None else f"{ours.url.scheme}://{ours.url.host}:{ours.url.port}"
        assert chosen == httpx_choice(url), url
        assert resolve_network(url, NetworkSettings(trust_env=False)).proxy is None


def test_an_explicit_proxy_applies_to_every_url_as_in_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "*")
    network = resolve_network("http://127.0.0.1:8080/v1", NetworkSettings(proxy="http://bob:pw@corp:3128"))
    assert network.proxy is not None and network.proxy_label == "http://corp:3128"
    assert dict(network.proxy_headers)[b"Proxy-Authorization"] == b"Basic Ym9iOnB3"  # bob:pw


def test_a_socks_proxy_is_refused_at_create_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="socks5 proxy"):
        create_llm("openai-compatible", "m", base_url="http://10.1.2.3:8080/v1", proxy="socks5://bob:pw@corp:1080")
    monkeypatch.setenv("ALL_PROXY", "socks5://corp:1080")
    with pytest.raises(ValueError, match="the environment") as info:
        create_llm("openai-compatible", "m", base_url="http://10.1.2.3:8080/v1")
    assert "pw" not in str(info.value)
    monkeypatch.setenv("NO_PROXY", "10.1.2.3")  # a proxy that does not apply is no error
    create_llm("openai-compatible", "m", base_url="http://10.1.2.3:8080/v1").close()


# -- through a real proxy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "proxy",
    [
        "user:S3cret-pw@127.0.0.1:3128",  # no scheme
        "http://user:S3c/ret-pw@127.0.0.1:3128",  # a "/" in the password: httpx reads a port
        "http://user:S3c#ret-pw@127.0.0.1:3128",
        "http://user:S3cret-pw@127.0.0.1:99999",  # a port no socket can have
    ],
)
def test_a_bad_proxy_url_is_refused_at_create_llm_without_its_password(proxy: str) -> None:
    """#48: each was accepted, or refused with the password in the message; port 99999 failed
    every call later as an OverflowError inside an ExceptionGroup."""
    with pytest.raises(ValueError) as info:
        create_llm("openai-compatible", "m", base_url="http://127.0.0.1:9/v1", proxy=proxy)
    assert "S3c" not in str(info.value) and "ret-pw" not in str(info.value), str(info.value)
    assert "proxy=" in str(info.value)


def test_network_settings_never_show_a_proxy_password() -> None:
    settings = NetworkSettings(proxy="http://user:S3cret-pw@127.0.0.1:3128")
    network = resolve_network("http://127.0.0.1:9", settings)
    assert network.proxy_headers[0][0] == b"Proxy-Authorization"  # still sent to the proxy
    for text in (repr(settings), repr(network), str(settings), str(network)):
        assert "S3cret" not in text and "Basic" not in text and "dXNlcjpTM2NyZXQtcHc" not in text, text


@pytest.mark.parametrize("via", ["proxy=", "HTTP_PROXY"])
def test_http_goes_through_the_proxy(
    via: str, proxy: Tinyproxy, upstream: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.behavior.token_delay = 0.0
    options: dict[str, Any] = {"proxy": proxy.url()} if via == "proxy=" else {}
    if via == "HTTP_PROXY":
        monkeypatch.setenv("HTTP_PROXY", proxy.url())
    with create_llm("openai-compatible", "fake-model", base_url=v1(upstream.url), max_retries=0, **options) as llm:
        llm.wait_ready(timeout=10)
        assert llm.generate("hi", max_tokens=3).content == "tok0 tok1 tok2 "
        assert "".join(c.delta for c in llm.stream("hi", max_tokens=3)) == "tok0 tok1 tok2 "
    target = f"http://127.0.0.1:{upstream.port}/v1"
    assert wait_until(lambda: proxy.requests().count(f"POST {target}/chat/completions") == 2), proxy.requests()
    assert f"GET {target}/models" in proxy.requests()  # the readiness probe took the same way
    assert len(upstream.requests("/v1/chat/completions")) == 2


def test_proxy_credentials_go_to_the_proxy_only(tmp_path: Path, upstream: FakeOpenAIServer) -> None:
    guarded = Tinyproxy(tmp_path, auth=("bob", "s3cret"))
    try:
        upstream.behavior.token_delay = 0.0
        url = v1(upstream.url)
        with create_llm("openai-compatible", "fake-model", base_url=url, proxy=guarded.url("bob:s3cret")) as llm:
            assert llm.generate("hi", max_tokens=2).content == "tok0 tok1 "
        record = upstream.requests("/v1/chat/completions")[0]
        assert "proxy-authorization" not in record.headers  # the proxy took it off
        assert "s3cret" not in repr(record.body)
        with create_llm("openai-compatible", "fake-model", base_url=url, proxy=guarded.url()) as llm:
            # (a GET: tinyproxy answers 407 and closes, and a request body it left unread would
            # turn its close into a reset that can overtake the 407)
            with pytest.raises(ProxyError) as info:
                llm.list_models()
        assert info.value.status == 407 and not info.value.retryable
        assert len(upstream.requests("/v1/chat/completions")) == 1  # nothing more reached the server
    finally:
        guarded.stop()


def test_https_goes_through_a_connect_tunnel(proxy: Tinyproxy, tls: Nginx, certs: Certificates) -> None:
    with create_llm(
        "openai-compatible", "fake-model", base_url=v1(tls.url), proxy=proxy.url(), verify=str(certs.ca_pem)
    ) as llm:
        assert llm.generate("hi", max_tokens=2).content.startswith("tok0")
    assert f"CONNECT 127.0.0.1:{tls.port}" in proxy.requests()


def test_a_connect_the_proxy_refuses_is_typed(proxy: Tinyproxy, certs: Certificates) -> None:
    dead = f"https://127.0.0.1:{socket_port_nobody_listens_on()}/v1"
    with create_llm(
        "openai-compatible", "m", base_url=dead, max_retries=0, proxy=proxy.url(), verify=str(certs.ca_pem)
    ) as llm:
        with pytest.raises(Exception) as info:
            llm.generate("hi")
    # tinyproxy answers a CONNECT it cannot complete with 500: the proxy refused, nothing was sent
    assert isinstance(info.value, (ProxyError, ConnectionError)), repr(info.value)
    assert "127.0.0.1" in str(info.value)


def socket_port_nobody_listens_on() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- TLS settings, per client ---------------------------------------------------------------------


def test_verify_chooses_the_cas(tls: Nginx, certs: Certificates) -> None:
    url = v1(tls.url)
    with create_llm("openai-compatible", "fake-model", base_url=url) as llm:  # certifi's CAs: unknown issuer
        with pytest.raises(TLSCertificateError) as info:
            llm.generate("hi", max_tokens=1)
    assert info.value.host == "127.0.0.1" and not info.value.retryable
    context = ssl.create_default_context(cafile=str(certs.ca_pem))
    for verify in (str(certs.ca_pem), context, False):
        with create_llm("openai-compatible", "fake-model", base_url=url, verify=verify) as llm:
            assert llm.generate("hi", max_tokens=1).content == "tok0 ", verify


def test_ssl_cert_file_is_read_per_client(
    tls: Nginx, certs: Certificates, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = v1(tls.url)
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca_pem))
    trusting = create_llm("openai-compatible", "fake-model", base_url=url)
    other = tmp_path / "other-ca.pem"
    other.write_bytes(certs.client_ca_pem.read_bytes())
    monkeypatch.setenv("SSL_CERT_FILE", str(other))  # the next client reads the new value
    distrusting = create_llm("openai-compatible", "fake-model", base_url=url)
    ignoring = create_llm("openai-compatible", "fake-model", base_url=url, trust_env=False)
    with trusting, distrusting, ignoring:
        assert trusting.generate("hi", max_tokens=1).content == "tok0 "
        with pytest.raises(TLSCertificateError):
            distrusting.generate("hi", max_tokens=1)
        with pytest.raises(TLSCertificateError):
            ignoring.generate("hi", max_tokens=1)


def test_a_missing_ca_file_is_a_clear_error_at_create_llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = str(tmp_path / "nope.pem")
    monkeypatch.setenv("SSL_CERT_FILE", missing)
    with pytest.raises(ValueError, match=r"SSL_CERT_FILE.*does not exist"):
        create_llm("openai-compatible", "m", base_url="https://127.0.0.1:9/v1")
    create_llm("openai-compatible", "m", base_url="https://127.0.0.1:9/v1", trust_env=False).close()
    with pytest.raises(ValueError, match=r"verify=.*does not exist"):
        create_llm("openai-compatible", "m", base_url="https://127.0.0.1:9/v1", verify=missing)
    with pytest.raises(ValueError, match=r"cert=.*does not exist"):
        create_llm(
            "openai-compatible", "m", base_url="https://127.0.0.1:9/v1", cert=(missing, missing), trust_env=False
        )


def test_a_client_certificate_is_sent(tmp_path: Path, certs: Certificates, upstream: FakeOpenAIServer) -> None:
    front = Nginx(tmp_path, certs, upstream.port, client_certs=True)
    try:
        url, ca = v1(front.url), str(certs.ca_pem)
        with create_llm("openai-compatible", "fake-model", base_url=url, verify=ca, max_retries=0) as llm:
            with pytest.raises(Exception, match="No required SSL certificate was sent"):
                llm.generate("hi", max_tokens=1)
        cert = (str(certs.client_pem), str(certs.client_key))
        with create_llm("openai-compatible", "fake-model", base_url=url, verify=ca, cert=cert) as llm:
            assert llm.generate("hi", max_tokens=1).content == "tok0 "
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(*cert)
        with create_llm("openai-compatible", "fake-model", base_url=url, verify=context) as llm:
            assert llm.generate("hi", max_tokens=1).content == "tok0 "
    finally:
        front.stop()


# -- the stop through the proxy ---------------------------------------------------------------------


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc
            out["raised_at"] = time.perf_counter()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize(
    ("scheme", "streaming", "over_stream"),
    [
        ("http", True, False),
        ("http", False, True),
        ("https", True, False),
        ("https", False, True),
        ("https", False, False),
    ],
    ids=["http-stream", "http-generate", "https-stream", "https-generate", "https-generate-plain"],
)
def test_a_stop_through_the_proxy_reaches_the_server(
    scheme: str,
    streaming: bool,
    over_stream: bool,
    proxy: Tinyproxy,
    upstream: FakeOpenAIServer,
    tmp_path: Path,
    certs: Certificates,
) -> None:
    front = Nginx(tmp_path, certs, upstream.port) if scheme == "https" else None
    try:
        url = v1(front.url if front else upstream.url)
        llm = create_llm(
            "openai-compatible",
            "fake-model",
            base_url=url,
            proxy=proxy.url(),
            verify=str(certs.ca_pem),
            complete_over_stream=over_stream,  # as the llamacpp, vllm, ollama, lmstudio lanes do
        )
        controller = AbortController()

        def call() -> str:
            if streaming:
                return "".join(c.delta for c in llm.stream("hi", max_tokens=3000, signal=controller.signal))
            return llm.generate("hi", max_tokens=3000, signal=controller.signal).content

        thread, out = run_in_thread(call)
        record = upstream.wait_for_request(path="/v1/chat/completions", timeout=30)
        assert wait_until(lambda: record.tokens_sent >= 3 or record.completed, timeout=30)
        pressed = time.perf_counter()
        controller.abort()
        thread.join(10)
        assert isinstance(out.get("error"), GenerationCancelledError), out
        seen = upstream.wait_for_disconnect(record, timeout=10)  # the server's own record
        assert not record.completed and record.tokens_sent < 3000
        assert out["raised_at"] - pressed < 2.0 and seen - pressed < 5.0  # generous: 2 noisy cores
        llm.close()
    finally:
        if front:
            front.stop()
    method = "CONNECT" if scheme == "https" else "POST"
    assert any(r.startswith(method) for r in proxy.requests())


class StuckProxy:
    """A "proxy" that reads a CONNECT and never answers it; records when the client left."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.got_connect = threading.Event()
        self.left_at: float | None = None
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self._sock.accept()
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(4096)
        self.got_connect.set()
        if conn.recv(4096) == b"":  # blocks until the client closes: EOF
            self.left_at = time.perf_counter()
        conn.close()

    def close(self) -> None:
        self._sock.close()


def test_a_stop_during_connect_severs_the_proxy_connection() -> None:
    stuck = StuckProxy()
    try:
        llm = create_llm(
            "openai-compatible", "m", base_url="https://llm.example.test/v1", proxy=f"http://127.0.0.1:{stuck.port}"
        )
        controller = AbortController()
        thread, out = run_in_thread(lambda: llm.generate("hi", signal=controller.signal))
        assert stuck.got_connect.wait(15)
        pressed = time.perf_counter()
        controller.abort()
        thread.join(10)
        assert isinstance(out.get("error"), GenerationCancelledError), out
        assert wait_until(lambda: stuck.left_at is not None, timeout=10)
        assert stuck.left_at is not None and stuck.left_at - pressed < 5.0
        llm.close()
    finally:
        stuck.close()


class NonReader:
    """A server that reads a request's head and never its body (busy, or not interested): a
    client's FIN queued behind its unsent body would never reach it. Records what poll() shows
    of the client after the stop."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.got_head = threading.Event()
        self.conn: socket.socket | None = None
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self._sock.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(1)  # byte by byte: nothing of the body is read
        self.conn = conn
        self.got_head.set()

    def client_gone(self) -> bool:
        """The server can tell the client left (a reset, or a FIN it can reach), without reading."""
        assert self.conn is not None
        poller = select.poll()
        poller.register(self.conn, select.POLLERR | select.POLLHUP | select.POLLRDHUP)
        return any(event & (select.POLLERR | select.POLLHUP | select.POLLRDHUP) for _, event in poller.poll(0))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self._sock.close()


def test_a_stop_reaches_a_server_that_never_reads_the_body() -> None:
    server = NonReader()
    try:
        llm = create_llm("openai-compatible", "m", base_url=f"http://127.0.0.1:{server.port}/v1", max_retries=0)
        controller = AbortController()
        big = "word " * (8 * 2**20 // 5)  # 8 MiB: far more than the socket buffers hold
        thread, out = run_in_thread(lambda: llm.generate(big, signal=controller.signal))
        assert server.got_head.wait(15)
        assert not server.client_gone()
        controller.abort()
        thread.join(10)
        assert isinstance(out.get("error"), GenerationCancelledError), out
        assert wait_until(server.client_gone, timeout=10), "the stop never reached the server"
        llm.close()
    finally:
        server.close()


# -- the remote lane's cancel takes the same way -----------------------------------------------------


def test_the_remote_lanes_cancel_goes_through_the_proxy(proxy: Tinyproxy, upstream: FakeOpenAIServer) -> None:
    llm = create_llm("remote", "fake-model", base_url=v1(upstream.url), proxy=proxy.url())
    stream = llm.stream("hi", max_tokens=3000)
    first = next(iter(stream))
    assert first is not None
    llm.cancel(stream.request_id)
    cancel = f"POST http://127.0.0.1:{upstream.port}/v1/requests/{stream.request_id}/cancel"
    assert wait_until(lambda: cancel in proxy.requests(), timeout=10), proxy.requests()
    with pytest.raises(GenerationCancelledError):
        for _ in stream:
            pass
    llm.close()
