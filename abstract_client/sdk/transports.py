"""The SDKs' transports: an ``httpx2`` or ``httpx`` transport (sync and async) over the library's
own connections, for the clients openai-python, the anthropic SDK and ollama-python take.

Both flavours are the same code: the SDK's request is copied into a plain ``httpx.Request`` and
sent by an :class:`~.exchange.Exchange` on a :class:`~abstract_client.http.transport.GuardedTransport`
(one per event loop and origin, with the network settings given here). A sync SDK call runs it on
one shared loop thread and waits; a stop wakes the waiting thread itself (``Step.WAKE``), so a
non-streamed call returns at once while the sever tells the server behind it.
"""

from __future__ import annotations

import concurrent.futures
import functools
import importlib
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any, NoReturn, TypeVar

import httpx

from .._sync import Portal, _on_loop
from ..http.network import NetworkSettings, resolve_network
from ..http.transport import GuardedTransport, _origin
from ..stopping.loop import loop_key
from ..stopping.token import Step
from .binding import current_binding
from .exchange import Exchange

__all__ = ["FLAVORS", "async_transport", "flavor_module", "transport"]

T = TypeVar("T")
FLAVORS = ("httpx2", "httpx")
KEEPALIVE = 16  # idle connections kept per loop and origin
_CLOSE_WAIT = 5.0
_portal = Portal()  # the loop thread every sync SDK transport's requests run on


def flavor_module(flavor: str) -> ModuleType:
    if flavor not in FLAVORS:
        raise ValueError(f"flavor must be one of {FLAVORS}, not {flavor!r}")
    module = importlib.import_module(flavor)
    for name in ("BaseTransport", "AsyncBaseTransport", "SyncByteStream", "AsyncByteStream", "Response"):
        if not hasattr(module, name):
            raise ImportError(f"{flavor} {getattr(module, '__version__', '?')} has no {name}: not an httpx-like API")
    return module


