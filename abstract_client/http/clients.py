"""The two kinds of HTTP client an HTTP lane uses, one pair per event loop.

* **pooled**: keep-alive connections, for calls nobody can stop mid-flight from another thread.
* **private**: HTTP/1.1 connections made by :class:`~.connection.GuardedTransport`, so the
  socket of the call using one can be severed on stop. Every generation uses these. A connection is reused
  only after a call read its answer to the end and released it cleanly (``guard.detach``); one
  that was stopped, failed or abandoned is severed and never comes back. HTTP/1.1 because only a
  closed connection tells a server to stop (httpcore sends no HTTP/2 stream reset).

httpx clients belong to the event loop that first used them, and the sync API runs on its own
loop thread, so clients are kept per loop.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx

from .._validate import check_base_url
from ..stopping.loop import loop_key
from .transport import GuardedTransport

__all__ = ["HttpClients", "PRIVATE_KEEPALIVE", "shared_ssl_context"]

PRIVATE_KEEPALIVE = 16  # clean private connections kept warm per loop and base URL
_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def shared_ssl_context() -> ssl.SSLContext:
    """The process's default ``SSLContext`` (certifi's bundle where installed), built once on first
    use."""
    # Building an SSLContext costs milliseconds; one per process serves every client.
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            _ssl_context = httpx.create_ssl_context()
        return _ssl_context


class HttpClients:
    """Per-event-loop pooled and private ``httpx.AsyncClient`` for one base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        connect_timeout: float | None = 10.0,
    ) -> None:
        url, credentials = check_base_url(base_url)  # a ValueError at create_llm, never later
        self.base_url = url.rstrip("/")
        self._headers = {**credentials, **(headers or {})}  # an explicit api_key wins
        self._timeout = httpx.Timeout(None, connect=connect_timeout)
        self._lock = threading.Lock()
        self._by_loop: weakref.WeakKeyDictionary[Any, dict[bool, httpx.AsyncClient]] = weakref.WeakKeyDictionary()
        self._private: weakref.WeakKeyDictionary[Any, GuardedTransport] = weakref.WeakKeyDictionary()
        self._urls: dict[str, httpx.URL] = {}  # parsed once per path
        self._base_headers: dict[str, str] | None = None
        self._closers: weakref.WeakKeyDictionary[Any, AsyncGenerator[None, None]] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:  # never show headers: they may carry an API key
        return f"<HttpClients {self.base_url}>"

    async def prepare(self) -> None:
        """Make sure this loop's clients get closed when the loop ends.

        There is no "loop closing" callback in asyncio or trio, but both finalise the async
        generators still alive when a run ends (``shutdown_asyncgens``): a parked generator per
        loop closes that loop's clients then, so ``asyncio.run``/``trio.run`` per call leaves no
        keep-alive connection behind.
        """
        key = loop_key()
        with self._lock:
            if key in self._closers:
                return
            closer = _close_on_loop_end(self._by_loop.setdefault(key, {}))
            self._closers[key] = closer
        await closer.__anext__()

    def get(self, *, private: bool) -> httpx.AsyncClient:
        key = loop_key()
        with self._lock:
            clients = self._by_loop.setdefault(key, {})
            client = clients.get(private)
            if client is None:
                transport: httpx.AsyncBaseTransport
                if private:
                    transport = self._private[key] = GuardedTransport(shared_ssl_context(), max_idle=PRIVATE_KEEPALIVE)
                else:
                    transport = httpx.AsyncHTTPTransport(
                        verify=shared_ssl_context(),
                        trust_env=False,
                        limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
                    )
                client = httpx.AsyncClient(
                    base_url=self.base_url,
                    headers=self._headers,
                    timeout=self._timeout,
                    transport=transport,
                    trust_env=False,
                    follow_redirects=False,
                )
                clients[private] = client
            return client

    def open(
        self,
        method: str,
        path: str,
        *,
        timeout: dict[str, float | None],
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> AbstractAsyncContextManager[httpx.Response]:
        """A generation's request on a private connection, opened when entered: the response with
        its body unread, closed (connection pooled or dropped) on exit.

        Straight to this loop's :class:`GuardedTransport`, not through ``httpx.AsyncClient.send``:
        the client's URL merge, cookie jar, auth and redirect generators and log line cost a
        generation more than the rest of its request (the gateway measured it), and a private
        connection has no use for them (no cookies, redirects refused, the key in the headers)."""
        transport = self._transport()
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self.base_url + path)
        merged = self._base_headers
        assert merged is not None  # set by _transport()
        if headers:
            merged = {**merged, **{k.lower(): v for k, v in headers.items()}}
        request = httpx.Request(method, url, headers=merged, json=json, extensions={"timeout": timeout})
        return _opened(transport, request)

    async def fetch(
        self,
        method: str,
        path: str,
        *,
        timeout: dict[str, float | None],
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Like :meth:`open`, with the whole body read (the connection released)."""
        async with self.open(method, path, timeout=timeout, json=json, headers=headers) as response:
            await response.aread()
        return response

    def _transport(self) -> GuardedTransport:
        client = self.get(private=True)
        if self._base_headers is None:  # httpx's defaults (User-Agent, Accept-Encoding, ...) + ours
            self._base_headers = {k.lower(): v for k, v in client.headers.items()}
        return self._private[loop_key()]

    async def aclose_current_loop(self) -> None:
        """Close this loop's clients (clients of other loops are closed on their own loops)."""
        try:
            key = loop_key()
        except Exception:
            return
        with self._lock:
            clients = self._by_loop.pop(key, {})
            self._closers.pop(key, None)
            self._private.pop(key, None)
        for client in list(clients.values()):
            await client.aclose()
        clients.clear()


@contextlib.asynccontextmanager
async def _opened(transport: httpx.AsyncBaseTransport, request: httpx.Request) -> AsyncIterator[httpx.Response]:
    response = await transport.handle_async_request(request)
    response.request = request
    try:
        yield response
    finally:
        await response.aclose()


async def _close_on_loop_end(clients: dict[bool, httpx.AsyncClient]) -> AsyncGenerator[None, None]:
    try:
        yield
        yield  # never resumed: parked until the loop finalises it
    finally:
        for client in list(clients.values()):
            with contextlib.suppress(Exception):
                await client.aclose()
        clients.clear()
