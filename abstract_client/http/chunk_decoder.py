"""What a wire's stream decoder is: sans-io, an answer's bytes in, the library's chunks out.

Each dialect (``abstract_client/wires/``) has one; the one read loop (``http.wire.read_chunks``)
drives any of them over a connection, or over the bytes of an answer that spans connections.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..errors import ProviderProtocolError
from ..types import StreamChunk
from .sse import SSEDecoder, SSEEvent

__all__ = ["ChunkDecoder", "SSEChunks"]


class ChunkDecoder:
    """Sans-io: ``feed(bytes)`` and ``end()`` give the chunks of one answer, as they come.

    Both are generators: a chunk goes to the caller before the next one is decoded (a list per
    read would keep hundreds alive at once, and the collector would pay for them), and a typed
    error frame raises after the chunks before it. ``done`` turns True at the dialect's final
    frame: the read loop then drains what follows (the connection goes back to the pool) and
    stops. ``end`` raises ``ProviderProtocolError`` for an answer cut short."""

    done = False

    def feed(self, data: bytes) -> Iterator[StreamChunk]:
        raise NotImplementedError

    def end(self) -> Iterable[StreamChunk]:
        return ()


class SSEChunks(ChunkDecoder):
    """A dialect over server-sent events: :meth:`event` maps one event (setting ``done`` at the
    final one, ``finished`` once the answer is whole); an answer that ends before ``finished``
    was cut short (``cut``)."""

    cut = "the stream ended before its final frame"

    def __init__(self) -> None:
        self.finished = False
        self._sse = SSEDecoder()

    def feed(self, data: bytes) -> Iterator[StreamChunk]:
        for event in self._sse.feed(data):
            yield from self.event(event)
            if self.done:
                return

    def event(self, event: SSEEvent) -> Iterable[StreamChunk]:
        raise NotImplementedError

    def end(self) -> Iterable[StreamChunk]:
        self._sse.end()
        if not self.finished:
            raise ProviderProtocolError(self.cut)
        return ()
