"""A client's departure: the one place where the gateway learns that a client left, and stops
its request.

A request's :func:`watch_client` gathers every sign of the departure, and the first one to
arrive stops the request's flight (the others find it stopped):

1. **The departure thread** (Linux, the gateway's own server). Under load the gateway's event
   loop carries every stream's chunk work, and a callback waits its turn behind it: the
   protocol's ``connection_lost`` ran tens of milliseconds after the client left (p99 91 ms at
   300 streams). This thread waits in ``epoll`` on every in-flight request's client socket, for
   the peer's close only (``EPOLLRDHUP``; never ``EPOLLIN``, so request data and pipelined
   requests do not wake it), and stops the flight from there: the stop severs the upstream
   connection (``shutdown(SHUT_RDWR)``, safe from any thread), and the flight's loop-side
   bookkeeping follows on the loop. Its latency is a thread wake-up plus at most one GIL switch
   interval, whatever the loop is doing. Each watched socket is a ``dup`` of the client's, so a
   registration never outlives its request. The dup's own number is reused, though, once a
   finished request closes it: an event ``epoll`` handed the thread for a client that left can
   be looked up after the loop unwatched that request and the next request's dup took the same
   number. So the thread stops a request only if *its* socket shows the peer gone (a zero-time
   ``poll``, under the lock that keeps the number from changing hands), and a registration is
   forgotten only by its own owner (a stale event once stopped another client's request: 499,
   ``client_disconnect``; seen by ``bench_gateway``'s disconnect loop, 3 runs in 7).
2. **The loop** (the gateway's own server, ``protocol.py``): ``connection_lost`` for a close and
   ``eof_received`` for a half-close call :meth:`ClientWatch.left`. They are the only signs where
   ``epoll`` is missing, and a second one where it is (once, under a loaded suite, a half-close
   went unseen by the thread).
3. **ASGI's ``http.disconnect``**, when the app is mounted in another ASGI server: there is no
   socket to watch, and it is the only sign.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, NamedTuple, Protocol

import anyio
from starlette.types import Receive

from .scope import Connection

__all__ = ["ClientWatch", "DepartureThread", "Registration", "departure_thread", "watch_client"]

log = logging.getLogger(__name__)

_EVENTS = (
    getattr(select, "EPOLLRDHUP", 0x2000) | select.EPOLLHUP | select.EPOLLERR | select.EPOLLET
    if hasattr(select, "epoll")
    else 0
)
# the same, asked of one socket now (a peer's close or reset stays readable in its state)
_GONE = getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR


class Stoppable(Protocol):
    """What a departure stops (``state.Flight``)."""

    def stop(self, reason: str) -> None: ...

    def stop_from_thread(self, reason: str) -> None: ...


class ClientWatch:
    """One request's watch over its client: every sign of a departure ends here."""

    def __init__(self, flight: Stoppable) -> None:
        self.flight = flight

    def left(self) -> None:
        """On the loop: the client closed or half-closed its connection."""
        self.flight.stop("client_disconnect")

    def left_from_thread(self) -> None:
        """On the departure thread: the upstream is severed here, the rest follows on the loop."""
        self.flight.stop_from_thread("client_disconnect")


class Registration(NamedTuple):
    """A watched socket: the dup'd fd, and the watch it tells (a number alone can change hands)."""

    fd: int
    watch: ClientWatch


def _peer_gone(fd: int) -> bool:
    probe = select.poll()
    probe.register(fd, _GONE)
    return bool(probe.poll(0))


class DepartureThread:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._lock = threading.Lock()
        self._watched: dict[int, ClientWatch] = {}  # dup'd fd -> the watch it tells
        self._wake_r, self._wake_w = os.pipe()  # close() wakes the thread
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="abstract-client-gateway-departures", daemon=True)
        self._thread.start()

    def watch(self, sock: Any, watch: ClientWatch) -> Registration | None:
        """Watch ``sock``'s peer for ``watch``; returns the handle for :meth:`unwatch` (None
        when the socket is already gone)."""
        try:
            fd = os.dup(sock.fileno())
        except OSError:
            return None
        with self._lock:
            self._watched[fd] = watch
        try:
            self._epoll.register(fd, _EVENTS)
        except OSError:
            self._forget(fd, watch)
            return None
        return Registration(fd, watch)

    def unwatch(self, registration: Registration | None) -> None:
        if registration is not None:
            self._forget(*registration)

    @property
    def watching(self) -> int:
        with self._lock:
            return len(self._watched)

    def _forget(self, fd: int, watch: ClientWatch) -> None:
        """Unregister and close ``fd`` if it is still ``watch``'s (once closed, its number may be
        another request's)."""
        with self._lock:
            if self._watched.get(fd) is not watch:
                return
            del self._watched[fd]
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass
        os.close(fd)

    def close(self) -> None:
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(5)
        for fd, watch in list(self._watched.items()):
            self._forget(fd, watch)
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        while not self._closed:
            try:
                events = self._epoll.poll()
            except InterruptedError:  # pragma: no cover (PEP 475 retries; kept for safety)
                continue
            for fd, _ in events:
                if fd == self._wake_r:
                    continue
                with self._lock:
                    watch = self._watched.get(fd)
                    # unwatched, or a stale event: the number is another request's now, its client is there
                    if watch is None or not _peer_gone(fd):
                        continue
                try:
                    watch.left_from_thread()
                except Exception:  # never let one request's stop end the thread
                    log.exception("gateway: stopping a disconnected request failed")
                self._forget(fd, watch)


_thread: DepartureThread | None = None
_thread_pid: int | None = None
_thread_lock = threading.Lock()


def departure_thread() -> DepartureThread | None:
    """This process's departure thread (one per gateway worker; a forked worker makes its own),
    or None where ``epoll`` is missing."""
    global _thread, _thread_pid
    if not _EVENTS:
        return None
    with _thread_lock:
        if _thread is None or _thread_pid != os.getpid():
            try:
                _thread, _thread_pid = DepartureThread(), os.getpid()
            except OSError:
                log.warning("gateway: no departure thread; departures are seen on the loop")
                return None
        return _thread


@asynccontextmanager
async def watch_client(
    connection: Connection | None, flight: Stoppable, receive: Receive
) -> AsyncIterator[ClientWatch]:
    """Watch a request's client while its flight runs (``connection``: the gateway's protocol's,
    with the client's socket; None under another ASGI server)."""
    watch = ClientWatch(flight)
    if connection is None:  # mounted in another ASGI server: http.disconnect is the only news
        async with anyio.create_task_group() as tg:
            tg.start_soon(_http_disconnect, receive, watch)
            try:
                yield watch
            finally:
                tg.cancel_scope.cancel()
        return
    # Served by the gateway's own protocol: the thread and the loop's callbacks see a departure
    # sooner than a task reading http.disconnect would (and a task per request is a tenth of a
    # request's cost here).
    connection.watched_by(watch)  # the loop's signs: the protocol's connection_lost, eof_received
    thread = departure_thread()
    handle = thread.watch(connection.socket, watch) if thread is not None and connection.socket else None
    try:
        yield watch
    finally:
        if thread is not None:
            thread.unwatch(handle)


async def _http_disconnect(receive: Receive, watch: ClientWatch) -> None:
    """ASGI's news of a departure (the request body was already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            watch.left()
            return


def client_socket(transport: Any) -> Any:
    """The transport's socket (asyncio hands out a ``TransportSocket``: it has ``fileno()``)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock if hasattr(sock, "fileno") else None
