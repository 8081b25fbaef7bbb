"""Capture a private connection's socket the moment it connects, and sever it on stop.

A blocked read cannot be interrupted from Python, and servers only stop decoding when they see the
connection close. So every private connection is made through :class:`GuardedBackend`, an httpcore
network backend that hands the raw socket to the :class:`SocketGuard` of the call that is
connecting (found through a context variable, so one client serves every call). A stop then calls
``socket.shutdown(SHUT_RDWR)`` from whichever thread requested it: the peer sees EOF at once, and
a read blocked on the socket wakes with EOF.

The guard forgets the socket before httpcore closes it, so a late stop can never shut down a
file descriptor number that the OS has already handed to someone else.

Private connections are kept alive and reused once a call has read its answer to the end (a
fresh loopback connection costs more than the rest of a small request). A reused connection
belongs to the call that writes the next request on it: :class:`_GuardedStream` re-binds itself
to the guard of the writing call (the context variable again), and the previous call's guard was
detached when it released the connection cleanly, so its late stop cannot touch it.
"""

from __future__ import annotations

import contextvars
import socket
import threading
import time
import typing

import httpcore

from ..stopping.token import Step, StopToken

__all__ = ["GuardedBackend", "SocketGuard", "current_guard"]

current_guard: contextvars.ContextVar[SocketGuard | None] = contextvars.ContextVar(
    "abstract_client_socket_guard", default=None
)


class SocketGuard:
    """Owns the socket of one call's private connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.severed_at: float | None = None
        self.connected = False
        self._requested = False
        self._shut = False

    def register(self, token: StopToken) -> None:
        """Take this guard's two steps of ``token``'s stop: tell the server, then sever."""
        token.add_hook(self.tell_server, step=Step.TELL)
        token.add_hook(self.sever, step=Step.SEVER)

    def attach(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            self.connected = True
            late = self._requested
        if late:  # the stop came while we were connecting
            self._shutdown()

    def detach(self, sock: socket.socket | None = None) -> None:
        """Forget the socket (only ``sock``, when given: a guard may have moved on to another
        connection, e.g. a retry's)."""
        with self._lock:
            if sock is None or self._sock is sock:
                self._sock = None

    def tell_server(self) -> None:
        """``shutdown(SHUT_WR)``: the server sees EOF (the FIN it would see from a full
        shutdown) while our side stays quiet, so the event loop is not woken yet — a woken sync
        caller raises first (``Step.HAND_OFF``); :meth:`sever` follows."""
        with self._lock:
            sock = self._sock
            if sock is None or self.severed_at is not None:
                return
            self.severed_at = time.perf_counter()
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def sever(self) -> None:
        """Shut the socket down in both directions (now, or the moment it connects); safe from
        any thread, any number of times. A read blocked on it wakes with EOF."""
        with self._lock:
            self._requested = True
        self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            sock = self._sock
            if sock is None or self._shut:
                return
            self._shut = True
            if self.severed_at is None:
                self.severed_at = time.perf_counter()
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed or reset by the peer: nothing left to sever
                pass


class _GuardedStream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream, guard: SocketGuard | None) -> None:
        self._inner = inner
        self._guard = guard
        self._sock: socket.socket | None = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        guard = current_guard.get()
        if guard is not self._guard and guard is not None:  # a reused connection: a new owner
            if self._guard is not None:
                self._guard.detach(self._sock)
            self._guard = guard
            guard.attach(self._sock)
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        if self._guard is not None:
            self._guard.detach(self._sock)
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: typing.Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        inner = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return _GuardedStream(inner, self._guard)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """anyio's backend (asyncio and trio), plus socket capture for the connecting call."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _guarded(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(path, timeout, socket_options)
        return _guarded(stream)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _guarded(stream: httpcore.AsyncNetworkStream) -> _GuardedStream:
    guard = current_guard.get()
    if guard is not None:  # the stop may come during the TLS handshake or the first write
        guard.attach(stream.get_extra_info("socket"))
    return _GuardedStream(stream, guard)
