"""The gateway's HTTP/1.1 protocol: uvicorn's h11 protocol, with two things ASGI cannot give.

1. **The disconnect acts where it is seen.** Through ASGI, a client's disconnect travels
   ``connection_lost`` → an event → the watcher task's wake-up: three turns of the event loop,
   and under load every turn carries every stream's queued chunk work (this was the 1-2 s stop
   at 300 streams). Here ``connection_lost`` stops the request's flight itself: the upstream
   socket is shut down in that same callback. (Before it, the disconnect thread of
   ``disconnects.py`` has usually done so already, without waiting for the loop; the protocol
   hands it each request's client socket.)
2. **Slowloris.** uvicorn has no header timeout: a connection that sends its headers one byte a
   second is held forever. A connection whose request head is not complete within
   ``header_timeout`` seconds (from its first byte, or from the connection) gets a 408 and is
   closed. (The body is bounded by the app: ``body_timeout``, see ``RequestIdAndAuth``.)
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .disconnects import client_socket

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
            # the app hands it to the disconnect thread (disconnects.py) while a request runs
            state = self.cycle.scope.setdefault("state", {})
            state["client_socket"] = client_socket(self.transport)
            state["client_left"] = self._client_left
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

    def _client_left(self) -> None:
        """The app ends a request whose client left (or stalled past the write timeout) before
        its answer was complete: close the connection at once, and mark the request's
        cycle disconnected. The disconnect thread sees a departure before the loop's
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
        transport, and the client got nothing, or a 500). A request in flight is stopped here
        too: the disconnect thread's ``EPOLLRDHUP`` usually acts first, and this is the loop's own
        path for a half-close, as ``connection_lost`` is for a close (once, under a loaded
        suite, neither saw it and a half-closed client got its whole answer)."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            flight = (cycle.scope.get("state") or {}).get("flight")
            if flight is not None:
                flight.stop("client_disconnect")
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            flight = (cycle.scope.get("state") or {}).get("flight")
            if flight is not None:
                flight.stop("client_disconnect")  # severs the upstream now, in this callback


def protocol_class(header_timeout: float) -> type[GatewayProtocol]:
    """The protocol with this gateway's header timeout (uvicorn takes a class)."""
    return type("GatewayProtocol", (GatewayProtocol,), {"header_timeout": header_timeout})
