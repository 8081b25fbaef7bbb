"""The private connections' HTTP/1.1 transport: every generation's request goes through it.

An ``httpx.AsyncBaseTransport`` with its own small pool, over anyio streams (asyncio and trio),
reading responses with the sans-io :class:`~.http11.ResponseReader`. It replaces httpcore here
for two reasons, both measured on the gateway (docs/gateway.md):

* a streamed body costs one pass per socket read, not per HTTP chunk (httpcore/h11: an event, a
  state-machine step, a cancel scope and two generator hops per token);
* a request costs a few hundred microseconds less (no pool lock, no request-status events, no
  cancel scope where no timeout is set: only the connect timeout is, the contract owns the rest).

The stop's side of it is :class:`~.guard.SocketGuard`'s, unchanged: a new connection's raw socket
is handed to the connecting call's guard before the TLS handshake or the first byte is written,
and an idle connection taken from the pool is handed from the guard of the call that released it
to the guard of the call that takes it. A connection goes back to the pool only when its
response was read to the end under a keep-alive; a stopped, failed, cancelled or abandoned one is
closed and never comes back; so is one whose request said ``Connection: close``. An idle
connection the server has closed (or written to) is dropped when it is taken, not used; one it
closes just as the request goes out is met by sending the request once more on a new connection
(never after a stop).
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import httpx
from anyio.streams.tls import TLSStream

from ..errors import ProxyError, TLSCertificateError
from .guard import SocketGuard, current_guard
from .http11 import HTTPProtocolError, ResponseReader
from .network import DIRECT, Network, default_ssl_context, redact_url

__all__ = ["GuardedTransport", "NoResponseError"]

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024
_Origin = tuple[str, str, int]


def _origin(url: httpx.URL) -> _Origin:
    """Where a connection for ``url`` goes: its scheme, host (IDNA-encoded, no brackets), port."""
    return (url.scheme, url.raw_host.decode("ascii"), url.port or (443 if url.scheme == "https" else 80))


class NoResponseError(httpx.RemoteProtocolError):
    """The connection failed (reset, closed, or the request could not be written) before a single
    byte of a response came: the server produced nothing anyone saw, so a fleet may send the
    request to another member (``TransportError.no_response``)."""


class _Connection:
    __slots__ = ("forward", "guard", "idle_since", "origin", "sock", "stream")

    def __init__(self, stream: anyio.abc.ByteStream, sock: socket.socket | None, origin: _Origin) -> None:
        self.stream = stream
        self.sock = sock  # the socket this process dialled: the server's, or the proxy's
        self.guard: SocketGuard | None = None
        self.origin = origin
        self.idle_since = 0.0
        self.forward = False  # an http request through a proxy: absolute-form, with the proxy's headers

    def bind(self, guard: SocketGuard | None) -> None:
        """This connection now carries ``guard``'s call: its stop severs this socket, and the
        previous call's (late) stop no longer can."""
        if guard is self.guard:
            return
        if self.guard is not None:
            self.guard.detach(self.sock)
        self.guard = guard
        if guard is not None:
            guard.attach(self.sock)

    def closed_by_peer(self) -> bool:
        """Idle in the pool, the server should have sent nothing: readable means it closed (or
        broke the protocol), so the connection must not carry a request."""
        if self.sock is None:
            return False
        try:
            poller = select.poll()  # not select(): a loaded gateway's fds pass FD_SETSIZE
            poller.register(self.sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    async def aclose(self) -> None:
        if self.guard is not None:
            self.guard.detach(self.sock)  # before the fd is closed: a late stop never hits a reused fd
            self.guard = None
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await self.stream.aclose()


class GuardedTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over connections whose sockets the calls' guards can sever."""

    def __init__(self, network: Network = DIRECT, *, max_idle: int, idle_expiry: float = 5.0) -> None:
        self._network = network
        self._max_idle = max_idle
        self._idle_expiry = idle_expiry
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme!r}", request=request)
        origin = _origin(url)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        conn = await self._take_idle(origin)
        if conn is not None:
            try:
                return await self._exchange(conn, request, timeouts)
            except NoResponseError:
                # A server may close an idle keep-alive connection just as a request goes out on
                # it (uvicorn, Node and cpp-httplib time idle ones out after 5 s): nothing was
                # answered, so the request is sent once more on a new connection, as every HTTP
                # client does. Never after a stop (the sever is what failed it), and only a body
                # held in memory can be sent again.
                guard = current_guard.get()
                if (guard is not None and guard.stopping) or not isinstance(request.stream, httpx.ByteStream):
                    raise
                log.debug("%s: the reused connection closed unanswered; sending again", redact_url(str(url)))
        conn = await self._connect(request, origin, timeouts.get("connect"))
        return await self._exchange(conn, request, timeouts)

    async def reach(self, url: httpx.URL, timeout: float | None) -> None:
        """Open a connection to ``url``'s server as a request would (its proxy, its tunnel, its
        TLS) and close it, sending nothing to the server: whether it can be reached, at the cost
        of a connection it never sees a request on (the gateway's ``/health``)."""
        conn = await self._connect(httpx.Request("GET", url), _origin(url), timeout)
        await conn.aclose()

    async def _exchange(
        self, conn: _Connection, request: httpx.Request, timeouts: dict[str, float | None]
    ) -> httpx.Response:
        """Send ``request`` on ``conn`` and read the response's head; the body streams later."""
        conn.bind(current_guard.get())
        reader = ResponseReader(request.method.encode("ascii"))
        try:
            await self._send_request(conn, request, timeouts.get("write"))
            first = await self._read_head(conn, reader, request, timeouts.get("read"))
        except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError) as exc:
            await conn.aclose()
            if reader.received:
                raise
            raise NoResponseError(f"no response: {exc}", request=request) from exc
        except BaseException:
            await conn.aclose()
            raise
        head = reader.head
        assert head is not None
        if head.status == 407 and conn.forward:  # the proxy's answer, not the server's
            await conn.aclose()
            label = self._network.proxy_label
            raise ProxyError(f"proxy {label} wants credentials: 407", proxy=label, status=407)
        # a request that said "Connection: close" gets a connection of its own, never pooled
        closes = "close" in {token.strip() for token in request.headers.get("connection", "").lower().split(",")}
        return httpx.Response(
            head.status,
            headers=head.headers,
            stream=_Body(self, conn, reader, first, request, timeouts.get("read"), reuse=not closes),
            extensions={"http_version": head.version, "reason_phrase": head.reason},
        )

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await conn.aclose()

    # -- connections -------------------------------------------------------------------------

    async def _take_idle(self, origin: _Origin) -> _Connection | None:
        conns = self._idle.get(origin)
        now = time.monotonic()
        while conns:
            conn = conns.pop()  # the most recently used: the likeliest to be alive
            if now - conn.idle_since < self._idle_expiry and not conn.closed_by_peer():
                return conn
            await conn.aclose()
        return None

    async def release(self, conn: _Connection) -> None:
        """``conn`` finished a response cleanly: keep it for the next call. It stays bound to the
        guard of the call that read it until another call takes it (that call's release detaches
        it first, unless it was stopped: then its late sever closes an idle socket, which the
        next taker sees and drops)."""
        if self._closed:
            await conn.aclose()
            return
        conn.idle_since = time.monotonic()
        conns = self._idle.setdefault(conn.origin, [])
        conns.append(conn)
        if len(conns) > self._max_idle:
            await conns.pop(0).aclose()

    async def _connect(self, request: httpx.Request, origin: _Origin, timeout: float | None) -> _Connection:
        scheme, host, port = origin
        network = self._network
        proxy = network.proxy
        where = f"{host}:{port}"  # what the errors name: the server, or the proxy on the way
        tls_host = host
        dial_host, dial_port = host, port
        if proxy is not None:
            dial_host = proxy.url.raw_host.decode("ascii")
            dial_port = proxy.url.port or (443 if proxy.url.scheme == "https" else 80)
            where = f"proxy {network.proxy_label}"
        guard = current_guard.get()
        try:
            with anyio.fail_after(timeout):
                stream: anyio.abc.ByteStream = await anyio.connect_tcp(dial_host, dial_port)
                sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
                conn = _Connection(stream, sock, origin)
                # A stop from here on severs this socket — the proxy's, when there is one, which
                # takes the tunnel and the server's connection behind it down with it.
                conn.bind(guard)
                try:
                    if proxy is not None and proxy.url.scheme == "https":
                        tls_host = dial_host
                        conn.stream = await _tls(conn.stream, dial_host, network.proxy_ssl_context)
                    if proxy is not None and scheme == "https":
                        where = f"{host}:{port} through proxy {network.proxy_label}"
                        await _tunnel(conn, network, host, port, request)
                    elif proxy is not None:
                        conn.forward = True
                    if scheme == "https":
                        tls_host = host
                        conn.stream = await _tls(conn.stream, host, network.ssl_context or default_ssl_context())
                except BaseException:
                    await conn.aclose()
                    raise
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connect to {where} timed out", request=request) from exc
        except ssl.SSLCertVerificationError as exc:
            # The server answered, but is not known to be who it says: not a connection failure
            # (a retry, or another replica behind the same name, meets the same certificate).
            reason = exc.verify_message or str(exc)
            raise TLSCertificateError(
                f"TLS: the certificate of {tls_host} did not verify: {reason}", host=tls_host, reason=reason
            ) from exc
        except (OSError, ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            # refused, reset, or closed before or during the TLS handshake (an overloaded ingress,
            # an SNI it does not serve): nothing was sent — a connect failure, retried
            raise httpx.ConnectError(f"{where}: {exc or type(exc).__name__}", request=request) from exc
        return conn

    # -- one exchange ------------------------------------------------------------------------

    async def _send_request(self, conn: _Connection, request: httpx.Request, timeout: float | None) -> None:
        headers = request.headers.raw
        if conn.forward:  # through a proxy: the whole URL as the target, the proxy's credentials added
            target = str(request.url).encode("ascii")
            headers = [*self._network.proxy_headers, *headers]
        else:
            target = request.url.raw_path
        lines = [request.method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        lines.append(b"\r\n")
        chunked = request.headers.get("transfer-encoding", "").lower() == "chunked"
        data = b"".join(lines)
        try:
            with _deadline(timeout):
                if isinstance(request.stream, httpx.ByteStream):
                    body = b"".join(part for part in request.stream)  # already in memory: one write
                    await conn.stream.send(data + (_chunk(body) + b"0\r\n\r\n" if chunked and body else body))
                    return
                await conn.stream.send(data)
                async for part in request.stream:  # type: ignore[union-attr]
                    if part:
                        await conn.stream.send(_chunk(part) if chunked else part)
                if chunked:
                    await conn.stream.send(b"0\r\n\r\n")
        except TimeoutError as exc:
            raise httpx.WriteTimeout("write timed out", request=request) from exc
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc

    async def _read_head(
        self, conn: _Connection, reader: ResponseReader, request: httpx.Request, timeout: float | None
    ) -> bytes:
        """Read until the head is in; return the body bytes that came with it."""
        while True:
            body = await _read_more(conn, reader, request, timeout)
            if reader.head is not None:
                return body


class _Body(httpx.AsyncByteStream):
    """The response body: yields, per socket read, every body byte that read completed."""

    def __init__(
        self,
        transport: GuardedTransport,
        conn: _Connection,
        reader: ResponseReader,
        first: bytes,
        request: httpx.Request,
        timeout: float | None,
        *,
        reuse: bool,
    ) -> None:
        self._transport = transport
        self._reuse = reuse
        self._conn: _Connection | None = conn
        self._reader = reader
        self._first = first
        self._request = request
        self._timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn, reader = self._conn, self._reader
        if conn is None:
            raise httpx.StreamClosed()
        if self._first:
            first, self._first = self._first, b""
            yield first
        while not reader.complete:
            body = await _read_more(conn, reader, self._request, self._timeout)
            if body:
                yield body

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._reuse and self._reader.reusable:
            await self._transport.release(conn)
        else:  # stopped, failed, abandoned or not keep-alive (either side's): never reused
            await conn.aclose()


async def _read_more(conn: _Connection, reader: ResponseReader, request: httpx.Request, timeout: float | None) -> bytes:
    """One read into ``reader``: the body bytes it completed. At the connection's end the reader
    says whether that was the response's end (a body that runs to the close) or a cut (raised)."""
    data = await _receive(conn, request, timeout)
    try:
        if not data:
            reader.feed_eof()  # returns only when the body ran to the close: it is complete
            return b""
        return reader.feed(data)
    except HTTPProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc


async def _receive(conn: _Connection, request: httpx.Request, timeout: float | None) -> bytes:
    """The next bytes from the connection; ``b""`` at its end (a sever included)."""
    try:
        if timeout is None:  # the usual case: no cancel scope per read
            return await conn.stream.receive(READ_SIZE)
        with anyio.fail_after(timeout):
            return await conn.stream.receive(READ_SIZE)
    except anyio.EndOfStream:
        return b""
    except TimeoutError as exc:
        raise httpx.ReadTimeout("read timed out", request=request) from exc
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, ssl.SSLError) as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc


async def _tls(stream: anyio.abc.ByteStream, host: str, context: ssl.SSLContext | None) -> anyio.abc.ByteStream:
    return await TLSStream.wrap(stream, hostname=host, ssl_context=context, standard_compatible=False)


async def _tunnel(conn: _Connection, network: Network, host: str, port: int, request: httpx.Request) -> None:
    """``CONNECT host:port`` on the proxy connection; returns once the proxy says the tunnel is
    open (any 2xx), as httpcore does. A proxy that could not reach the server (502/503/504) is a
    connect failure, retried; any other refusal (407 credentials, 403 policy) is a
    :class:`~abstract_client.errors.ProxyError`, not retried."""
    target = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode("ascii")
    lines = [b"CONNECT ", target, b" HTTP/1.1\r\nHost: ", target, b"\r\nAccept: */*\r\n"]
    for name, value in network.proxy_headers:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    await conn.stream.send(b"".join(lines))
    reader = ResponseReader(b"CONNECT")
    while reader.head is None:
        data = await conn.stream.receive(READ_SIZE)  # EndOfStream: the proxy closed, a connect failure
        try:
            reader.feed(data)
        except HTTPProtocolError as exc:
            raise httpx.ConnectError(
                f"proxy {network.proxy_label}: not an HTTP answer to CONNECT: {exc}", request=request
            ) from exc
    head = reader.head
    answer = f"{head.status} {head.reason.decode('latin-1')}".strip()
    label = network.proxy_label
    if head.status in (502, 503, 504):
        raise httpx.ConnectError(f"proxy {label} could not reach {host}:{port}: {answer}", request=request)
    if not 200 <= head.status < 300:
        raise ProxyError(f"proxy {label} refused CONNECT {host}:{port}: {answer}", proxy=label, status=head.status)
    if reader.surplus:  # the server speaks after our TLS hello, never before it
        raise httpx.ConnectError(f"proxy {label} sent bytes ahead of the tunnel", request=request)


def _deadline(timeout: float | None) -> Any:
    return contextlib.nullcontext() if timeout is None else anyio.fail_after(timeout)


def _chunk(part: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(part), part)
