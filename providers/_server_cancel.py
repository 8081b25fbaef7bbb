"""A server's own cancel route, called from a stop (the ``remote`` lane's ``POST
/v1/requests/{id}/cancel``, llama-server's ``DELETE /v1/stream`` for a resumable stream).

The stop runs in whatever thread pressed it and must never wait on the network, so the request
runs on a loop thread of the lane's own, through the lane's HTTP client (its proxy and TLS
settings, a connection kept warm). Where the cancel is what stops the engine (a resumable
stream outlives its connection), ``retry_for`` keeps trying a server that cannot be reached — a
stop pressed while the connection was down still lands once it is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx

from abstract_client._sync import Portal
from abstract_client.http.clients import HttpClients
from abstract_client.stopping.token import Step, StopToken

__all__ = ["ServerCancels"]

log = logging.getLogger(__name__)
_TIMEOUTS: dict[str, float | None] = {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}


class ServerCancels:
    """Fire-and-forget cancel requests to one lane's server."""

    def __init__(self, clients: HttpClients | None) -> None:
        self._clients = clients
        self._portal = Portal()  # its loop thread starts with the first cancel
        self._pending = 0
        self._idle = threading.Condition()
        self.attempts = 0  # requests that ended, answered or not (what a test waits on)

    def warm(self) -> None:
        """Start the loop thread now, so that a stop does not pay for it."""
        _ = self._portal.loop

    def send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        retry_for: float = 0.0,
        retry_statuses: tuple[int, ...] = (),
    ) -> None:
        """Send ``method path`` soon, from the loop thread; never blocks the caller. Within
        ``retry_for`` seconds, an unreachable server and an answer in ``retry_statuses`` (a 404
        for what the server has not registered yet) are tried again."""
        target = f"{path}?{httpx.QueryParams(params)}" if params else path
        with self._idle:
            self._pending += 1
        self._portal.submit(lambda: self._counted(self._send(method, target, retry_for, retry_statuses)))

    @contextmanager
    def unless_finished(self, token: StopToken, cancel: Callable[[], None]) -> Iterator[Callable[[], None]]:
        """For one stream that outlives its connection: ``cancel`` (which queues the server's
        own cancel through :meth:`send`) runs from the stopping thread at the stop's sever step,
        or when the block is left before the stream finished — a deadline, an error, a
        ``break``: a stream left early must not decode on for a resume that never comes. Yields
        ``finished()``, to call once the server sent the stream's end. ``cancel`` runs once."""
        lock = threading.Lock()
        ran = False
        done = False

        def once() -> None:  # the stopping thread and the loop may both get here
            nonlocal ran
            with lock:
                if ran:
                    return
                ran = True
            cancel()

        def finished() -> None:
            nonlocal done
            done = True

        self.warm()
        # at the sever step, after the hand-off: the woken caller raises first, then it is sent
        remove_hook = token.add_hook(once, step=Step.SEVER)
        try:
            yield finished
        finally:
            remove_hook()
            if not done:
                once()

    async def _counted(self, sending: Coroutine[Any, Any, None]) -> None:
        try:
            await sending
        finally:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    async def _send(self, method: str, target: str, retry_for: float, retry_statuses: tuple[int, ...]) -> None:
        assert self._clients is not None
        await self._clients.prepare()  # this loop's client closes when the loop ends
        delay = 0.05
        with anyio.move_on_after(retry_for or None):  # one attempt, unbounded by us, when 0
            while True:
                try:
                    response = await self._clients.fetch(method, target, timeout=_TIMEOUTS)
                    log.debug("%s %s: the server answered %d", method, target, response.status_code)
                    if response.status_code not in retry_statuses or not retry_for:
                        return
                except httpx.TransportError as exc:  # unreachable (yet): the stop must still land
                    if not retry_for:
                        log.debug("%s %s: unreachable (%s)", method, target, exc)
                        return
                finally:  # counted once it ended: a try still connecting may yet land
                    self.attempts += 1
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
        log.warning("%s %s: the server could not be reached within %.0f s", method, target, retry_for)

    def close(self, wait: float = 0.0) -> None:
        """End the loop thread, after the cancels in flight ended or ``wait`` seconds passed."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending <= 0, timeout=wait)
        self._portal.shutdown(timeout=0)
