"""One HTTP client per event loop for one base URL: every request an HTTP lane makes.

Every request — generations, model management, embeddings, health probes — goes through the
same :class:`~.transport.GuardedTransport` and so the same :class:`~.network.Network` (proxy,
TLS settings): one HTTP stack. Its connections are HTTP/1.1 whose sockets the call using one can
sever on stop (only a closed connection tells a server to stop: httpcore sends no HTTP/2 stream
reset). A connection is reused only after a call read its answer to the end and released it
cleanly (``guard.detach``); one that was stopped, failed or abandoned is severed and never comes
back.

httpx clients belong to the event loop that first used them, and the sync API runs on its own
loop thread, so clients are kept per loop.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import httpx

from .._validate import check_base_url
from ..stopping.loop import loop_key
from .json_encode import encode_json, long_strings
from .mapping import map_transport_error
from .network import Network, NetworkSettings, resolve_network
from .transport import GuardedTransport

__all__ = ["KEEPALIVE", "HttpClients"]

KEEPALIVE = 16  # clean connections kept warm per loop and base URL


class HttpClients:
    """Per-event-loop pooled and private ``httpx.AsyncClient`` for one base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        connect_timeout: float | None = 10.0,
        network: NetworkSettings | None = None,
    ) -> None:
        url, credentials = check_base_url(base_url)  # a ValueError at create_llm, never later
        self.base_url = url.rstrip("/")
        self.network: Network = resolve_network(self.base_url, network)  # proxy and TLS, read now
        self._headers = {**credentials, **(headers or {})}  # an explicit api_key wins
        self._timeout = httpx.Timeout(None, connect=connect_timeout)
        self._lock = threading.Lock()
        self._by_loop: weakref.WeakKeyDictionary[Any, dict[bool, httpx.AsyncClient]] = weakref.WeakKeyDictionary()
        # (a dict per loop, for the closer below: one entry, the loop's client)
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

    def get(self) -> httpx.AsyncClient:
        """This loop's client (made on first use)."""
        key = loop_key()
        with self._lock:
            clients = self._by_loop.setdefault(key, {})
            client = clients.get(True)
            if client is None:
                transport = self._private[key] = GuardedTransport(self.network, max_idle=KEEPALIVE)
                client = clients[True] = httpx.AsyncClient(
                    base_url=self.base_url,
                    headers=self._headers,
                    timeout=self._timeout,
                    transport=transport,
                    trust_env=False,  # the environment was read once, into self.network
                    follow_redirects=False,
                )
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
        if json is None:
            return _opened(transport, httpx.Request(method, url, headers=merged, extensions={"timeout": timeout}))
        merged = {**merged, "content-type": "application/json"}  # as httpx's json= (json_encode.py)

        def request(body: bytes) -> httpx.Request:
            return httpx.Request(method, url, headers=merged, content=body, extensions={"timeout": timeout})

        long = long_strings(json)  # one walk of the body, for both decisions
        if long:  # encoded on a worker thread, a piece at a time: the loop runs meanwhile
            return _opened_large(transport, request, json, long)
        return _opened(transport, request(encode_json(json, long)))

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

    async def reach(self, timeout: float) -> None:
        """Connect to the base URL's server as a call would, send nothing, close (see
        :meth:`GuardedTransport.reach`); a failure is the typed error a call's connect raises
        (``ConnectionFailedError``, ``TLSCertificateError``, ``ProxyError``, ...)."""
        try:
            await self._transport().reach(httpx.URL(self.base_url), timeout)
        except httpx.HTTPError as exc:
            raise map_transport_error(exc) from exc

    def _transport(self) -> GuardedTransport:
        client = self.get()
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


@contextlib.asynccontextmanager
async def _opened_large(
    transport: httpx.AsyncBaseTransport, request: Callable[[bytes], httpx.Request], body: Any, long: dict[int, str]
) -> AsyncIterator[httpx.Response]:
    # a stop during the encoding is not kept waiting for it: the thread's result is dropped
    encoded = await anyio.to_thread.run_sync(encode_json, body, long, abandon_on_cancel=True)
    async with _opened(transport, request(encoded)) as response:
        yield response


async def _close_on_loop_end(clients: dict[bool, httpx.AsyncClient]) -> AsyncGenerator[None, None]:
    try:
        yield
        yield  # never resumed: parked until the loop finalises it
    finally:
        for client in list(clients.values()):
            with contextlib.suppress(Exception):
                await client.aclose()
        clients.clear()
