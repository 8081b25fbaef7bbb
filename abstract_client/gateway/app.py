"""The gateway's ASGI app (Starlette routes, uvicorn server).

Every generation runs as a :class:`Flight`: while it waits for a slot and while the answer is
computed — streaming AND non-streaming — a task watches the ASGI ``receive`` channel, and the
client's ``http.disconnect`` aborts the flight's ``AbortController``. From there it is the
contract's ordinary stop: the upstream socket is severed (HTTP lanes) or the engine's flag is
set (in-process MLX), the call unwinds, and the chain's latency (stop seen → engine stopped) goes
into ``/metrics``. ``POST /v1/requests/{id}/cancel`` aborts the same controller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from .. import telemetry
from ..errors import GenerationCancelledError
from ..fleet import Fleet
from ..llm import LLM
from ..registry import create_llm, runs_in_process
from ..stopping.abort import AbortController
from ..types import GenerateResult
from . import disconnects
from .config import BackendConfig, ConfigError, GatewayConfig
from .metrics import Metrics
from .openai_wire import (
    BadRequest,
    FrameEncoder,
    chat_completion,
    error_body,
    generation_args,
    openai_error,
    sse,
    text_completion,
    usage_frame,
)
from .openapi import openapi_document
from .protocol import protocol_class
from .sse_writer import FrameWriter
from .workers import Peers, run_workers

__all__ = [
    "Backend",
    "Flight",
    "Gateway",
    "GenerationResponse",
    "RequestIdAndAuth",
    "create_app",
    "embeddings_endpoint",
    "generation_endpoint",
    "guarded_send",
    "guarded_send_json",
    "no_backend",
    "request_id_of",
    "send_json",
    "serve",
    "stream_generation",
    "uvicorn_config",
    "watch_disconnect",
    "whole_answer",
    "whole_generation",
]

CHAT_PAGE = files(__package__).joinpath("chat.html").read_text(encoding="utf-8")  # --ui: served at "/"

log = logging.getLogger("abstract_client.gateway")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class Backend:
    """One served model: its LLM and its slots (``max_concurrent`` generations at once)."""

    def __init__(self, cfg: BackendConfig) -> None:
        self.cfg = cfg
        # the upstream model: the configured one, else the name clients use (an MLX model is a path)
        model = cfg.model or (None if cfg.provider == "mlx" else cfg.name)
        self.llm: LLM = create_llm(cfg.provider, model, base_url=cfg.base_url, max_retries=0, **cfg.options)
        # a client's image is data or a URL, never a path: it must not make us read our own files
        self.llm.image_limits = dataclasses.replace(self.llm.image_limits, local_files=False)
        self.slots = anyio.Semaphore(cfg.max_concurrent)

    @property
    def name(self) -> str:
        return self.cfg.name


class Flight:
    """One request in flight: what stops it, and when the stop was seen."""

    def __init__(
        self,
        request_id: str,
        backend: Backend,
        *,
        write_timeout: float = 30.0,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.request_id = request_id
        self.backend = backend
        self.controller = AbortController()
        self.reason: str | None = None
        self.stop_seen_at: float | None = None
        self.client_gone = False
        self.owner: str | None = None  # the identity of the key it came with (cancel(id) checks it)
        self.write_timeout = write_timeout  # a client that reads nothing for this long is stalled
        self.queue_scope: anyio.CancelScope | None = None
        self.span: Any = None  # the request's SERVER span, when tracing is on
        self.finished = False  # the response is done: a late disconnect is not its stop
        self._loop = loop  # where a stop from another thread sends its bookkeeping
        self._claim_lock = threading.Lock()

    def _claim(self, reason: str) -> bool:
        """Record the stop's reason (the first wins, from any thread)."""
        with self._claim_lock:
            if reason == "client_disconnect":
                self.client_gone = True
            if self.reason is not None or self.finished:
                return False
            self.reason, self.stop_seen_at = reason, time.perf_counter()
            return True

    def stop(self, reason: str) -> None:
        """On the loop: from the protocol's ``connection_lost``, the ASGI disconnect watcher,
        the cancel endpoint or shutdown."""
        if self._claim(reason):
            self.controller.abort(reason)  # severs the upstream
            self._after_stop(reason)

    def stop_from_thread(self, reason: str) -> None:
        """From the disconnect thread (``disconnects.py``): the upstream is severed here, on
        that thread; the rest follows on the loop."""
        if self._claim(reason):
            self.controller.abort(reason)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._after_stop, reason)

    def _after_stop(self, reason: str) -> None:
        if self.span is not None:  # the chain, on the request's span: stop seen ... engine stopped
            self.span.add_event("stop", {"abstract_client.stop.reason": reason})
        if self.queue_scope is not None:
            self.queue_scope.cancel()


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.backends = {b.name: Backend(b) for b in config.backends}
        self.metrics = Metrics()
        self.flights: dict[str, Flight] = {}
        # the latest stops, by request id (GET /v1/requests/{id}: what the chat page shows)
        self.stop_records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.loop: asyncio.AbstractEventLoop | None = None  # set at start-up (uvicorn's loop)
        self.peers: Peers | None = None  # the sibling workers, when there are several

    def backend_for(self, model: Any, *, exact: bool = False) -> Backend | None:
        """The backend serving ``model``. A generation on a one-backend gateway reaches it by
        any name; ``exact`` (model management: an unload stops other clients' calls) needs the
        backend's own name."""
        if isinstance(model, str) and model in self.backends:
            return self.backends[model]
        if len(self.backends) == 1 and not exact:
            return next(iter(self.backends.values()))
        return None

    def stop_all(self, reason: str = "shutdown") -> None:
        """Stop every request in flight (on the gateway's loop): each stream ends with an error
        frame, each upstream is severed, each queued request leaves its queue."""
        for flight in list(self.flights.values()):
            flight.stop(reason)

    def stop_all_soon(self) -> None:
        """:meth:`stop_all` from a signal handler (it only schedules the work on the loop)."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stop_all)

    async def aclose(self) -> None:
        self.stop_all()
        for backend in self.backends.values():
            await backend.llm.aclose()

    def stop_recorded(self, flight: Flight, err: GenerationCancelledError) -> None:
        """Record a stop whose caller was just released. An in-process engine drains behind its
        caller: the record is completed with its own figures (when it saw the flag, what it
        sampled after) and published once it has settled — on the loop, a moment later (the
        chat page polls ``GET /v1/requests/{id}`` for it)."""
        released = time.perf_counter()
        record: dict[str, Any] = {
            "request_id": flight.request_id,
            "owner": flight.owner,
            "reason": flight.reason or "unknown",
            "stop_to_engine_stopped_ms": None,
            "generated_tokens": err.generated_tokens,
            "tokens_after_stop": None,
        }
        self.metrics.prompt(flight.backend.name, err.usage)
        stats = getattr(flight.backend.llm.provider, "stats", None)  # in-process engines' own record
        engine = stats(flight.request_id) if stats is not None else None
        if engine is None:  # over HTTP the engine stopped when its connection was severed: now
            self._engine_stopped(flight, record, released, None)
            return
        loop = self.loop
        if loop is None:
            engine.when_settled(lambda: self._engine_stopped(flight, record, released, engine))
            return

        def on_loop() -> None:
            self._engine_stopped(flight, record, released, engine)

        def settled() -> None:  # on the engine thread
            try:
                loop.call_soon_threadsafe(on_loop)
            except RuntimeError:  # the loop is gone (shutdown): nobody reads the record
                pass

        engine.when_settled(settled)

    def _engine_stopped(self, flight: Flight, record: dict[str, Any], released: float, engine: Any) -> None:
        stop_seen = flight.stop_seen_at or released
        stopped = released if engine is None or engine.stopped_at is None else engine.stopped_at
        seconds = max(0.0, stopped - stop_seen)
        record["stop_to_engine_stopped_ms"] = seconds * 1000
        if engine is not None and engine.tokens_at_stop is not None:
            record["tokens_after_stop"] = engine.tokens - engine.tokens_at_stop
        self.stop_records[flight.request_id] = record  # published complete (GET /v1/requests/{id})
        while len(self.stop_records) > 1000:
            self.stop_records.popitem(last=False)
        reason = record["reason"]
        self.metrics.stopped(flight.backend.name, reason, seconds)
        if flight.span is not None:
            flight.span.add_event("engine_stopped", {"abstract_client.stop.chain_ms": seconds * 1000})
        log.info(
            "stopped %s backend=%s reason=%s stop->engine stopped %.2f ms",
            flight.request_id,
            flight.backend.name,
            reason,
            seconds * 1000,
        )


# -- ASGI plumbing ------------------------------------------------------------------------------------


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
    ) -> None:
        self.gateway, self.backend, self.request_id = gateway, backend, request_id
        self.endpoint, self.run = endpoint, run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway, backend = self.gateway, self.backend
        if self.request_id in gateway.flights:
            message = f"request {self.request_id} is already in flight"
            await send_json(send, 409, openai_error(message, "invalid_request_error", "duplicate_request_id"))
            return
        flight = Flight(
            self.request_id, backend, write_timeout=gateway.config.write_timeout, loop=asyncio.get_running_loop()
        )
        state = scope.setdefault("state", {})
        flight.owner = state.get("owner")
        state["flight"] = flight  # the protocol's connection_lost stops it directly
        # ... and before that, the disconnect thread (it does not wait for the loaded loop)
        watching = disconnects.watcher()
        watched = watching.watch(state["client_socket"], flight) if watching and state.get("client_socket") else None
        gateway.flights[self.request_id] = flight
        gateway.metrics.started(backend.name)
        status = 500
        path = scope.get("path", "")
        # the caller's trace continues here; the backend call's span is this span's child
        with telemetry.server_span(f"POST {path}", scope.get("headers") or [], self.request_id, path) as flight.span:
            try:
                if "client_socket" in state:
                    # Served by the gateway's own protocol: its connection_lost and the disconnect
                    # thread stop the flight, sooner than a task reading http.disconnect would
                    # (and a task per request is a tenth of a request's cost here).
                    status = await self._in_slot(flight, send)
                else:  # mounted in another ASGI server: http.disconnect is the only news
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(watch_disconnect, receive, flight)
                        status = await self._in_slot(flight, send)
                        tg.cancel_scope.cancel()
            finally:
                flight.finished = True
                if watching is not None:
                    watching.unwatch(watched)
                del gateway.flights[self.request_id]
                gateway.metrics.finished(backend.name, self.endpoint, status)
                if flight.span is not None:
                    flight.span.set_attribute("http.response.status_code", status)

    async def _in_slot(self, flight: Flight, send: Send) -> int:
        """Wait for a slot (bounded: 503 + Retry-After), then run; a client that leaves while
        queued leaves the queue."""
        backend = self.backend
        try:
            backend.slots.acquire_nowait()  # a free slot: no scope, no timer
        except anyio.WouldBlock:
            with anyio.CancelScope() as queued:
                flight.queue_scope = queued
                try:
                    with anyio.fail_after(backend.cfg.queue_timeout):
                        await backend.slots.acquire()
                except TimeoutError:
                    self.gateway.metrics.queue_rejected(backend.name)
                    retry = str(max(1, round(backend.cfg.queue_timeout / 2))).encode()
                    message = f"{backend.name} is busy: no slot within {backend.cfg.queue_timeout}s"
                    body = openai_error(message, "unavailable_error", "queue_timeout")
                    await send_json(send, 503, body, [(b"retry-after", retry)])
                    return 503
            flight.queue_scope = None
            if queued.cancelled_caught:  # stopped while queued: no slot was taken
                return await self._stopped_before_start(flight, send)
        try:
            if flight.reason is not None:  # stopped before it started (a slot taken, nothing ran)
                return await self._stopped_before_start(flight, send)
            return await self.run(flight, send)
        finally:
            backend.slots.release()

    @staticmethod
    async def _stopped_before_start(flight: Flight, send: Send) -> int:
        if not flight.client_gone:
            await send_json(send, *error_body(GenerationCancelledError("stopped while queued")))
        return 499


async def watch_disconnect(receive: Receive, flight: Flight) -> None:
    """The client's disconnect IS the stop (the request body was already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            flight.stop("client_disconnect")
            return


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
    if scope.cancelled_caught:
        flight.client_gone = True  # nothing more can be written to it
        flight.stop("client_stalled")


