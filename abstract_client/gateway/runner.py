"""The runner: every request the gateway serves — foreground or background, on every route —
runs here, one way: its key's limits, its place in flight, a slot of its backend (bounded: a
full queue is a 503), its answer into its sink, then its accounting.

A route parses a request into a :class:`Job` — what to call (``stream``, ``generate`` or
``embed`` and the call's arguments), how its answer is written (a stream's frames or a whole
body's maker, both the wire's) and its error shape — and hands it over; nothing here calls back
into a route. The answer goes into a sink (``sinks.py``: a client's frames or JSON body;
``background.KeptEvents``: a background response's events). :class:`JobResponse` is a job served
to the client that sent it: watched for its departure (its stop), answered even if it left
before the answer began.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
from starlette.types import Message, Receive, Scope, Send

from .. import telemetry
from ..errors import GenerationCancelledError, StopReason
from ..wires.chat_server import Shape, as_written, error_body, openai_error
from .flight import Backend, Flight
from .http.client_writes import send_json
from .http.departures import watch_client
from .http.scope import caller_of, connection_of
from .http.stall import UnsentWatch
from .request_ids import scoped
from .sinks import ClientStream, ClientWhole, Sink, StreamFrames
from .team.limits import Admission, Refusal

if TYPE_CHECKING:
    from .config import GatewayConfig
    from .metrics import Metrics
    from .team.accounting import Accounting
    from .upstreams import Upstreams

__all__ = ["Job", "JobResponse", "Runner"]

Call = Literal["stream", "generate", "embed"]


@dataclass
class Job:
    """One request, parsed by its route: what the runner runs, and what it needs to know."""

    endpoint: str  # its family in the metrics and the usage: chat, completions, embeddings, messages, responses
    backend: Backend
    request_id: str
    call: Call  # the library call: ``astream``, ``agenerate`` or ``aembed``
    kwargs: dict[str, Any]  # its arguments
    # how its answer is written for a client: a stream's frames, or a whole answer's body
    frames: StreamFrames | None = None
    body_of: Callable[[Any], Any] | None = None
    shape: Shape = as_written  # the route's error shape (its errors, the gateway's refusals)
    max_tokens: Any = None  # what it may generate, reserved against its key's token limits
    prompt: Mapping[str, Any] | None = field(default=None)  # what it reads, reserved likewise


class Served(Protocol):
    """What the runner needs of the gateway it runs for (``gateway.Gateway``)."""

    config: GatewayConfig
    flights: dict[str, Flight]
    accounting: Accounting
    metrics: Metrics
    upstreams: Upstreams

    def stop_recorded(self, flight: Flight, err: GenerationCancelledError) -> None: ...


class Runner:
    """Runs jobs for one gateway (see the module docstring)."""

    def __init__(self, gateway: Served) -> None:
        self.gateway = gateway

    async def admit(self, job: Job, key: str) -> Admission | Refusal:
        """The key's limits, before a slot is waited for or anything is sent upstream."""
        return await self.gateway.accounting.admit(key, job.max_tokens, job.prompt)

    def refused(self, job: Job, key: str, refusal: Refusal) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]:
        """A refusal's answer (status, body in the route's shape, headers), on its key's record."""
        body, headers = self.gateway.accounting.refused(refusal, key, job.backend.name, job.endpoint, job.request_id)
        return refusal.status, job.shape(refusal.status, body), headers

    def flight(
        self, job: Job, key: str, admission: Admission, owner: str | None, call_id: str, unsent: Any = None
    ) -> Flight:
        timeout, loop = self.gateway.config.write_timeout, asyncio.get_running_loop()
        return Flight(
            job.request_id,
            job.backend,
            write_timeout=timeout,
            loop=loop,
            owner=owner,
            call_id=call_id,
            key=key,
            admission=admission,
            unsent=unsent,
        )

    async def run(self, flight: Flight, job: Job, sink: Sink) -> int:
        """In flight from here to its end: a slot, the answer, the accounting. Its status."""
        gateway, backend = self.gateway, job.backend
        gateway.flights[flight.call_id] = flight
        gateway.metrics.started(backend.name)
        status = 500
        try:
            status = await self._in_slot(flight, job, sink)
            return status
        finally:
            flight.end()
            gateway.flights.pop(flight.call_id, None)
            gateway.accounting.account(flight, job.endpoint, status)
            gateway.metrics.finished(backend.name, job.endpoint, status)
            gateway.upstreams.finished(backend.name, status, flight.error)

    async def _in_slot(self, flight: Flight, job: Job, sink: Sink) -> int:
        """Wait for a slot (bounded: 503 + Retry-After), then answer; a request stopped while
        queued leaves the queue."""
        backend, key, gateway = job.backend, flight.key, self.gateway
        weight = gateway.accounting.weight(key)
        if not backend.slots.try_acquire(key, weight):  # a free slot: no scope, no timer
            with anyio.CancelScope() as queued:
                flight.queued(queued)
                try:
                    with anyio.fail_after(backend.cfg.queue_timeout):
                        await backend.slots.acquire(key, weight)
                except TimeoutError:
                    gateway.metrics.queue_rejected(backend.name)
                    retry = str(max(1, round(backend.cfg.queue_timeout / 2))).encode()
                    message = f"{backend.name} is busy: no slot within {backend.cfg.queue_timeout}s"
                    body = openai_error(message, "unavailable_error", "queue_timeout")
                    return await sink.refuse(503, body, [(b"retry-after", retry)])
            flight.queued(None)
            if queued.cancelled_caught:  # stopped while queued: no slot was taken
                return await self._stopped_before_start(flight, sink)
        flight.admitted()
        try:
            if flight.reason is not None:  # stopped before it started (a slot taken, nothing ran)
                return await self._stopped_before_start(flight, sink)
            return await self._answer(flight, job, sink)
        finally:
            backend.slots.release(key)

    async def _stopped_before_start(self, flight: Flight, sink: Sink) -> int:
        stop = GenerationCancelledError(
            f"stopped while queued ({flight.reason})", reason=_stop_reason(flight), signal_reason=flight.reason
        )
        self.gateway.stop_recorded(flight, stop)  # a stop like any other: GET /v1/requests/{id} tells it
        return await sink.stopped(flight, stop)

    async def _answer(self, flight: Flight, job: Job, sink: Sink) -> int:
        """The library call, its answer written to ``sink`` as it comes; a stop is recorded."""
        llm, metrics = flight.backend.llm, self.gateway.metrics
        signal, call_id = flight.controller.signal, flight.call_id
        async with sink.writing():
            try:
                if job.call == "stream":
                    stream = llm.astream(**job.kwargs, signal=signal, request_id=call_id)
                    async with stream:
                        async for chunk in stream:
                            if await sink.chunk(chunk) and flight.first_token_at is None:
                                flight.first_token()
                    result: Any = stream.result()
                    flight.answered(result.usage, metrics)
                elif job.call == "generate":
                    result = await llm.agenerate(**job.kwargs, signal=signal, request_id=call_id)
                    flight.answered(result.usage, metrics)
                else:
                    result = await llm.aembed(**job.kwargs, signal=signal, request_id=call_id)
                    flight.embedded(result.usage)
                # on its key's record before its client can see the end: a gateway killed the
                # moment after loses no answered request's record (accounted once: ``run``)
                self.gateway.accounting.account(flight, job.endpoint, 200)
                return await sink.end(result)
            except GenerationCancelledError as err:
                self.gateway.stop_recorded(flight, err)
                return await sink.stopped(flight, err)
            except Exception as err:
                flight.failed(err)
                return await sink.failed(flight, err)


