"""``/v1/responses``: the OpenAI Responses API in front of every backend, in-process ones included.

* **Foreground** (``background`` false): a generation like chat's — the same runner
  (``runner.py``), slot and stop — whose client's disconnect stops the engine. Streamed as
  Responses events (``wires.responses_server.ResponseBuilder``), or answered as one ``response``.
* **Background** (``background: true``): the generation belongs to the gateway, not to the
  connection that asked for it: the same runner, its answer kept (``background.KeptEvents``). It
  runs until done or cancelled; its events are kept (numbered from 0) so that any number of
  readers can read them — ``GET /v1/responses/{id}?stream=true&starting_after=N`` — and a
  reader's disconnect stops only that reader. ``POST /v1/responses/{id}/cancel`` stops the
  engine (the owner's key, or the admin's).
* **Bounded** (``GatewayConfig``): ``max_background`` held at once (then a 429, code
  ``too_many_background_responses``); a finished one is kept ``background_retention`` seconds
  (then a 404); one may hold ``background_max_bytes`` of events (then it is stopped and ends
  ``failed``, code ``response_too_large``).
* **Workers**: a background response's id names the worker that runs it (``resp_w2_…``); a
  GET or a cancel that lands on another worker is relayed to it over the workers' Unix
  sockets (``workers.Peers``).
* **Several hosts** (``serve --store redis://…``): the responses are in the store, and every
  host (each worker a host of it) reads and cancels every one (``shared_background.py``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...wires.chat_server import BadRequest, generation_args
from ...wires.responses_server import ResponseBuilder, ResponseFrames, chat_body_of, new_response_id
from ..background import OWNER_END, OWNER_LOST, ResponseRecord, read_query
from ..gateway import Gateway
from ..hosts.store import StoreUnavailable
from ..hosts.workers import relay
from ..http.error_answers import error_answer, error_response, refusal_response, store_unavailable
from ..http.reader_stream import ReaderStream
from ..http.scope import caller_of
from ..request_ids import scoped
from ..runner import Job, JobResponse
from ..team.limits import Refusal
from .prologue import Parsed, parse_request

__all__ = ["cancel_response", "get_response", "responses_endpoint"]

log = logging.getLogger("abstract_client.gateway")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RESPONSE_ID = re.compile(r"^resp_(?:w(\d+)_)?[0-9a-f]{32}$")


def responses_endpoint(gateway: Gateway) -> Callable[[Request], Awaitable[Any]]:
    async def handle(request: Request) -> Any:
        got = await parse_request(gateway, request, _response_args)
        if not isinstance(got, Parsed):
            return got
        (kwargs, stream, background), body, model, request_id = got.args, got.body, got.model, got.request_id
        job = Job("responses", got.backend, request_id, "stream" if stream or background else "generate", kwargs)
        job.max_tokens, job.prompt = kwargs.get("max_tokens"), kwargs
        if background:
            return await _start_background(gateway, request, job, body, model, stream)
        builder = ResponseBuilder(f"resp_{request_id}", model, body, background=False)
        if stream:
            job.frames = ResponseFrames(builder)
        else:
            job.body_of = builder.whole
        return JobResponse(gateway.runner, job)

    return handle


async def _start_background(
    gateway: Gateway, request: Request, job: Job, body: dict[str, Any], model: str, stream: bool
) -> Response | ReaderStream:
    backend = job.backend
    try:  # the checks a foreground request meets in its call, met here before the 200 (#48)
        backend.llm.check_call(**job.kwargs)
    except (TypeError, ValueError) as err:
        return error_response(err)
    store, runner = gateway.background, gateway.runner
    caller = caller_of(request.scope)
    name = caller.name
    admitted = await runner.admit(job, name)  # before the 200
    if isinstance(admitted, Refusal):
        return refusal_response(*runner.refused(job, name, admitted))
    if not store.room():
        admitted.settle(0)
        message = f"this gateway holds {gateway.config.max_background} background responses (max_background)"
        return error_answer(429, message, "rate_limit_error", "too_many_background_responses")
    prefix = f"w{gateway.peers.index}_" if gateway.peers is not None else ""
    builder = ResponseBuilder(new_response_id(prefix), model, body, background=True)
    owner = caller.owner
    job.request_id = builder.id
    flight = runner.flight(job, name, admitted, owner, scoped(builder.id, owner))
    record = store.new_record(builder, flight, owner)
    try:
        await record.open()  # in the store, before its 200: any host can read it from then on
    except StoreUnavailable as exc:
        admitted.settle(0)
        return store_unavailable(exc)
    store.start(record, job)
    if stream:
        return _event_stream(gateway, record, None)
    return JSONResponse(builder.response())


def _response_args(body: Any) -> tuple[dict[str, Any], bool, bool]:
    """The call's arguments, whether it streams, whether it runs in the background."""
    chat, stream, background = chat_body_of(body)
    kwargs, _, _ = generation_args(chat, chat=True)
    return kwargs, stream, background


