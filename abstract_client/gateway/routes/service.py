"""The gateway's small routes: models, health, metrics, the OpenAPI document, cancel, a stop's
record, the chat page, and model load/unload. Each reads the :class:`~..gateway.Gateway` from the
app's state; who may do what comes from the key the request carried (``http.scope.Caller``)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
from importlib.resources import files
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from ...fleet import Fleet
from ...wires.chat_server import BadRequest
from ..gateway import Gateway
from ..hosts.store import StoreUnavailable
from ..http.error_answers import error_answer, error_response, no_backend, store_unavailable
from ..http.reading import REQUEST_ID, read_json
from ..http.scope import caller_of
from ..request_ids import flights_named, scoped
from ..team.usage_records import day_of
from .openapi import openapi_document

__all__ = [
    "CHAT_PAGE",
    "cancel",
    "chat_page",
    "health",
    "load_or_unload",
    "metrics",
    "models",
    "openapi",
    "ready",
    "stop_record",
    "usage",
]

CHAT_PAGE = files(__package__).joinpath("chat.html").read_text(encoding="utf-8")  # --ui: served at "/"


def _page_headers(page: str) -> dict[str, str]:
    """The chat page runs only its own inline script and style (by hash), talks only to this
    gateway, and no other page may frame it."""
    hashes = {}
    for tag in ("script", "style"):
        body = re.search(rf"<{tag}>(.*?)</{tag}>", page, re.S)
        assert body is not None, f"chat.html has no <{tag}>"
        hashes[tag] = "'sha256-" + base64.b64encode(hashlib.sha256(body.group(1).encode()).digest()).decode() + "'"
    policy = (
        f"default-src 'none'; script-src {hashes['script']}; style-src {hashes['style']}; connect-src 'self'; "
        "img-src 'self' data: blob:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )
    return {
        "Cache-Control": "no-store",
        "Content-Security-Policy": policy,
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
    }


PAGE_HEADERS = _page_headers(CHAT_PAGE)


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _not_found(message: str) -> JSONResponse:
    return error_answer(404, message, code="not_found")


async def models(request: Request) -> Response:
    gateway = _gateway(request)
    data = [{"id": b.name, "object": "model", "owned_by": b.cfg.provider} for b in gateway.backends.values()]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> Response:
    """Liveness: 200 while the process serves, with the truth in the body (``status``, each
    backend's reachability, the store's). A load balancer asks ``/ready``."""
    return JSONResponse(_health(request))


async def ready(request: Request) -> Response:
    """Readiness: 200 when a request can be served (``ok`` or ``degraded``), else 503."""
    body = _health(request)
    return JSONResponse(body, 200 if body["status"] in ("ok", "degraded") else 503)


def _health(request: Request) -> dict[str, Any]:
    """The gateway's view; the addresses and errors only for a caller whose key was accepted."""
    return _gateway(request).health(detail=caller_of(request.scope).accepted)


async def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    gateway, caller = _gateway(request), caller_of(request.scope)
    fleets = {name: b.llm.status() for name, b in gateway.backends.items() if isinstance(b.llm, Fleet)}
    # with keys, a client key reads no other key's name or figures: those are the admin's
    # (or the metrics_key's, which Prometheus scrapes with)
    per_key = not gateway.accounting.keyed or bool(caller.admin or caller.metrics_reader)
    text = gateway.metrics.render(list(gateway.backends), fleets, per_key=per_key)
    return Response(text, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document(ui=_gateway(request).config.ui))


async def cancel(request: Request) -> Response:
    gateway = _gateway(request)
    caller = caller_of(request.scope)
    request_id = request.path_params["request_id"]
    # another key's request is "not found": its id is not even confirmed to exist
    found = flights_named(gateway.flights, request_id, caller.owner, caller.admin)
    siblings = gateway.siblings
    if not found and siblings is not None and REQUEST_ID.match(request_id):
        # another worker or host may hold it: it checks the key the same way
        owner, admin = caller.owner or "-", "1" if caller.admin else "0"
        try:
            if await siblings.ask("cancel", request_id, owner, admin):
                return JSONResponse({"id": request_id, "cancelled": True})
        except StoreUnavailable as exc:
            return store_unavailable(exc)
    if not found:
        return _not_found("no such request in flight")
    for flight in found:
        flight.stop("cancel_endpoint")
    return JSONResponse({"id": request_id, "cancelled": True})


