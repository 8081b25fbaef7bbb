"""TLS failures on real loopback sockets, each a typed error a caller (and a fleet) can act on:

* a certificate that does not verify (here: issued by a CA made in the test, which the client
  does not trust) is :class:`TLSCertificateError` — naming the host and the reason, never
  retried, never failed over (another try meets the same certificate);
* a handshake the server closes or resets (an overloaded ingress, an SNI it does not serve) is
  :class:`ConnectionFailedError`: nothing was sent, so it is retried, and a fleet fails over.

Certificates come from ``trustme`` (made in the test, never written outside its temp dir).
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest

from abstract_client import (
    ConnectionFailedError,
    Fleet,
    NetworkError,
    ServerUnavailableError,
    TLSCertificateError,
    create_llm,
)
from abstract_client.testing import FakeOpenAIServer

from .helpers import require_module

trustme = require_module("trustme", "dev")


class TLSListener:
    """A loopback listener whose every connection goes to ``handle(sock)`` on its own thread;
    counts the connections it accepted (the evidence of a retry, or of none)."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.accepted = 0
        self._handle = handle
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._closed = True
        self._sock.close()


@pytest.fixture
def listener() -> Iterator[Callable[[Callable[[socket.socket], None]], TLSListener]]:
    made: list[TLSListener] = []

    def make(handle: Callable[[socket.socket], None]) -> TLSListener:
        made.append(TLSListener(handle))
        return made[-1]

    yield make
    for one in made:
        one.close()


def handshake_with(cert_of: trustme.LeafCert) -> Callable[[socket.socket], None]:
    """A server that completes (or fails) the handshake with ``cert_of``, then waits briefly."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert_of.configure_cert(context)

    def handle(conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    return handle


def reset_during_the_handshake(conn: socket.socket) -> None:
    conn.settimeout(10)
    conn.recv(64)  # part of the ClientHello, then gone: closed with unread bytes, a reset


def close_during_the_handshake(conn: socket.socket) -> None:
    conn.settimeout(10)
    conn.recv(65536)  # the whole ClientHello, then a clean close: the client reads EOF
    conn.settimeout(0.2)
    try:
        while conn.recv(65536):
            pass
    except TimeoutError:
        pass
    conn.shutdown(socket.SHUT_WR)


HANDSHAKE_ENDS = [reset_during_the_handshake, close_during_the_handshake]


def test_a_certificate_that_does_not_verify_is_typed_and_never_retried(listener: Callable[..., TLSListener]) -> None:
    ca = trustme.CA()  # a CA the client does not trust
    server = listener(handshake_with(ca.issue_cert("127.0.0.1", "localhost")))
    with create_llm("openai-compatible", "m", base_url=server.url, max_retries=2) as llm:
        with pytest.raises(TLSCertificateError) as info:
            llm.generate("hi", max_tokens=3)
    err = info.value
    assert isinstance(err, NetworkError) and isinstance(err, ConnectionError)
    assert not isinstance(err, ServerUnavailableError) and not err.retryable
    assert err.host == "127.0.0.1" and "certificate" in err.reason.lower(), (err.host, err.reason)
    assert "127.0.0.1" in str(err) and err.reason in str(err)
    assert server.accepted == 1  # not retried: a retry meets the same certificate


@pytest.mark.parametrize("end", HANDSHAKE_ENDS, ids=["reset", "eof"])
def test_a_handshake_the_server_closes_is_a_connect_failure_retried(
    listener: Callable[..., TLSListener], end: Callable[[socket.socket], None]
) -> None:
    server = listener(end)
    with create_llm("openai-compatible", "m", base_url=server.url, max_retries=2) as llm:
        with pytest.raises(ConnectionFailedError) as info:
            llm.generate("hi", max_tokens=3)
    assert info.value.retryable
    assert server.accepted == 3  # the first try and its two retries: nothing was ever sent


@pytest.mark.parametrize("end", HANDSHAKE_ENDS, ids=["reset", "eof"])
def test_a_fleet_fails_over_from_a_closed_handshake(
    listener: Callable[..., TLSListener], end: Callable[[socket.socket], None]
) -> None:
    closing = listener(end)
    with FakeOpenAIServer() as good:
        members = [
            create_llm("openai-compatible", "m", base_url=closing.url),
            create_llm("openai-compatible", "fake-model", base_url=good.base_url),
        ]
        with Fleet(members, policy="round_robin", max_attempts=2) as fleet:
            answers = [fleet.generate("hi", max_tokens=2).content for _ in range(4)]
    assert answers == ["tok0 tok1 "] * 4  # every call answered: the closed handshakes failed over
    assert closing.accepted >= 1
