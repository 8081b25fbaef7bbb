"""``/v1/responses``: the OpenAI Responses API in front of every backend, in-process ones included.

* **Foreground** (``background`` false): a generation like chat's — the same :class:`Flight`,
  slot and stop — whose client's disconnect stops the engine. Streamed as Responses events
  (``responses_wire.ResponseBuilder``), or answered as one ``response`` object.
* **Background** (``background: true``): the generation belongs to the gateway, not to the
  connection that asked for it. It runs until done or cancelled; its events are kept (numbered
  from 0) so that any number of readers can read them — ``GET /v1/responses/{id}?stream=true
  &starting_after=N`` — and a reader's disconnect stops only that reader.
  ``POST /v1/responses/{id}/cancel`` stops the engine (the owner's key, or the admin's).
* **Bounded** (``GatewayConfig``): ``max_background`` held at once (then a 429, code
  ``too_many_background_responses``); a finished one is kept ``background_retention`` seconds
  (then a 404); one may hold ``background_max_bytes`` of events (then it is stopped and ends
  ``failed``, code ``response_too_large``).
* **Workers**: a background response's id names the worker that runs it (``resp_w2_…``); a
  GET or a cancel that lands on another worker is relayed to it over the workers' Unix
  sockets (``workers.Peers``). Across hosts, route ``/v1/responses/{id}*`` by that prefix
  (docs/resumable.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Send

from ..errors import GenerationCancelledError
from ..types import GenerateResult, StreamChunk, ToolCallDelta
from .asgi import GenerationResponse
from .body import error_response, no_backend, read_json, request_id_of
from .generation import stream_answer, whole_answer
from .openai_wire import BadRequest, error_body, generation_args, openai_error
from .reader_stream import ReaderStream
from .request_ids import scoped
from .responses_wire import ResponseBuilder, chat_body_of, encode_event, new_response_id
from .state import Backend, Flight, Gateway
from .workers import relay

__all__ = ["BackgroundStore", "cancel_response", "get_response", "responses_endpoint"]

log = logging.getLogger("abstract_client.gateway")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RESPONSE_ID = re.compile(r"^resp_(?:w(\d+)_)?[0-9a-f]{32}$")
_CANCEL_WAIT_S = 10.0  # how long a cancel waits for the engine's stop before it answers


class Background:
    """One background response: its generation's flight, its events, its readers' wake-up."""

    def __init__(self, builder: ResponseBuilder, flight: Flight, owner: str | None) -> None:
        self.builder, self.flight, self.owner = builder, flight, owner
        self.events: list[bytes] = []
        self.bytes = 0
        self.done = False
        self.finished_at: float | None = None
        self.too_large = False
        self._changed = asyncio.Event()

    @property
    def id(self) -> str:
        return self.builder.id

    def append(self, events: list[dict[str, Any]], limit: int) -> None:
        """Keep ``events`` and wake the readers; past ``limit`` bytes the generation is stopped
        (its last events are kept whatever their size: a reader must see how it ended)."""
        for event in events:
            data = encode_event(event)
            self.events.append(data)
            self.bytes += len(data)
        if self.bytes > limit and not self.done and not self.too_large:
            self.too_large = True
            self.flight.stop("background_limit")
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self) -> None:
        self.done, self.finished_at = True, time.monotonic()
        self._changed.set()

    async def follow(self, after: int | None) -> AsyncIterator[bytes]:
        """The events after sequence number ``after`` (all of them for None), then the live ones
        until the last."""
        index = 0 if after is None else max(0, after + 1)  # never from the end of the list
        while True:
            changed = self._changed
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.done:
                return
            await changed.wait()


class BackgroundStore:
    """The background responses a gateway (worker) holds, bounded in count, time and bytes."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.items: OrderedDict[str, Background] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def purge(self) -> None:
        """Forget the finished ones kept past their retention."""
        horizon = time.monotonic() - self.gateway.config.background_retention
        stale = [k for k, b in self.items.items() if b.finished_at is not None and b.finished_at < horizon]
        for key in stale:
            del self.items[key]

    def room(self) -> bool:
        """Room for one more: the oldest finished ones are dropped to make it."""
        self.purge()
        limit = self.gateway.config.max_background
        for key in [k for k, b in self.items.items() if b.done]:
            if len(self.items) < limit:
                break
            del self.items[key]
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
        record = self.get(response_id, None if owner == "-" else owner, admin == "1")
        if record is None:
            body = openai_error("no such background response", "invalid_request_error", "not_found")
            writer.write(b"404 json\n" + json.dumps(body).encode())
            return
        if action == "cancel":
            await _cancelled(record)
        elif stream:
            writer.write(b"200 sse\n")
            async for event in record.follow(after):
                writer.write(event)
                await writer.drain()  # a relaying worker whose reader left: OSError ends this
            writer.write(_RELAY_END)  # a close without it is an owner that died
            await writer.drain()
            return
        writer.write(b"200 json\n" + json.dumps(record.builder.response()).encode())
        await writer.drain()

    def get(self, response_id: str, owner: str | None, admin: bool) -> Background | None:
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

    def start(self, record: Background, kwargs: dict[str, Any]) -> None:
        self.items[record.id] = record
        task = asyncio.get_running_loop().create_task(self._run(record, kwargs), name=f"background {record.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, record: Background, kwargs: dict[str, Any]) -> None:
        gateway, flight, builder = self.gateway, record.flight, record.builder
        backend = flight.backend
        limit = gateway.config.background_max_bytes
        gateway.flights[flight.call_id] = flight
        gateway.metrics.started(backend.name)
        status = 500
        try:
            status = await self._in_slot(record, kwargs, limit)
        except Exception:  # never lose a background response silently
            log.exception("background response %s failed", record.id)
            if not record.done:
                record.append(builder.failed(RuntimeError("the gateway failed this response")), limit)
        finally:
            flight.finished = True
            gateway.flights.pop(flight.call_id, None)
            gateway.metrics.finished(backend.name, "responses", status)
            record.end()

    async def _in_slot(self, record: Background, kwargs: dict[str, Any], limit: int) -> int:
        flight, builder, backend = record.flight, record.builder, record.flight.backend
        with anyio.CancelScope() as queued:
            flight.queue_scope = queued
            with anyio.move_on_after(backend.cfg.queue_timeout) as waited:
                await backend.slots.acquire()
        flight.queue_scope = None
        if queued.cancelled_caught:
            stop = GenerationCancelledError(f"stopped while queued ({flight.reason})", reason="user")
            record.append(builder.failed(stop), limit)
            return 499
        if waited.cancelled_caught:
            message = f"{backend.name} is busy: no slot within {backend.cfg.queue_timeout}s"
            record.append(builder.failed_with("queue_timeout", message), limit)
            return 503
        try:
            record.append(builder.started(), limit)
            stream = backend.llm.astream(**kwargs, signal=flight.controller.signal, request_id=flight.call_id)
            async with stream:
                async for chunk in stream:
                    events = builder.chunk(chunk)
                    if events:
                        record.append(events, limit)
            result: GenerateResult = stream.result()
            self.gateway.metrics.prompt(backend.name, result.usage)
            record.append(builder.finished(result), limit)
            return 200
        except GenerationCancelledError as err:
            self.gateway.stop_recorded(flight, err)
            if record.too_large:
                message = f"the response's events passed {limit} bytes (background_max_bytes): it was stopped"
                record.append(builder.failed_with("response_too_large", message), limit)
                return 507
            record.append(builder.failed(err), limit)
            return 499
        except Exception as err:
            record.append(builder.failed(err), limit)
            return error_body(err)[0]
        finally:
            backend.slots.release()


def responses_endpoint(gateway: Gateway) -> Callable[[Request], Awaitable[Any]]:
    async def handle(request: Request) -> Any:
        try:
            body = await read_json(request)
            chat, stream, background = chat_body_of(body)
            kwargs, _, _ = generation_args(chat, chat=True)
        except BadRequest as err:
            return error_response(err)
        backend = gateway.backend_for(body.get("model"))
        if backend is None:
            return no_backend(body.get("model"))
        model = str(body.get("model") or backend.name)
        if background:
            return _start_background(gateway, request, backend, body, kwargs, model, stream)
        request_id = request_id_of(request)
        builder = ResponseBuilder(f"resp_{request_id}", model, body, background=False)

        async def run(flight: Flight, send: Send) -> int:
            if stream:
                return await stream_answer(gateway, flight, send, kwargs, _ResponseFrames(builder))
            return await _foreground_whole(gateway, flight, send, kwargs, builder)

        return GenerationResponse(gateway, backend, request_id, "responses", run)

    return handle


def _start_background(
    gateway: Gateway,
    request: Request,
    backend: Backend,
    body: dict[str, Any],
    kwargs: dict[str, Any],
    model: str,
    stream: bool,
) -> Response | ReaderStream:
    try:  # the checks a foreground request meets in its call, met here before the 200 (#48)
        backend.llm.check_call(**kwargs)
    except (TypeError, ValueError) as err:
        return error_response(err)
    store = gateway.background
    if not store.room():
        message = f"this gateway holds {gateway.config.max_background} background responses (max_background)"
        return JSONResponse(openai_error(message, "rate_limit_error", "too_many_background_responses"), 429)
    prefix = f"w{gateway.peers.index}_" if gateway.peers is not None else ""
    builder = ResponseBuilder(new_response_id(prefix), model, body, background=True)
    owner = request.scope["state"].get("owner")
    flight = Flight(builder.id, backend, write_timeout=gateway.config.write_timeout, loop=asyncio.get_running_loop())
    flight.owner, flight.call_id = owner, scoped(builder.id, owner)
    record = Background(builder, flight, owner)
    store.start(record, kwargs)
    if stream:
        return _event_stream(gateway, record, None)
    return JSONResponse(builder.response())


def _event_stream(gateway: Gateway, record: Background, after: int | None) -> ReaderStream:
    """A reader of a background response: its disconnect ends the reading, never the response;
    a reader that stops reading is cut after the write timeout (``reader_stream``)."""
    return ReaderStream(record.follow(after), write_timeout=gateway.config.write_timeout, headers=SSE_HEADERS)


async def _foreground_whole(
    gateway: Gateway, flight: Flight, send: Send, kwargs: dict[str, Any], builder: ResponseBuilder
) -> int:
    async def produce() -> Any:
        llm = flight.backend.llm
        result = await llm.agenerate(**kwargs, signal=flight.controller.signal, request_id=flight.call_id)
        gateway.metrics.prompt(flight.backend.name, result.usage)
        for chunk in _result_chunks(result):
            builder.chunk(chunk)
        builder.finished(result)
        return builder.response()

    return await whole_answer(gateway, flight, send, produce)


def _result_chunks(result: GenerateResult) -> list[StreamChunk]:
    """A whole answer as the chunks a stream of it would have been (the builder's one path)."""
    chunks = [StreamChunk(reasoning=result.reasoning or ""), StreamChunk(delta=result.content or "")]
    for n, call in enumerate(result.tool_calls or []):
        piece = ToolCallDelta(index=n, id=call.id, name=call.name, arguments_fragment=json.dumps(call.arguments))
        chunks.append(StreamChunk(tool_call=piece))
    return chunks


class _ResponseFrames:
    """The Responses API's events, for :func:`stream_answer`."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder

    def chunk(self, chunk: StreamChunk) -> bytes:
        return b"".join(encode_event(e) for e in self.builder.chunk(chunk))

    def end(self, result: GenerateResult) -> bytes:
        return b"".join(encode_event(e) for e in self.builder.finished(result))

    def failure(self, err: Exception) -> bytes:
        return b"".join(encode_event(e) for e in self.builder.failed(err))


# -- GET /v1/responses/{id}, POST /v1/responses/{id}/cancel ----------------------------------------


def _not_found() -> JSONResponse:
    return JSONResponse(openai_error("no such background response", "invalid_request_error", "not_found"), 404)


def _lookup(request: Request) -> tuple[Gateway, Background | None, str]:
    gateway: Gateway = request.app.state.gateway
    state = request.scope["state"]
    response_id = request.path_params["response_id"]
    return gateway, gateway.background.get(response_id, state.get("owner"), bool(state.get("admin"))), response_id


# Ends a relayed event stream that the owner finished (SSE text never holds a NUL byte).
_RELAY_END = b"\0"
_OWNER_LOST = encode_event(
    {
        "type": "error",
        "code": "owner_lost",
        "message": "the worker that ran this response went away before it ended",
        "param": None,
    }
)


async def _until_owner_ends(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A relayed event stream, passed on as it comes, less the owner's end mark; one that closes
    without it (the owner was killed) ends with an ``error`` event, never a clean end."""
    held = b""
    async for part in body:
        data = held + part
        held = data[-1:] if data.endswith(_RELAY_END) else b""
        out = data[:-1] if held else data
        if out:
            yield out
    if held != _RELAY_END:
        yield _OWNER_LOST


_STREAM_WORDS = {"true": True, "1": True, "false": False, "0": False}
_AFTER = re.compile(r"-1|0|[1-9][0-9]{0,17}")  # ASCII digits only: int() takes "٣", " 3", "1_0"


def read_query(stream: str | None, starting_after: str | None) -> tuple[bool, int | None]:
    """``?stream=&starting_after=`` of a background response's GET, parsed once for the route,
    the relaying worker and the owning one (they disagreed: the relay refused what the owner
    took, and a negative number reached the owner's event list)."""
    word = "false" if stream is None else stream.lower()
    if word not in _STREAM_WORDS:
        raise BadRequest("stream must be true or false")
    if starting_after is None:
        return _STREAM_WORDS[word], None
    if not _AFTER.fullmatch(starting_after):
        raise BadRequest(f"starting_after must be an integer >= -1, not {starting_after!r:.40}")
    return _STREAM_WORDS[word], int(starting_after)


async def get_response(request: Request) -> Response | ReaderStream:
    gateway, record, response_id = _lookup(request)
    if record is None:
        relayed = await _relay(gateway, request, response_id)
        return relayed if relayed is not None else _not_found()
    try:
        stream, after = read_query(request.query_params.get("stream"), request.query_params.get("starting_after"))
    except BadRequest as exc:
        return error_response(exc)
    if not stream:
        return JSONResponse(record.builder.response())
    return _event_stream(gateway, record, after)


async def cancel_response(request: Request) -> Response | ReaderStream:
    gateway, record, response_id = _lookup(request)
    if record is None:
        relayed = await _relay(gateway, request, response_id)
        return relayed if relayed is not None else _not_found()
    await _cancelled(record)
    return JSONResponse(record.builder.response())


async def _cancelled(record: Background) -> None:
    """Stop a background response's engine; return once it stopped (bounded), so the answer
    says how it ended."""
    if record.done:
        return
    record.flight.stop("cancel_endpoint")
    with anyio.move_on_after(_CANCEL_WAIT_S):
        async for _ in record.follow(len(record.events) - 1):
            pass


async def _relay(gateway: Gateway, request: Request, response_id: str) -> Response | ReaderStream | None:
    """A response another worker holds (its id names it): the request is relayed to that
    worker, which checks the caller's key as it would locally, and its answer streamed back."""
    match = RESPONSE_ID.match(response_id)
    peers = gateway.peers
    if match is None or match.group(1) is None or peers is None or int(match.group(1)) == peers.index:
        return None
    state = request.scope["state"]
    action = "cancel" if request.url.path.endswith("/cancel") else "get"
    try:  # the same parser as the owner's: what one refuses, the other refuses
        stream, after = read_query(request.query_params.get("stream"), request.query_params.get("starting_after"))
    except BadRequest as exc:
        return error_response(exc)
    owner, admin = state.get("owner") or "-", "1" if state.get("admin") else "0"
    line = f"response {action} {response_id} {owner} {admin} {str(stream).lower()} {'-' if after is None else after}"
    answer = await relay(peers.path(int(match.group(1))), line)
    if answer is None:  # the owner did not answer: not "no such response", a retryable 503
        unreachable = openai_error(
            "the worker that holds this response did not answer", "unavailable_error", "owner_unreachable"
        )
        return JSONResponse(unreachable, status_code=503, headers={"retry-after": "1"})
    status, kind, body = answer
    relayed = {"x-abstract-client-relayed-from": f"worker {match.group(1)}"}  # for whoever debugs a fleet
    if kind == "sse":
        return ReaderStream(
            _until_owner_ends(body),
            write_timeout=gateway.config.write_timeout,
            status_code=status,
            headers={**SSE_HEADERS, **relayed},
        )
    data = b"".join([part async for part in body])
    return Response(data, status_code=status, media_type="application/json", headers=relayed)
