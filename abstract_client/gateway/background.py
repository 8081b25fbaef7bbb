"""The background responses a gateway (worker) holds: each one's generation runs on, owned by the
gateway, its events kept so that any number of readers can read them, bounded in count, time and
bytes (``GatewayConfig``). ``responses.py`` serves them over HTTP; another worker's GET or cancel
reaches the owning one as a line on the workers' Unix socket (:meth:`BackgroundStore.answer_peer`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from array import array
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ..errors import GenerationCancelledError
from ..types import StreamChunk
from ..wires.chat_server import BadRequest, error_body, openai_error
from ..wires.responses_server import ResponseBuilder, encode_event

if TYPE_CHECKING:
    from .config import GatewayConfig
    from .flight import Flight
    from .runner import Job, Runner

__all__ = [
    "EVICTED",
    "OWNER_END",
    "OWNER_LOST",
    "Background",
    "EventLog",
    "BackgroundStore",
    "KeptEvents",
    "ResponseRecord",
    "cancelled",
    "read_query",
]

log = logging.getLogger("abstract_client.gateway")

_CANCEL_WAIT_S = 10.0  # how long a cancel waits for the engine's stop before it answers


class ResponseRecord(Protocol):
    """A background response as a reader sees it, in memory (:class:`Background`) or in the
    store (``shared_background.SharedResponse``)."""

    owner: str | None

    def follow(self, after: int | None) -> AsyncIterator[bytes]: ...

    async def snapshot(self) -> dict[str, Any]: ...

    async def cancel(self) -> None: ...


class EventLog:
    """A response's events, back to back in a few large buffers (64 KiB, doubling up to 1 MiB)
    and an index of where each one is: 12 bytes an event beside its own bytes, where a list of
    bytes objects cost ~50 more, and buffers the allocator hands back whole when the response is
    let go (its small objects stayed in the process: 16 MiB of 8 MiB x 16 responses)."""

    FIRST, LARGEST = 64 * 1024, 1024 * 1024

    def __init__(self) -> None:
        self._buffers: list[bytearray] = []
        self._fill = 0  # bytes used in the last buffer
        self._index = array("I")  # per event: its buffer, start, length (3 entries)

    def append(self, data: bytes) -> None:
        n = len(data)
        if not self._buffers or self._fill + n > len(self._buffers[-1]):
            size = self.FIRST if not self._buffers else min(2 * len(self._buffers[-1]), self.LARGEST)
            self._buffers.append(bytearray(max(size, n)))
            self._fill = 0
        buffer = self._buffers[-1]
        buffer[self._fill : self._fill + n] = data
        self._index.extend((len(self._buffers) - 1, self._fill, n))
        self._fill += n

    def __len__(self) -> int:
        return len(self._index) // 3

    def __getitem__(self, i: int) -> bytes:
        """The event's bytes (a copy of that one event, for the writer that sends it)."""
        which, start, n = self._index[3 * i : 3 * i + 3]
        return bytes(memoryview(self._buffers[which])[start : start + n])

    def clear(self) -> None:
        self._buffers, self._fill, self._index = [], 0, array("I")