class _Connections:
    """The :class:`GuardedTransport` for each (event loop, origin), with one network setting."""

    def __init__(self, settings: NetworkSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._by_loop: weakref.WeakKeyDictionary[Any, dict[tuple[str, str, int], GuardedTransport]] = (
            weakref.WeakKeyDictionary()
        )

    def check(self) -> None:
        """A setting that cannot be honoured fails now, at construction (a bad CA path, a SOCKS
        proxy), not at the first request."""
        resolve_network("https://localhost", self._settings)

    def get(self, url: httpx.URL) -> GuardedTransport:
        origin = _origin(url)
        key = loop_key()
        with self._lock:
            transports = self._by_loop.setdefault(key, {})
            found = transports.get(origin)
            if found is None:
                base = f"{url.scheme}://{url.netloc.decode('ascii')}"
                found = transports[origin] = GuardedTransport(resolve_network(base, self._settings), max_idle=KEEPALIVE)
            return found

    async def aclose_current_loop(self) -> None:
        with self._lock:
            transports = self._by_loop.pop(loop_key(), {})
        for found in transports.values():
            await found.aclose()


def _copy(request: Any, content: bytes) -> httpx.Request:
    """The SDK's request as a plain ``httpx`` one (its body already read)."""
    return httpx.Request(
        request.method,
        str(request.url),
        headers=list(request.headers.raw),
        content=content,
        extensions={"timeout": dict(request.extensions.get("timeout") or {})},
    )


def _reraise(flavor: ModuleType, exc: BaseException, request: Any, exchange: Exchange) -> NoReturn:
    """Raise what ``exc`` means to the SDK: the stop's error as it is; any other transport
    failure as the flavour's own class of the same name, so the SDK handles it as it would from
    its default transport (a connect error is retried)."""
    if exchange.token.is_set:
        raise exc
    for cls in type(exc).__mro__:
        target = getattr(flavor, cls.__name__, None)
        if isinstance(target, type) and issubclass(target, flavor.TransportError):
            raise target(str(exc), request=request) from exc
    raise exc


def _settings(
    proxy: Any, verify: Any, cert: Any, trust_env: bool
) -> NetworkSettings:  # an httpx2.Proxy is a foreign type to the network code: its URL string
    if proxy is not None and not isinstance(proxy, str | httpx.URL | httpx.Proxy) and hasattr(proxy, "url"):
        proxy = str(proxy.url)
    return NetworkSettings(proxy=proxy, trust_env=trust_env, verify=verify, cert=cert)


def transport(
    *,
    flavor: str = "httpx2",
    proxy: Any = None,
    verify: Any = True,
    cert: Any = None,
    trust_env: bool = True,
    carry_plain_calls: bool = True,
) -> Any:
    """A sync transport (``flavor.BaseTransport``) whose requests a ``stop_on`` block stops.
    ``carry_plain_calls``: a non-streamed call in a dialect that can carry it (chat completions,
    Messages) rides its stream and is folded back into the plain body (a stop ends it at the
    server's next token, with its text); False sends it as it is."""
    module = flavor_module(flavor)
    connections = _Connections(_settings(proxy, verify, cert, trust_env))
    connections.check()
    return _sync_class(module)(module, connections, carry_plain_calls)


def async_transport(
    *,
    flavor: str = "httpx2",
    proxy: Any = None,
    verify: Any = True,
    cert: Any = None,
    trust_env: bool = True,
    carry_plain_calls: bool = True,
) -> Any:
    """An async transport (``flavor.AsyncBaseTransport``) whose requests a ``stop_on`` block
    (or a cancelled task) stops; ``carry_plain_calls`` as for :func:`transport`."""
    module = flavor_module(flavor)
    connections = _Connections(_settings(proxy, verify, cert, trust_env))
    connections.check()
    return _async_class(module)(module, connections, carry_plain_calls)


# -- sync ----------------------------------------------------------------------------------------


def _wait(
    exchange: Exchange,
    fn: Callable[[], Awaitable[T]],
    left: list[concurrent.futures.Future[Any]] | None = None,
) -> T:
    """``fn()`` on the shared loop thread; a stop wakes this thread at once with the stop error,
    while the loop unwinds the request behind it (the future left running goes in ``left``)."""
    if exchange.token.stopped_by_caller:  # stopped between two reads: no round trip to the loop
        raise exchange.stop_error()
    future: concurrent.futures.Future[T] = _on_loop(_awaited(fn), _portal.loop)
    wake = threading.Event()
    future.add_done_callback(lambda _: wake.set())
    remove = exchange.token.add_hook(wake.set, step=Step.WAKE)
    try:
        wake.wait()
    except BaseException:  # Ctrl-C while waiting: stop the request, then propagate
        exchange.token.stop("user")
        raise
    finally:
        remove()
    if not future.done():
        future.add_done_callback(_close_late)
        if left is not None:
            left.append(future)
        raise exchange.stop_error()
    return future.result()


async def _awaited(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()


def _close_late(future: concurrent.futures.Future[Any]) -> None:
    """An abandoned step ended: its error is nobody's; a response that came anyway is closed."""
    if future.cancelled() or future.exception() is not None:
        return
    result = future.result()
    if isinstance(result, httpx.Response):
        _portal.submit(result.aclose)


class _Pieces:
    """A response body's state, shared by the sync and async bodies of every flavour."""

    def __init__(self, exchange: Exchange, response: httpx.Response, request: Any) -> None:
        self._exchange, self._response, self._request = exchange, response, request
        self._pieces: AsyncIterator[bytes] = exchange.body(response)
        self._closed = self._complete = False


def _response(flavor: ModuleType, response: httpx.Response, stream: Any) -> Any:
    """The flavour's response: the head ours read, the body ``stream``."""
    reason = response.extensions.get("reason_phrase")
    return flavor.Response(
        response.status_code,
        headers=response.headers.raw,
        stream=stream,
        extensions={"http_version": b"HTTP/1.1", **({"reason_phrase": reason} if isinstance(reason, bytes) else {})},
    )


@functools.cache
def _sync_class(flavor: ModuleType) -> type:
    class SyncBody(_Pieces, flavor.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, exchange: Exchange, response: httpx.Response, request: Any) -> None:
            super().__init__(exchange, response, request)
            self._left: list[concurrent.futures.Future[Any]] = []  # a read a stop walked away from

        def __iter__(self) -> Any:
            try:
                while True:
                    try:
                        piece: bytes = _wait(self._exchange, self._pieces.__anext__, self._left)
                    except StopAsyncIteration:
                        self._complete = True
                        return
                    except Exception as exc:
                        _reraise(flavor, exc, self._request, self._exchange)
                    yield piece
            finally:
                self.close()

        def close(self) -> None:
            if self._closed:
                return
            self._closed = True
            self._exchange.release()
            if sys.is_finalizing():  # collected as the interpreter ends (a `break` nobody closed):
                self._exchange.guard.sever()  # the server is told here; no loop may run now
                return
            pieces, response = self._pieces, self._response

            async def finish() -> None:
                await pieces.aclose()  # type: ignore[attr-defined]
                await response.aclose()

            if self._complete:  # read to the end: wait the connection back into the pool
                _on_loop(finish(), _portal.loop).result(_CLOSE_WAIT)
            elif self._left:  # the read a stop left is still unwinding (the sever ends it): after it
                self._left[-1].add_done_callback(lambda _: _portal.submit(finish))
            else:  # stopped between reads, or left: the loop closes it; nobody waits on a dying socket
                _portal.submit(finish)

    class WholeBody(flavor.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, body: bytes) -> None:
            self._body = body

        def __iter__(self) -> Any:
            yield self._body

    class SyncTransport(flavor.BaseTransport):  # type: ignore[name-defined,misc]
        """Sends on the library's own connections; a ``stop_on`` source stops the request."""

        def __init__(self, module: ModuleType, connections: _Connections, carry: bool) -> None:
            self._connections, self._carry = connections, carry

        def handle_request(self, request: Any) -> Any:
            exchange = Exchange(current_binding())
            try:
                copy = _copy(request, request.read())
                sent = exchange.carried(copy) if self._carry else copy

                async def send() -> tuple[httpx.Response, tuple[httpx.Response, bytes] | None]:
                    response = await exchange.send(self._connections.get(sent.url), sent)
                    return response, await exchange.whole(response)

                try:
                    response, whole = _wait(exchange, send)
                except Exception as exc:
                    _reraise(flavor, exc, request, exchange)
            except BaseException:
                exchange.release()
                raise
            if whole is not None:  # read already, its connection back in the pool
                exchange.release()
                return _response(flavor, whole[0], WholeBody(whole[1]))
            return _response(flavor, response, SyncBody(exchange, response, request))

        def close(self) -> None:
            if _portal.running:
                _on_loop(self._connections.aclose_current_loop(), _portal.loop).result(_CLOSE_WAIT)

    return SyncTransport


# -- async ---------------------------------------------------------------------------------------


@functools.cache
def _async_class(flavor: ModuleType) -> type:
    class AsyncBody(_Pieces, flavor.AsyncByteStream):  # type: ignore[name-defined,misc]
        async def __aiter__(self) -> AsyncIterator[bytes]:
            try:
                async for piece in self._pieces:
                    yield piece
            except Exception as exc:
                _reraise(flavor, exc, self._request, self._exchange)
            finally:
                await self.aclose()

        async def aclose(self) -> None:
            if self._closed:
                return
            self._closed = True
            self._exchange.release()
            await self._pieces.aclose()  # type: ignore[attr-defined]
            await self._response.aclose()

    class AsyncWholeBody(flavor.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, body: bytes) -> None:
            self._body = body

        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield self._body

    class AsyncTransport(flavor.AsyncBaseTransport):  # type: ignore[name-defined,misc]
        """Sends on the library's own connections; a ``stop_on`` source or a cancelled task stops
        the request."""

        def __init__(self, module: ModuleType, connections: _Connections, carry: bool) -> None:
            self._connections, self._carry = connections, carry

        async def handle_async_request(self, request: Any) -> Any:
            exchange = Exchange(current_binding())
            try:
                copy = _copy(request, await request.aread())
                sent = exchange.carried(copy) if self._carry else copy
                try:
                    response = await exchange.send(self._connections.get(sent.url), sent)
                    whole = await exchange.whole(response) if sent is not copy else None
                except Exception as exc:
                    _reraise(flavor, exc, request, exchange)
            except BaseException:
                exchange.release()
                raise
            if whole is not None:  # a carried plain call, folded back: read already
                exchange.release()
                return _response(flavor, whole[0], AsyncWholeBody(whole[1]))
            return _response(flavor, response, AsyncBody(exchange, response, request))

        async def aclose(self) -> None:
            await self._connections.aclose_current_loop()

    return AsyncTransport
