"""The gateway's HTTP/1.1 protocol: uvicorn's h11 protocol, with three things ASGI cannot give.

1. **The disconnect acts where it is seen.** Through ASGI, a client's disconnect travels
   ``connection_lost`` → an event → the watcher task's wake-up: three turns of the event loop,
   and under load every turn carries every stream's queued chunk work (this was the 1-2 s stop
   at 300 streams). Here ``connection_lost`` (a close) and ``eof_received`` (a half-close) tell
   the request's watch (``departures.py``) in that same callback, and the upstream socket is
   shut down there. (Before them, the departure thread has usually done so already, without
   waiting for the loop: the protocol hands the app each request's client socket for it.)
2. **A client that left is not a WARNING.** Writes to a connection that broke are dropped
   (:class:`_WritesUntilBroken`), not handed to asyncio, which logs each one.
3. **Slowloris.** uvicorn has no header timeout: a connection that sends its headers one byte a
   second is held forever. A connection whose request head is not complete within
   ``header_timeout`` seconds (from its first byte, or from the connection) gets a 408 and is
   closed. (The body is bounded by the app: ``body_timeout``, see ``middleware.BodyLimit``.)
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .departures import client_socket
from .scope import Connection, connection_of

__all__ = ["GatewayProtocol", "protocol_class"]

_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class GatewayProtocol(H11Protocol):
    header_timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_cycle: Any = None  # the cycle whose head the timer waited for
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.write(_TIMEOUT_408)
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        if idle:  # the bytes of a new request head: it has header_timeout to arrive
            self._arm_head_timer()
        super().data_received(data)
        if self.cycle is not None and self.cycle is not self._head_cycle:  # a head arrived
            self._head_cycle = self.cycle
            # the app hands it to the departure thread (departures.py) while a request runs
            state = self.cycle.scope.setdefault("state", {})
            state["connection"] = Connection(client_socket(self.transport), self._abort_connection)
            self.cycle.transport = _WritesUntilBroken(self.transport, self.cycle)  # type: ignore[assignment]
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

    def _abort_connection(self) -> None:
        """The app ends a request whose client left (or stalled past the write timeout) before
        its answer was complete: close the connection at once, and mark the request's
        cycle disconnected. The departure thread sees a departure before the loop's
        ``connection_lost`` does, so without this uvicorn took the app's return for an app that
        forgot to finish its response and logged an ERROR for a client that merely left."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            # abort, not close: close() waits to flush what is buffered, and a stalled reader's
            # buffer never drains (its connection stayed open, the buffer held, for ever)
            self.transport.abort()

    def eof_received(self) -> bool:  # type: ignore[override]
        """The client shut its sending side (``shutdown(SHUT_WR)``; some proxies do, after the
        request): keep ours open, so the request's answer — a stop, since TCP cannot tell this
        from a close before it is written to — can still be sent (uvicorn's default closes the
        transport, and the client got nothing, or a 500). A request in flight is told of the
        departure too (``departures.py``: the loop's sign of a half-close)."""
        self._tell_departure(self.cycle)
        return True

    @staticmethod
    def _tell_departure(cycle: Any) -> None:
        if cycle is not None and not cycle.response_complete:
            connection = connection_of(cycle.scope)
            if connection is not None and connection.watch is not None:
                connection.watch.left()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        cycle = self.cycle
        super().connection_lost(exc)
        self._tell_departure(cycle)  # severs the upstream now, in this callback


class _WritesUntilBroken:
    """A request's transport whose writes stop once the connection broke.

    A write that meets a connection the client closed (EPIPE, a reset) closes the transport at
    once, but the protocol hears of it (``connection_lost``) only a turn of the loop later; a
    response that keeps writing meanwhile — a reader leaving an event replay writes dozens of
    events in one turn — got ``WARNING asyncio: socket.send() raised exception.`` per write. A
    client leaving is the normal case: its writes are dropped here, and its request marked
    disconnected (uvicorn then drops the rest itself)."""

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle

    def write(self, data: bytes) -> None:
        if self._transport.is_closing():
            self._cycle.disconnected = True
            return
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def protocol_class(header_timeout: float) -> type[GatewayProtocol]:
    """The protocol with this gateway's header timeout (uvicorn takes a class)."""
    return type("GatewayProtocol", (GatewayProtocol,), {"header_timeout": header_timeout})