def _event_stream(gateway: Gateway, record: ResponseRecord, after: int | None) -> ReaderStream:
    """A reader of a background response: its disconnect ends the reading, never the response;
    a reader that stops reading is cut after the write timeout (``reader_stream``)."""
    return ReaderStream(record.follow(after), write_timeout=gateway.config.write_timeout, headers=SSE_HEADERS)


# -- GET /v1/responses/{id}, POST /v1/responses/{id}/cancel ----------------------------------------


def _not_found() -> JSONResponse:
    return error_answer(404, "no such background response", code="not_found")


async def _lookup(request: Request) -> tuple[Gateway, ResponseRecord | None, str]:
    gateway: Gateway = request.app.state.gateway
    caller = caller_of(request.scope)
    response_id = request.path_params["response_id"]
    record = await gateway.background.get(response_id, caller.owner, caller.admin)
    return gateway, record, response_id


async def _until_owner_ends(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A relayed event stream, passed on as it comes, less the owner's end mark; one that closes
    without it (the owner was killed) ends with an ``error`` event, never a clean end."""
    held = b""
    async for part in body:
        data = held + part
        held = data[-1:] if data.endswith(OWNER_END) else b""
        out = data[:-1] if held else data
        if out:
            yield out
    if held != OWNER_END:
        yield OWNER_LOST


async def get_response(request: Request) -> Response | ReaderStream:
    try:
        gateway, record, response_id = await _lookup(request)
        if record is None:
            relayed = await _relay_to_owner(gateway, request, response_id)
            return relayed if relayed is not None else _not_found()
        try:
            stream, after = read_query(request.query_params.get("stream"), request.query_params.get("starting_after"))
        except BadRequest as exc:
            return error_response(exc)
        if not stream:
            return JSONResponse(await record.snapshot())
        return _event_stream(gateway, record, after)
    except StoreUnavailable as exc:
        return store_unavailable(exc)


async def cancel_response(request: Request) -> Response | ReaderStream:
    try:
        gateway, record, response_id = await _lookup(request)
        if record is None:
            relayed = await _relay_to_owner(gateway, request, response_id)
            return relayed if relayed is not None else _not_found()
        await record.cancel()
        return JSONResponse(await record.snapshot())
    except StoreUnavailable as exc:
        return store_unavailable(exc)


async def _relay_to_owner(gateway: Gateway, request: Request, response_id: str) -> Response | ReaderStream | None:
    """A response another worker holds (its id names it): the request is relayed to that
    worker, which checks the caller's key as it would locally, and its answer streamed back."""
    match = RESPONSE_ID.match(response_id)
    peers = gateway.peers
    if match is None or match.group(1) is None or peers is None or int(match.group(1)) == peers.index:
        return None
    caller = caller_of(request.scope)
    action = "cancel" if request.url.path.endswith("/cancel") else "get"
    try:  # the same parser as the owner's: what one refuses, the other refuses
        stream, after = read_query(request.query_params.get("stream"), request.query_params.get("starting_after"))
    except BadRequest as exc:
        return error_response(exc)
    owner, admin = caller.owner or "-", "1" if caller.admin else "0"
    line = f"response {action} {response_id} {owner} {admin} {str(stream).lower()} {'-' if after is None else after}"
    answer = await relay(peers.path(int(match.group(1))), line)
    if answer is None:  # the owner did not answer: not "no such response", a retryable 503
        message = "the worker that holds this response did not answer"
        return error_answer(503, message, "unavailable_error", "owner_unreachable", {"retry-after": "1"})
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
