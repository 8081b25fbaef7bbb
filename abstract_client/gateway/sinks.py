"""Where a job's answer goes (``runner.py`` feeds them): a client's connection — a stream of
frames (:class:`ClientStream`) or one JSON body (:class:`ClientWhole`), each in its route's
frames and error shape — or a background response's kept events (``background.KeptEvents``),
which any number of readers read. The runner is the same for all three.

Every sink answers the same five things: the answer's chunks, its end, a stop, a failure, and
the gateway's own refusal before anything ran (a full queue) — each returning the status the
request is counted with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
from starlette.types import Send

from ..errors import GenerationCancelledError
from ..types import GenerateResult, StreamChunk
from ..wires.chat_server import Shape, as_written, error_body, error_headers, shaped_error
from .flight import Flight
from .http.client_writes import guarded_send, guarded_send_json, send_json
from .http.frame_writer import FrameWriter

__all__ = ["ClientStream", "ClientWhole", "Sink", "StreamFrames"]


class Sink(Protocol):
    """Where one job's answer goes."""

    def writing(self) -> Any:
        """An async context around the whole answer (a stream's writer task runs inside it)."""

    async def chunk(self, chunk: StreamChunk) -> bool:
        """One chunk of a streamed answer; True when it wrote something (the first token)."""

    async def end(self, result: Any) -> int:
        """The whole answer (a ``GenerateResult``, or an embedding batch): its status."""

    async def stopped(self, flight: Flight, stop: GenerationCancelledError) -> int:
        """The generation was stopped (before it began, or during)."""

    async def failed(self, flight: Flight, err: Exception) -> int:
        """It failed for any other reason."""

    async def refuse(self, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> int:
        """The gateway's own answer before the generation ran (its backend was busy)."""


class StreamFrames(Protocol):
    """What a stream route sends: the bytes of a chunk, of a complete answer's end, and of a
    failure once the first frame is out."""

    def chunk(self, chunk: StreamChunk) -> bytes: ...

    def end(self, result: GenerateResult) -> bytes: ...

    def failure(self, err: Exception) -> bytes: ...


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


class _Client:
    """A client's connection: answered in its route's error shape, and only while it is there."""

    def __init__(self, send: Send, flight: Flight, shape: Shape = as_written) -> None:
        self.send, self.flight, self.shape = send, flight, shape

    async def refuse(self, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> int:
        await send_json(self.send, status, self.shape(status, body), headers)
        return status

    async def _error(self, err: Exception) -> None:
        await guarded_send_json(self.send, self.flight, *shaped_error(err, self.shape), error_headers(err))


class ClientWhole(_Client):
    """One JSON body: ``body_of(result)`` once the answer is whole, or the error's."""

    def __init__(self, send: Send, flight: Flight, body_of: Callable[[Any], Any], shape: Shape = as_written) -> None:
        super().__init__(send, flight, shape)
        self.body_of = body_of

    def writing(self) -> Any:
        return _nothing()

    async def chunk(self, chunk: StreamChunk) -> bool:  # pragma: no cover - a whole answer has none
        raise AssertionError("a whole answer is not streamed")

    async def end(self, result: Any) -> int:
        await guarded_send_json(self.send, self.flight, 200, self.body_of(result))
        return 200

    async def stopped(self, flight: Flight, stop: GenerationCancelledError) -> int:
        if not flight.client_gone:
            await guarded_send_json(self.send, flight, *shaped_error(stop, self.shape))
        return 499

    async def failed(self, flight: Flight, err: Exception) -> int:
        await self._error(err)
        return shaped_error(err, self.shape)[0]


class ClientStream(_Client):
    """SSE frames (coalesced by :class:`FrameWriter`). The response starts with the first chunk,
    so an error before it (unknown model, context overflow...) gets its own status and a JSON
    body; one after it ends the stream with ``frames.failure``, never a silent EOF; a client that
    left is sent nothing more."""

    def __init__(self, send: Send, flight: Flight, frames: StreamFrames, shape: Shape = as_written) -> None:
        super().__init__(send, flight, shape)
        self.frames = frames
        self.writer = FrameWriter(lambda message: guarded_send(send, flight, message))

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.writer.run)
            yield

    async def chunk(self, chunk: StreamChunk) -> bool:
        data = self.frames.chunk(chunk)
        if not data:
            return False
        writer = self.writer
        writer.start()
        writer.write(data)
        if writer.behind:
            await writer.room()
        return True

    async def end(self, result: Any) -> int:
        self.writer.start()
        self.writer.finish(self.frames.end(result))
        return 200

    async def stopped(self, flight: Flight, stop: GenerationCancelledError) -> int:
        await self._ended_by(stop, told=not flight.client_gone)
        return 499

    async def failed(self, flight: Flight, err: Exception) -> int:
        await self._ended_by(err, told=True)
        return error_body(err)[0]

    async def _ended_by(self, err: Exception, *, told: bool) -> None:
        writer = self.writer
        if not told:
            writer.abandon()
        elif writer.started:
            writer.finish(self.frames.failure(err))
        else:
            writer.abandon()
            await self._error(err)