async def stop_record(request: Request) -> Response:
    """What the gateway measured for a stopped request (its owner's key, or the admin's)."""
    gateway, caller = _gateway(request), caller_of(request.scope)
    records = gateway.stop_records
    request_id = request.path_params["request_id"]
    record = records.get(scoped(request_id, caller.owner))
    if record is None and caller.admin:
        record = next((r for r in reversed(records.values()) if r["request_id"] == request_id), None)
    if record is None and gateway.hosts is not None and REQUEST_ID.match(request_id):  # another host's
        try:
            call_id = None if caller.admin else scoped(request_id, caller.owner)
            record = await gateway.hosts.stop_record(call_id, request_id)
        except StoreUnavailable as exc:
            return store_unavailable(exc)
    if record is None or not (caller.admin or record["owner"] == caller.owner):
        return _not_found("no stop recorded for this request")
    return JSONResponse({k: v for k, v in record.items() if k != "owner"})


async def chat_page(request: Request) -> Response:
    return HTMLResponse(CHAT_PAGE, headers=PAGE_HEADERS)


async def load_or_unload(request: Request) -> Response:
    gateway = _gateway(request)
    caller = caller_of(request.scope)
    if caller.admin_required and not caller.admin:
        return error_answer(403, "loading and unloading models needs the admin key", "permission_error")
    try:
        body = await read_json(request)
    except BadRequest as err:
        return error_response(err)
    model = body.get("model") if isinstance(body, dict) else None
    backend = gateway.backend_for(model, exact=True)
    if backend is None:
        return no_backend(model)
    try:
        if request.url.path.endswith("/load"):
            await backend.llm.aload_model()
            return JSONResponse({"model": backend.name, "loaded": True})
        report = await backend.llm.aunload_model()
        if gateway.siblings is not None:  # the other workers' (or hosts') calls on this model stop too
            with contextlib.suppress(StoreUnavailable):
                await gateway.siblings.ask("stop-backend", backend.name)
    except Exception as err:
        return error_response(err)
    answer: dict[str, Any] = {
        "model": backend.name,
        "unloaded": True,
        "stopped_requests": report.stopped_requests,
        "server_unloaded": report.server_unloaded,
        "detail": report.detail,
        "memory_before": report.memory_before,
        "memory_after": report.memory_after,
    }
    return JSONResponse(answer)


async def usage(request: Request) -> Response:
    """``GET /v1/usage?start=YYYY-MM-DD&end=YYYY-MM-DD&key=NAME``: requests and tokens by day,
    key, model and outcome (stopped answers apart from completed ones). The admin key reads every
    key's (``key`` picks one); a client key reads its own: another key's name is a 404, whether
    or not that key exists."""
    gateway, caller = _gateway(request), caller_of(request.scope)
    accounting = gateway.accounting
    if accounting.log is None:
        return _not_found("usage accounting is off on this gateway (usage = false)")
    query = request.query_params
    unknown = set(query) - {"start", "end", "key"}
    if unknown:
        return _bad_query(f"unknown query parameter(s) {sorted(unknown)}; known: start, end, key")
    days = {}
    for name in ("start", "end"):
        value = query.get(name)
        if value is None:
            continue
        try:
            days[name] = day_of(name, value)
        except ValueError as exc:
            return _bad_query(str(exc))
    own = caller.name
    key = query.get("key")
    if caller.admin or not accounting.keyed:  # the admin, or a gateway without keys
        if key is not None and key not in accounting.names:
            return _not_found(f"no key named {key[:70]!r}")
    elif key is not None and key != own:
        return _not_found(f"no key named {key[:70]!r}")  # whether it exists is not a client's to learn
    else:
        key = own
    log = accounting.log
    try:
        rows = await anyio.to_thread.run_sync(lambda: log.rows(key=key, **days))
    except log.store.errors as exc:
        return store_unavailable(exc, *log.store.unavailable)
    body = {
        "object": "usage",
        "key": key,
        "start": days.get("start"),
        "end": days.get("end"),
        "data": rows,
        "records_dropped": log.dropped,
    }
    return JSONResponse(body)


def _bad_query(message: str) -> JSONResponse:
    return error_answer(400, message, code="invalid_query")
