"""Coalesced SSE writes: one ``send`` carries every frame produced since the last one.

Why: an upstream under load delivers many frames per socket read, and the call's stream hands
them out without yielding to the event loop. Sending each frame on its own costs a syscall, an
h11/httptools event and a write-timeout scope per frame — at 300 streams that made the gateway
the bottleneck (12k chunks/s passed on of 30k offered), and once it falls behind, every loop
iteration grows and a client's disconnect waits seconds behind queued chunk work. Here the
producer only appends bytes; a writer task, woken once per batch, sends what has gathered. Idle,
a batch is one frame (no added latency: the writer runs on the loop's next turn). Memory stays
bounded: past ``HIGH_WATER`` bytes the producer waits for the writer, so a client that stops
reading still meets the write timeout (``guarded_send``) and is stopped as ``client_stalled``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from starlette.types import Message

__all__ = ["HIGH_WATER", "FrameWriter"]

HIGH_WATER = 256 * 1024  # bytes gathered before the producer waits for the client
# no-transform and X-Accel-Buffering: a proxy in front must pass each frame on as it comes —
# nginx buffers a bare proxy_pass's response (4 KiB bursts: ~22 tokens) unless told not to, and
# a proxy that compresses or rewrites a body waits for more of it.
_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


class FrameWriter:
    """The SSE response of one stream: ``start``, ``write`` frames, ``finish``; :meth:`run` is
    the task that sends (it returns once the final bytes are sent or the client is gone)."""

    def __init__(self, send: Callable[[Message], Awaitable[None]]) -> None:
        self._send = send  # the flight's guarded send (write timeout, disconnect handling)
        self._pending = bytearray()
        self._wake = anyio.Event()
        self._room = anyio.Event()
        self._start_due = False
        self.started = False
        self._final = False

    def start(self) -> None:
        """The 200 and its headers go out with the first frames (once)."""
        if not self.started:
            self.started = self._start_due = True
            self._wake.set()

    def write(self, data: bytes) -> None:
        self._pending += data
        self._wake.set()

    @property
    def behind(self) -> bool:
        """More than ``HIGH_WATER`` bytes are waiting for the client."""
        return len(self._pending) > HIGH_WATER

    async def room(self) -> None:
        """Wait while the client is more than ``HIGH_WATER`` bytes behind."""
        while len(self._pending) > HIGH_WATER and not self._final:
            self._room = anyio.Event()
            await self._room.wait()

    def finish(self, last: bytes = b"") -> None:
        """The last bytes; the response ends after them (no body at all if never started)."""
        self._pending += last
        self._final = True
        self._wake.set()

    def abandon(self) -> None:
        """End without writing anything more (the client is gone)."""
        self._pending.clear()
        self._final = True
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                if self._start_due:
                    self._start_due = False
                    await self._send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
                final, data = self._final, bytes(self._pending)
                self._pending.clear()
                self._room.set()
                if self.started and (data or final):
                    await self._send({"type": "http.response.body", "body": data, "more_body": not final})
                if final:
                    return
        finally:
            self._final = True
            self._room.set()