_GATEWAY_REASONS: dict[str | None, StopReason] = {"shutdown": "shutdown", "model_eject": "model_eject"}


def _stop_reason(flight: Flight) -> StopReason:
    """The error code of a flight's stop: a shutdown or an eject says so (a queued request ended
    by SIGTERM answered "user"); a client's or a cancel route's is the user's."""
    return _GATEWAY_REASONS.get(flight.reason, "user")


class JobResponse:
    """An ASGI response that runs a job for the client that sent it."""

    def __init__(self, runner: Runner, job: Job) -> None:
        self.runner, self.job = runner, job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runner, job = self.runner, self.job
        caller, connection = caller_of(scope), connection_of(scope)
        call_id = scoped(job.request_id, caller.owner)  # another key's id of the same name is not ours
        if call_id in runner.gateway.flights:
            message = f"request {job.request_id} is already in flight"
            body = openai_error(message, "invalid_request_error", "duplicate_request_id")
            await send_json(send, 409, job.shape(409, body))
            return
        key = caller.name
        admitted = await runner.admit(job, key)
        if isinstance(admitted, Refusal):
            await send_json(send, *runner.refused(job, key, admitted))
            return
        # the gateway's own server: the kernel can say what the client has not taken
        socket = None if connection is None else connection.socket
        unsent = None if socket is None else UnsentWatch(socket, runner.gateway.config.write_timeout)
        flight = runner.flight(job, key, admitted, caller.owner, call_id, unsent)
        replied = _Watched(send)
        status = 500
        path = scope.get("path", "")
        # the caller's trace continues here; the backend call's span is this span's child
        with telemetry.server_span(f"POST {path}", scope.get("headers") or [], job.request_id, path) as span:
            flight.traced(span)
            try:
                async with watch_client(connection, flight, receive):  # its departure is its stop
                    status = await runner.run(flight, job, _client_sink(job, flight, replied))
            finally:
                if not replied.started:
                    # The client left before the answer began (or half-closed its side: TCP cannot
                    # tell that from a close until it is written to), and nothing was sent. Answer
                    # anyway, with the stop: else uvicorn logs "ASGI callable returned without
                    # starting response" and answers a half-closed client with a 500.
                    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                        reason: StopReason = "shutdown" if flight.reason == "shutdown" else "user"
                        given = flight.reason or "client_disconnect"
                        stop = GenerationCancelledError(f"stopped: {given}", reason=reason, signal_reason=given)
                        status_code, body = error_body(stop)
                        await send_json(send, status_code, job.shape(status_code, body), [(b"connection", b"close")])
                elif flight.reason in ("client_disconnect", "client_stalled"):
                    if connection is not None:  # the gateway's protocol: no ERROR line
                        connection.abort()
                if flight.span is not None:
                    flight.span.set_attribute("http.response.status_code", status)


def _client_sink(job: Job, flight: Flight, send: Send) -> Sink:
    if job.frames is not None:
        return ClientStream(send, flight, job.frames, job.shape)
    assert job.body_of is not None, "a job answers in frames or in one body"
    return ClientWhole(send, flight, job.body_of, job.shape)


class _Watched:
    """``send``, noting whether the response has started."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