class Background:
    """One background response: its generation's flight, its events, its readers' wake-up."""

    def __init__(self, builder: ResponseBuilder, flight: Flight, owner: str | None) -> None:
        self.builder, self.flight, self.owner = builder, flight, owner
        self.events = EventLog()
        self.bytes = 0
        self.done = False
        self.evicted = False  # dropped from the store: its events are gone, its readers told so
        self.finished_at: float | None = None
        # the gateway's own reason to stop it (HTTP status, code, message): it ends ``failed``
        self.failure: tuple[int, str, str] | None = None
        self._changed = asyncio.Event()

    @property
    def id(self) -> str:
        return self.builder.id

    def append(self, events: list[dict[str, Any]], limit: int) -> None:
        """Keep ``events`` and wake the readers; past ``limit`` bytes the generation is stopped
        (its last events are kept whatever their size: a reader must see how it ended)."""
        for event in events:
            data = encode_event(event)
            self.bytes += len(data)
            self._keep(data)
        if self.bytes > limit:
            message = f"the response's events passed {limit} bytes (background_max_bytes): it was stopped"
            self.fail("background_limit", 507, "response_too_large", message)
        self._appended()

    def fail(self, reason: str, status: int, code: str, message: str) -> None:
        """Stop its generation for the gateway's own ``reason``: it ends ``failed`` with ``code``
        (not ``cancelled``: nobody asked for the stop)."""
        if self.failure is None and not self.done:
            self.failure = (status, code, message)
            self.flight.stop(reason)

    def _keep(self, data: bytes) -> None:
        self.events.append(data)

    def _appended(self) -> None:
        """Wake the readers."""
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self) -> None:
        self.done, self.finished_at = True, time.monotonic()
        self._changed.set()

    def evict(self) -> None:
        """The store let it go (its retention passed, or room was made): its events are
        released now, whoever still reads them — each reader is told so and its stream ends."""
        self.evicted = True
        self.events.clear()
        self._changed.set()

    async def open(self) -> None:
        """Before the response is announced (its 200): nothing to do in memory (the store's
        record is written here: ``shared_background``)."""

    async def close(self) -> None:
        """After :meth:`end`: nothing to do in memory (the store's last write is made here)."""

    # -- what a reader sees (the same in memory and in the store) ---------------------------------

    async def snapshot(self) -> dict[str, Any]:
        """The ``response`` object now."""
        return self.builder.response()

    async def cancel(self) -> None:
        await cancelled(self)

    async def follow(self, after: int | None) -> AsyncIterator[bytes]:
        """The events after sequence number ``after`` (all of them for None), then the live ones
        until the last."""
        index = 0 if after is None else max(0, after + 1)  # never from the end of the list
        while True:
            changed = self._changed
            while index < len(self.events) and not self.evicted:
                yield self.events[index]  # one event at a time: a reader keeps no copy of the rest
                index += 1
            if self.evicted:
                yield EVICTED
                return
            if self.done:
                return
            await changed.wait()


