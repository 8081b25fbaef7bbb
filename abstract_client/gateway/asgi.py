"""ASGI plumbing: JSON responses, sends that stop a flight whose client is gone or stalled, and
:class:`GenerationResponse`, the ASGI response that runs one generation (or embedding) as a
:class:`~.state.Flight` — in a slot, watched for its client's disconnect, counted in the
metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from starlette.types import Message, Receive, Scope, Send

from .. import telemetry
from ..errors import GenerationCancelledError, StopReason
from ..wires.chat_server import Shape, as_written, error_body, openai_error
from .departures import watch_client
from .keys import ANONYMOUS
from .limits import Refusal
from .request_ids import scoped
from .stall import UnsentWatch
from .state import Backend, Flight, Gateway

__all__ = ["GenerationResponse", "guarded_send", "guarded_send_json", "json_messages", "send_json"]


def json_messages(status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> tuple[Message, Message]:
    data = json.dumps(body).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        + (headers or []),
    }
    return start, {"type": "http.response.body", "body": data}


async def send_json(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    for message in json_messages(status, body, headers):
        await send(message)


class GenerationResponse:
    """An ASGI response that runs one generation (or embedding) as a :class:`Flight`."""

    def __init__(
        self,
        gateway: Gateway,
        backend: Backend,
        request_id: str,
        endpoint: str,
        run: Callable[[Flight, Send], Awaitable[int]],
        shape: Shape | None = None,
        *,
        max_tokens: Any = None,
        prompt: Mapping[str, Any] | None = None,
    ) -> None:
        """``shape``: the route's error shape for the gateway's own refusals (written in
        OpenAI's; the Messages route answers in Anthropic's). ``max_tokens``: what the request
        may generate, and ``prompt`` (the call's arguments) what it reads, reserved against its
        key's token limits until it ends."""
        self.gateway, self.backend, self.request_id = gateway, backend, request_id
        self.endpoint, self.run = endpoint, run
        self.shape = shape or as_written
        self.max_tokens, self.prompt = max_tokens, prompt

    async def _refuse(
        self, send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        await send_json(send, status, self.shape(status, body), headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway, backend = self.gateway, self.backend
        state = scope.setdefault("state", {})
        key = scoped(self.request_id, state.get("owner"))  # another key's id of the same name is not ours
        if key in gateway.flights:
            message = f"request {self.request_id} is already in flight"
            await self._refuse(send, 409, openai_error(message, "invalid_request_error", "duplicate_request_id"))
            return
        # the key's limits, before a slot is waited for or anything is sent upstream
        name = state.get("key_name") or ANONYMOUS
        admitted = await gateway.accounting.admit(name, self.max_tokens, self.prompt)
        if isinstance(admitted, Refusal):
            body, headers = gateway.accounting.refused(admitted, name, backend.name, self.endpoint, self.request_id)
            await self._refuse(send, admitted.status, body, headers)
            return
        flight = Flight(
            self.request_id, backend, write_timeout=gateway.config.write_timeout, loop=asyncio.get_running_loop()
        )
        flight.owner = state.get("owner")
        flight.call_id = key
        flight.key, flight.admission = name, admitted
        if state.get("client_socket") is not None:  # the gateway's own server: the kernel can say
            flight.unsent = UnsentWatch(state["client_socket"], flight.write_timeout)
        gateway.flights[key] = flight
        gateway.metrics.started(backend.name)
        status = 500
        replied = _Watched(send)
        send = replied

        path = scope.get("path", "")
        # the caller's trace continues here; the backend call's span is this span's child
        with telemetry.server_span(f"POST {path}", scope.get("headers") or [], self.request_id, path) as flight.span:
            try:
                async with watch_client(state, flight, receive):  # its departure is its stop
                    status = await self._in_slot(flight, send)
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
                        await self._refuse(send, *error_body(stop), [(b"connection", b"close")])
                elif flight.reason in ("client_disconnect", "client_stalled"):
                    abort_connection = state.get("abort_connection")  # the gateway's protocol: no ERROR line
                    if abort_connection is not None:
                        abort_connection()
                flight.finished = True
                del gateway.flights[key]
                gateway.accounting.account(flight, self.endpoint, status)
                gateway.metrics.finished(backend.name, self.endpoint, status)
                gateway.upstreams.finished(backend.name, status, flight.error)
                if flight.span is not None:
                    flight.span.set_attribute("http.response.status_code", status)

    async def _in_slot(self, flight: Flight, send: Send) -> int:
        """Wait for a slot (bounded: 503 + Retry-After), then run; a client that leaves while
        queued leaves the queue."""
        backend, key = self.backend, flight.key
        weight = self.gateway.accounting.weight(key)
        if not backend.slots.try_acquire(key, weight):  # a free slot: no scope, no timer
            with anyio.CancelScope() as queued:
                flight.queue_scope = queued
                try:
                    with anyio.fail_after(backend.cfg.queue_timeout):
                        await backend.slots.acquire(key, weight)
                except TimeoutError:
                    self.gateway.metrics.queue_rejected(backend.name)
                    retry = str(max(1, round(backend.cfg.queue_timeout / 2))).encode()
                    message = f"{backend.name} is busy: no slot within {backend.cfg.queue_timeout}s"
                    body = openai_error(message, "unavailable_error", "queue_timeout")
                    await self._refuse(send, 503, body, [(b"retry-after", retry)])
                    return 503
            flight.queue_scope = None
            if queued.cancelled_caught:  # stopped while queued: no slot was taken
                return await self._stopped_before_start(flight, send)
        flight.admitted_at = time.perf_counter()
        try:
            if flight.reason is not None:  # stopped before it started (a slot taken, nothing ran)
                return await self._stopped_before_start(flight, send)
            return await self.run(flight, send)
        finally:
            backend.slots.release(key)

    async def _stopped_before_start(self, flight: Flight, send: Send) -> int:
        stop = GenerationCancelledError(
            f"stopped while queued ({flight.reason})", reason=_stop_reason(flight), signal_reason=flight.reason
        )
        self.gateway.stop_recorded(flight, stop)  # a stop like any other: GET /v1/requests/{id} tells it
        if not flight.client_gone:
            await self._refuse(send, *error_body(stop))
        return 499


_GATEWAY_REASONS: dict[str | None, StopReason] = {"shutdown": "shutdown", "model_eject": "model_eject"}


def _stop_reason(flight: Flight) -> StopReason:
    """The error code of a flight's stop: a shutdown or an eject says so (a queued request ended
    by SIGTERM answered "user"); a client's or a cancel route's is the user's."""
    return _GATEWAY_REASONS.get(flight.reason, "user")


class _Watched:
    """``send``, noting whether the response has started."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


async def guarded_send(send: Send, flight: Flight, *messages: Message) -> None:
    """Send to the client unless it is gone. A client that stops reading makes ``send`` wait
    (flow control); past the write timeout that is a stop too (reason ``client_stalled``): its
    generation ends and its slot is free for the next request."""
    if flight.client_gone:
        return
    try:
        with anyio.move_on_after(flight.write_timeout) as scope:
            for message in messages:
                await send(message)
    except OSError:  # the client went away under us: that is a stop too
        flight.stop("client_disconnect")
        return
    # a reader that takes nothing is stalled whatever its buffers hold (``stall.py``)
    taken_nothing = flight.unsent is not None and flight.unsent.wrote(sum(len(m.get("body", b"")) for m in messages))
    if scope.cancelled_caught or taken_nothing:
        flight.client_gone = True  # nothing more can be written to it
        flight.stop("client_stalled")


async def guarded_send_json(
    send: Send, flight: Flight, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await guarded_send(send, flight, *json_messages(status, body, headers))
