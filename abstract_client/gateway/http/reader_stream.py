"""A reader's event stream: a background response read by a client that may stop reading.

A background response outlives its readers, so a reader's stream is not a generation and gets
none of a generation's bounds. Starlette's ``StreamingResponse`` waits on each write for as
long as the client's TCP window stays shut: a reader that never read held its response's events
after the store had dropped it (16 stalled readers: 200 MiB), and through the relay it held the
owning worker's relaying task too. Here every write has the gateway's ``write_timeout``; a
reader past it is cut (its connection closed, as a stalled generation's client is), and a
reader that leaves ends its task at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

import anyio
from starlette.types import Message, Receive, Scope, Send

from .scope import connection_of

__all__ = ["ReaderStream"]


class ReaderStream:
    """An ASGI response: ``events`` as ``text/event-stream``, each write bounded by
    ``write_timeout`` seconds."""

    def __init__(
        self,
        events: AsyncIterator[bytes],
        *,
        write_timeout: float,
        headers: Mapping[str, str] | None = None,
        status_code: int = 200,
    ) -> None:
        self.events = events
        self.write_timeout = write_timeout
        self.status_code = status_code
        self.headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        self.headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self.stalled = False  # set when a write passed the write timeout and the reader was cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._until_disconnect, receive, tg.cancel_scope)
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.headers})
                async for chunk in self.events:
                    if not await self._write(send, {"type": "http.response.body", "body": chunk, "more_body": True}):
                        self.stalled = True
                        connection = connection_of(scope)
                        if connection is not None:  # the gateway's protocol: close it, no ERROR line
                            connection.abort()
                        break
                else:
                    await self._write(send, {"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        except OSError:  # the reader went away under a write
            pass
        finally:
            close = getattr(self.events, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await close()

    async def _write(self, send: Send, message: Message) -> bool:
        with anyio.move_on_after(self.write_timeout):
            await send(message)
            return True
        return False

    @staticmethod
    async def _until_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return