class BackgroundStore:
    """The background responses a gateway (worker) holds, bounded in count, time and bytes."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.runner: Runner  # the gateway's (``state.Gateway`` sets it): it runs every response
        self.items: OrderedDict[str, Background] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def purge(self) -> None:
        """Forget the finished ones kept past their retention."""
        horizon = time.monotonic() - self.config.background_retention
        stale = [k for k, b in self.items.items() if b.finished_at is not None and b.finished_at < horizon]
        self._drop(stale)

    def _drop(self, response_ids: list[str]) -> None:
        """Forget these finished ones (past their retention, or the oldest, to make room): a
        reader still on one is told so and closed (it held the whole response before)."""
        for key in response_ids:
            self.items.pop(key).evict()

    def room(self) -> bool:
        """Room for one more: the oldest finished ones are dropped to make it."""
        self.purge()
        limit = self.config.max_background
        finished = [k for k, b in self.items.items() if b.done]
        self._drop(finished[: max(0, len(self.items) - limit + 1)])  # as many as leave room for one
        return len(self.items) < limit

    async def answer_peer(self, words: list[str], writer: asyncio.StreamWriter) -> None:
        """A GET or cancel relayed by another worker (``workers.relay``): ``get|cancel <id>
        <owner|-> <admin 0|1> <stream> <starting_after|->``; answered ``<status> json|sse``,
        then the body."""
        if len(words) != 6 or words[0] not in ("get", "cancel"):
            writer.write(b"400 json\n")
            return
        action, response_id, owner, admin, stream_word, after_word = words
        try:
            stream, after = read_query(stream_word, None if after_word == "-" else after_word)
        except BadRequest:
            writer.write(b"400 json\n")
            return
        record = self.held(response_id, None if owner == "-" else owner, admin == "1")
        if record is None:
            body = openai_error("no such background response", "invalid_request_error", "not_found")
            writer.write(b"404 json\n" + json.dumps(body).encode())
            return
        if action == "cancel":
            await cancelled(record)
        elif stream:
            writer.write(b"200 sse\n")
            async for event in record.follow(after):
                writer.write(event)
                await writer.drain()  # a relaying worker whose reader left: OSError ends this
            writer.write(OWNER_END)  # a close without it is an owner that died
            await writer.drain()
            return
        writer.write(b"200 json\n" + json.dumps(record.builder.response()).encode())
        await writer.drain()

    def new_record(self, builder: ResponseBuilder, flight: Flight, owner: str | None) -> Background:
        return Background(builder, flight, owner)

    async def get(self, response_id: str, owner: str | None, admin: bool) -> ResponseRecord | None:
        """A background response as its readers see it (the caller's key must own it, or be the
        admin's)."""
        return self.held(response_id, owner, admin)

    def held(self, response_id: str, owner: str | None, admin: bool) -> Background | None:
        """A background response this worker runs or keeps."""
        self.purge()
        record = self.items.get(response_id)
        if record is None or not (admin or record.owner == owner):
            return None  # another key's response is not even confirmed to exist
        return record

    async def aclose(self) -> None:
        """At shutdown: stop the running ones (they end ``cancelled``), and let their tasks end
        before the backends close (bounded)."""
        for record in list(self.items.values()):
            if not record.done:
                record.flight.stop("shutdown")
        if self._tasks:
            with anyio.move_on_after(10):
                await asyncio.gather(*self._tasks, return_exceptions=True)

    def start(self, record: Background, job: Job) -> None:
        self.items[record.id] = record
        task = asyncio.get_running_loop().create_task(self._run(record, job), name=f"background {record.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, record: Background, job: Job) -> None:
        """The job, run by the gateway's runner as every request is, its answer kept."""
        limit = self.config.background_max_bytes
        try:
            await self.runner.run(record.flight, job, KeptEvents(record, limit))
        except Exception:  # never lose a background response silently
            log.exception("background response %s failed", record.id)
            if not record.done:
                record.append(record.builder.failed(RuntimeError("the gateway failed this response")), limit)
        finally:
            record.end()
            with anyio.CancelScope(shield=True):
                await record.close()


class KeptEvents:
    """The sink of a background response (``sinks.Sink``): its events, made by its builder, kept
    by its record for its readers — bounded in bytes: past ``limit`` the generation is stopped
    and ends ``failed``."""

    def __init__(self, record: Background, limit: int) -> None:
        self.record, self.builder, self.limit = record, record.builder, limit

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        self.record.append(self.builder.started(), self.limit)
        yield

    async def chunk(self, chunk: StreamChunk) -> bool:
        events = self.builder.chunk(chunk)
        if events:
            self.record.append(events, self.limit)
        return bool(events)

    async def end(self, result: Any) -> int:
        self.record.append(self.builder.finished(result), self.limit)
        return 200

    async def stopped(self, flight: Flight, stop: GenerationCancelledError) -> int:
        if self.record.failure is not None:  # the gateway's own reason (its events passed the limit)
            status, code, message = self.record.failure
            self.record.append(self.builder.failed_with(code, message), self.limit)
            return status
        self.record.append(self.builder.failed(stop), self.limit)
        return 499

    async def failed(self, flight: Flight, err: Exception) -> int:
        self.record.append(self.builder.failed(err), self.limit)
        return error_body(err)[0]

    async def refuse(self, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> int:
        error = body["error"]
        self.record.append(self.builder.failed_with(error["code"], error["message"]), self.limit)
        return status


async def cancelled(record: Background) -> None:
    """Stop a background response's engine; return once it stopped (bounded), so the answer
    says how it ended."""
    if record.done:
        return
    record.flight.stop("cancel_endpoint")
    with anyio.move_on_after(_CANCEL_WAIT_S):
        async for _ in record.follow(len(record.events) - 1):
            pass


# What a reader of a response the store let go reads last (then its stream ends).
EVICTED = encode_event(
    {
        "type": "error",
        "code": "response_evicted",
        "message": "the gateway no longer holds this response (background_retention or max_background)",
        "param": None,
    }
)
# Ends a relayed event stream that the owner finished (SSE text never holds a NUL byte).
OWNER_END = b"\0"
OWNER_LOST = encode_event(
    {
        "type": "error",
        "code": "owner_lost",
        "message": "the worker that ran this response went away before it ended",
        "param": None,
    }
)


_STREAM_WORDS = {"true": True, "1": True, "false": False, "0": False}
_AFTER = re.compile(r"-1|0|[1-9][0-9]{0,17}")  # ASCII digits only: int() takes "٣", " 3", "1_0"


def read_query(stream: str | None, starting_after: str | None) -> tuple[bool, int | None]:
    """``?stream=&starting_after=`` of a background response's GET, parsed once for the route,
    the worker that relays it and the owning one (they disagreed: the relay refused what the
    owner took, and a negative number reached the owner's event list)."""
    word = "false" if stream is None else stream.lower()
    if word not in _STREAM_WORDS:
        raise BadRequest("stream must be true or false")
    if starting_after is None:
        return _STREAM_WORDS[word], None
    if not _AFTER.fullmatch(starting_after):
        raise BadRequest(f"starting_after must be an integer >= -1, not {starting_after!r:.40}")
    return _STREAM_WORDS[word], int(starting_after)