# -- endpoints ------------------------------------------------------------------------------------------


def request_id_of(request: Request) -> str:
    return str(request.scope["state"]["request_id"])


MAX_JSON_DEPTH = 64  # arrays and objects nested deeper are refused before parsing


async def _json(request: Request) -> Any:
    raw = await request.body()
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise BadRequest(f"the body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None


_STRUCTURE = re.compile(rb'\\.|["\[\]{}]', re.S)  # an escape pair, a quote, or a bracket


def json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text (strings skipped), in one linear pass
    over its structural bytes only: the parser is recursive, so a deep body must be refused
    before it is parsed."""
    depth = deepest = 0
    in_string = False
    for match in _STRUCTURE.finditer(raw):
        token = match.group()
        if token == b'"':
            in_string = not in_string
        elif in_string or len(token) == 2:  # inside a string, or an escape pair
            continue
        elif token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def no_backend(model: Any) -> JSONResponse:
    return JSONResponse(
        openai_error(f"no backend serves model {model!r}", "invalid_request_error", "model_not_found"), 404
    )


def _error(err: BaseException) -> JSONResponse:
    status, body = error_body(err)
    return JSONResponse(body, status_code=status)


def generation_endpoint(gateway: Gateway, *, chat: bool) -> Callable[[Request], Awaitable[Any]]:
    endpoint = "chat" if chat else "completions"

    async def handle(request: Request) -> Any:
        try:
            body = await _json(request)
            kwargs, stream, include_usage = generation_args(body, chat=chat)
        except BadRequest as err:
            return _error(err)
        backend = gateway.backend_for(body.get("model"))
        if backend is None:
            return no_backend(body.get("model"))
        model_name = str(body.get("model") or backend.name)
        request_id = request_id_of(request)
        kind = stream_generation if stream else whole_generation

        async def run(flight: Flight, send: Send) -> int:
            return await kind(gateway, flight, send, kwargs, model_name, chat=chat, include_usage=include_usage)

        return GenerationResponse(gateway, backend, request_id, endpoint, run)

    return handle


async def whole_generation(
    gateway: Gateway,
    flight: Flight,
    send: Send,
    kwargs: dict[str, Any],
    model: str,
    *,
    chat: bool,
    include_usage: bool,
) -> int:
    async def produce() -> Any:
        result = await flight.backend.llm.agenerate(
            **kwargs, signal=flight.controller.signal, request_id=flight.request_id
        )
        gateway.metrics.prompt(flight.backend.name, result.usage)
        return (chat_completion if chat else text_completion)(result, flight.request_id, model)

    return await whole_answer(gateway, flight, send, produce)


async def whole_answer(gateway: Gateway, flight: Flight, send: Send, produce: Callable[[], Awaitable[Any]]) -> int:
    """A non-streaming answer: 200 with ``produce()``'s body, or the error's status and body; a
    stopped call is recorded (and answered only if its client is still there)."""
    try:
        body = await produce()
    except GenerationCancelledError as err:
        gateway.stop_recorded(flight, err)
        if not flight.client_gone:
            await guarded_send_json(send, flight, *error_body(err))
        return 499
    except Exception as err:
        status, payload = error_body(err)
        await guarded_send_json(send, flight, status, payload)
        return status
    await guarded_send_json(send, flight, 200, body)
    return 200


async def guarded_send_json(send: Send, flight: Flight, status: int, body: Any) -> None:
    await guarded_send(send, flight, *json_messages(status, body))


async def stream_generation(
    gateway: Gateway,
    flight: Flight,
    send: Send,
    kwargs: dict[str, Any],
    model: str,
    *,
    chat: bool,
    include_usage: bool,
) -> int:
    """SSE. The response starts with the first chunk, so an error before it (unknown model,
    context overflow...) gets its own status; one after it ends the stream with an error frame,
    never a silent EOF. Frames go out coalesced (:class:`FrameWriter`)."""
    writer = FrameWriter(lambda message: guarded_send(send, flight, message))
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        status, error, tail = await _produce(
            gateway, flight, writer, kwargs, model, chat=chat, include_usage=include_usage
        )
        if tail is not None:
            writer.finish(tail)
        elif error is None:  # the client is gone
            writer.abandon()
        elif writer.started:
            writer.finish(sse(error))
        else:  # an error before the first frame: its own status and a JSON body
            writer.abandon()
            await guarded_send_json(send, flight, status, error)
    return status


async def _produce(
    gateway: Gateway,
    flight: Flight,
    writer: FrameWriter,
    kwargs: dict[str, Any],
    model: str,
    *,
    chat: bool,
    include_usage: bool,
) -> tuple[int, dict[str, Any] | None, bytes | None]:
    """Run the stream into ``writer``: ``(status, error body, the last bytes of a complete
    answer)``; neither an error nor last bytes: the client is gone, send nothing more."""
    llm = flight.backend.llm
    created = int(time.time())
    encoder = FrameEncoder(flight.request_id, model, created, chat=chat)
    try:
        stream = llm.astream(**kwargs, signal=flight.controller.signal, request_id=flight.request_id)
        async with stream:
            async for chunk in stream:
                frames = encoder.encode(chunk)
                if frames:
                    writer.start()
                    writer.write(frames)
                    if writer.behind:
                        await writer.room()
        result: GenerateResult = stream.result()
        gateway.metrics.prompt(flight.backend.name, result.usage)
    except GenerationCancelledError as err:
        gateway.stop_recorded(flight, err)
        return 499, None if flight.client_gone else error_body(err)[1], None
    except Exception as err:
        status, payload = error_body(err)
        return status, payload, None
    writer.start()
    usage = sse(usage_frame(result, flight.request_id, model, created, chat=chat)) if include_usage else b""
    return 200, None, usage + b"data: [DONE]\n\n"


def embeddings_endpoint(gateway: Gateway) -> Callable[[Request], Awaitable[Any]]:
    async def handle(request: Request) -> Any:
        try:
            body = await _json(request)
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            inputs = body.get("input")
            if isinstance(inputs, str):
                inputs = [inputs]
            if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
                raise BadRequest("input must be a string or a list of strings")
        except BadRequest as err:
            return _error(err)
        backend = gateway.backend_for(body.get("model"))
        if backend is None:
            return no_backend(body.get("model"))
        model = str(body.get("model") or backend.name)

        async def run(flight: Flight, send: Send) -> int:
            async def produce() -> Any:
                result = await flight.backend.llm.aembed(
                    inputs,
                    dimensions=body.get("dimensions"),
                    signal=flight.controller.signal,
                    request_id=flight.request_id,
                )
                data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(result.vectors)]
                n = result.usage.prompt_tokens if result.usage and result.usage.prompt_tokens else 0
                return {
                    "object": "list",
                    "data": data,
                    "model": model,
                    "usage": {"prompt_tokens": n, "total_tokens": n},
                }

            return await whole_answer(gateway, flight, send, produce)

        return GenerationResponse(gateway, backend, request_id_of(request), "embeddings", run)

    return handle


def create_app(config: GatewayConfig, *, peers: Peers | None = None) -> Starlette:
    gateway = Gateway(config)
    gateway.peers = peers

    async def models(request: Request) -> Response:
        data = [{"id": b.name, "object": "model", "owned_by": b.cfg.provider} for b in gateway.backends.values()]
        return JSONResponse({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "in_flight": len(gateway.flights)})

    async def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        fleets = {name: b.llm.status() for name, b in gateway.backends.items() if isinstance(b.llm, Fleet)}
        return Response(
            gateway.metrics.render(list(gateway.backends), fleets), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document(ui=config.ui))

    async def cancel(request: Request) -> Response:
        flight = gateway.flights.get(request.path_params["request_id"])
        state = request.scope["state"]
        # another key's request is "not found": its id is not even confirmed to exist
        request_id = request.path_params["request_id"]
        allowed = flight is not None and (state.get("admin") or flight.owner == state.get("owner"))
        if flight is None and gateway.peers is not None and _REQUEST_ID.match(request_id):
            # another worker may hold it: it checks the key the same way
            owner, admin = state.get("owner") or "-", "1" if state.get("admin") else "0"
            if await gateway.peers.ask("cancel", request_id, owner, admin):
                return JSONResponse({"id": request_id, "cancelled": True})
        if flight is None or not allowed:
            return JSONResponse(openai_error("no such request in flight", "invalid_request_error", "not_found"), 404)
        flight.stop("cancel_endpoint")
        return JSONResponse({"id": flight.request_id, "cancelled": True})

    async def stop_record(request: Request) -> Response:
        """What the gateway measured for a stopped request (its owner's key, or the admin's)."""
        record = gateway.stop_records.get(request.path_params["request_id"])
        state = request.scope["state"]
        if record is None or not (state.get("admin") or record["owner"] == state.get("owner")):
            return JSONResponse(
                openai_error("no stop recorded for this request", "invalid_request_error", "not_found"), 404
            )
        return JSONResponse({k: v for k, v in record.items() if k != "owner"})

    async def chat_page(request: Request) -> Response:
        return HTMLResponse(CHAT_PAGE, headers={"Cache-Control": "no-store"})

    async def load_or_unload(request: Request) -> Response:
        state = request.scope["state"]
        if state.get("admin_required") and not state.get("admin"):
            return JSONResponse(
                openai_error("loading and unloading models needs the admin key", "permission_error"), 403
            )
        try:
            body = await _json(request)
        except BadRequest as err:
            return _error(err)
        model = body.get("model") if isinstance(body, dict) else None
        backend = gateway.backend_for(model, exact=True)
        if backend is None:
            return no_backend(model)
        try:
            if request.url.path.endswith("/load"):
                await backend.llm.aload_model()
                return JSONResponse({"model": backend.name, "loaded": True})
            report = await backend.llm.aunload_model()
            if gateway.peers is not None:  # the other workers' calls on this model stop too
                await gateway.peers.ask("stop-backend", backend.name)
        except Exception as err:
            return _error(err)
        return JSONResponse(
            {
                "model": backend.name,
                "unloaded": True,
                "stopped_requests": report.stopped_requests,
                "server_unloaded": report.server_unloaded,
                "detail": report.detail,
                "memory_before": report.memory_before,
                "memory_after": report.memory_after,
            }
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        log.info("serving %s", ", ".join(f"{b.name} ({b.cfg.provider})" for b in gateway.backends.values()))
        gateway.loop = asyncio.get_running_loop()
        if peers is not None:
            await peers.start(gateway)
        yield
        if peers is not None:
            await peers.aclose()
        await gateway.aclose()

    routes = [
        Route("/v1/chat/completions", generation_endpoint(gateway, chat=True), methods=["POST"]),
        Route("/v1/completions", generation_endpoint(gateway, chat=False), methods=["POST"]),
        Route("/v1/embeddings", embeddings_endpoint(gateway), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/load", load_or_unload, methods=["POST"]),
        Route("/v1/models/unload", load_or_unload, methods=["POST"]),
        Route("/v1/requests/{request_id}/cancel", cancel, methods=["POST"]),
        Route("/v1/requests/{request_id}", stop_record, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    if config.ui:
        routes.append(Route("/", chat_page, methods=["GET"]))

    async def http_error(request: Request, exc: Exception) -> Response:
        """Unknown routes and wrong methods answer like every other error: an OpenAI body."""
        status = int(getattr(exc, "status_code", 500))
        kind = {404: "not_found", 405: "method_not_allowed"}.get(status, "invalid_request_error")
        message = f"{request.method} {request.url.path}: " + ("no such route" if status == 404 else str(exc))
        return JSONResponse(openai_error(message, "invalid_request_error", kind), status)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: http_error, 405: http_error})
    app.state.gateway = gateway
    keys = [*([config.api_key] if config.api_key else []), *config.api_keys]
    return RequestIdAndAuth(  # type: ignore[return-value]
        app, keys, admin_key=config.admin_key, max_body_bytes=config.max_body_bytes, body_timeout=config.body_timeout
    )


class RequestIdAndAuth:
    """Outermost middleware: every response carries ``X-Request-Id`` (the caller's, if valid);
    with API keys, every route but ``/health`` needs ``Authorization: Bearer <key>`` (compared
    in constant time; keys never logged). The key a request came with is its owner: only the
    same key, or the admin key, may cancel it; with an admin key set, only it may load and
    unload models."""

    def __init__(
        self,
        app: Starlette,
        api_keys: list[str],
        *,
        admin_key: str | None = None,
        max_body_bytes: int = 32 * 2**20,
        body_timeout: float = 30.0,
    ) -> None:
        self.app = app
        self.body_timeout = body_timeout
        self.state = app.state
        self._admin = admin_key.encode() if admin_key else None
        self._keys = [k.encode() for k in api_keys] + ([self._admin] if self._admin else [])
        self.max_body_bytes = max_body_bytes

    def _owner(self, auth: bytes) -> tuple[bool, str | None, bool]:
        """(accepted, the key's identity (a hash, never the key), is it the admin key)."""
        if not self._keys:
            return True, None, False
        given = auth[7:].strip() if auth.startswith(b"Bearer ") else b""
        found = None
        for key in self._keys:  # every key compared, in constant time: no early exit
            if hmac.compare_digest(given, key):
                found = key
        if found is None:
            return False, None, False
        return True, hashlib.sha256(found).hexdigest()[:16], found == self._admin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        if given and not _REQUEST_ID.match(given):
            await send_json(send, 400, openai_error("X-Request-Id: 1-128 of [A-Za-z0-9._:-]", "invalid_request_error"))
            return
        request_id = given or f"req-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        tag = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), tag]}
            await send(message)

        accepted, owner, admin = self._owner(headers.get(b"authorization", b""))
        # the chat page itself is public (it asks for the key); its calls carry the key
        if not accepted and scope.get("path") not in ("/health", "/"):
            await send_json(send_with_id, 401, openai_error("missing or wrong API key", "authentication_error"))
            return
        scope["state"].update(owner=owner, admin=admin, admin_required=self._admin is not None)
        # The body limit: a declared length over it is refused before a byte is read; any other
        # body is read here (at most the limit, so memory stays bounded) and refused the moment
        # it passes it, before the app sees anything; the app gets the body replayed.
        limit = self.max_body_bytes
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _too_large(send_with_id, limit)
            return
        body = bytearray()
        with anyio.move_on_after(self.body_timeout) as reading:  # a slow upload holds nothing forever
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":  # the client left during its upload
                    return
                body += message.get("body", b"")
                if len(body) > limit:
                    await _too_large(send_with_id, limit)
                    return
                if not message.get("more_body", False):
                    break
        if reading.cancelled_caught:
            slow = f"the request body did not arrive within {self.body_timeout}s (body_timeout)"
            await send_json(send_with_id, 408, openai_error(slow, "invalid_request_error", "request_timeout"))
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect watch
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send_with_id)


async def _too_large(send: Send, limit: int) -> None:
    message = f"the request body is larger than {limit} bytes (--max-body-mb / max_body_bytes)"
    await send_json(send, 413, openai_error(message, "invalid_request_error", "request_too_large"))


def serve(config: GatewayConfig) -> None:
    """Run the gateway until SIGINT/SIGTERM. The signal stops every request in flight at once
    (reason ``shutdown``: streams end with an error frame, upstreams are severed), so the
    graceful wait that follows is short; it is bounded at 3 s all the same. With
    ``workers > 1`` (HTTP lanes only), that many processes share the port (:mod:`.workers`)."""
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request is noise
    if config.workers == 1:
        _serve_one(config, None, None)
        return
    in_process = [b.name for b in config.backends if runs_in_process(b.provider)]
    if in_process:
        raise ConfigError(f"workers > 1 serves HTTP lanes only; in-process backend(s): {in_process}")
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP (with
    # Nagle on, every small answer waits ~40 ms for a delayed ACK)
    bound = socket.socket(_family(config.host), socket.SOCK_STREAM, socket.IPPROTO_TCP)
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    bound.bind((config.host, config.port))
    bound.listen(2048)
    log.info("serving on %s:%d with %d workers", config.host, bound.getsockname()[1], config.workers)
    run_workers(config.workers, bound, lambda peers: _serve_one(config, peers, bound))


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _serve_one(config: GatewayConfig, peers: Peers | None, bound: Any) -> None:
    import uvicorn

    app = create_app(config, peers=peers)
    gateway: Gateway = app.state.gateway

    class StoppingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            gateway.stop_all_soon()
            super().handle_exit(sig, frame)

    StoppingServer(uvicorn_config(app, config)).run(sockets=[bound] if bound is not None else None)


def uvicorn_config(app: Any, config: GatewayConfig) -> Any:
    """uvicorn's settings for the gateway: its own h11 protocol (the disconnect stops the flight
    in ``connection_lost``; a header timeout), a 3 s graceful shutdown."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=config.access_log,
        timeout_graceful_shutdown=3,
        http=protocol_class(config.header_timeout),
    )
