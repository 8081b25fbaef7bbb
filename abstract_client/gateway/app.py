"""The gateway's ASGI app: the routes wired, the lifespan, the error answers, the outermost
middleware.

Every generation runs as a :class:`~.flight.Flight`, by the runner (``runner.py``): while it
waits for a slot and while the answer is computed — streaming AND non-streaming — the client's
disconnect (the gateway's own protocol's ``connection_lost``, its disconnect thread, or an ASGI
``http.disconnect``) aborts the flight's ``AbortController``. From there it is the contract's
ordinary stop: the upstream socket is severed (HTTP lanes) or the engine's flag is set
(in-process lanes), and the chain's latency (stop seen → engine stopped) goes into
``/metrics``. ``POST /v1/requests/{id}/cancel`` aborts the same controller.

The tree (docs/architecture.md draws it): the core here — ``gateway.py`` (the ``Gateway``:
backends, flights, stop records), ``flight.py``, ``runner.py`` (every request's run),
``sinks.py`` and ``background.py`` (where an answer goes), ``server.py`` (uvicorn, workers,
signals) — and four folders: ``http/`` (the server side of HTTP: protocol, departures,
middleware, reading and writing), ``routes/`` (the front doors), ``team/`` (keys, limits, fair
slots, usage) and ``hosts/`` (workers, the store several hosts share).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .config import GatewayConfig
from .gateway import Gateway
from .hosts.workers import Peers
from .http.browsers import BrowserPolicy
from .http.error_answers import error_answer
from .http.middleware import stack
from .routes import service as routes
from .routes.chat import embeddings_endpoint, generation_endpoint
from .routes.messages import count_tokens_endpoint, messages_endpoint
from .routes.responses import cancel_response, get_response, responses_endpoint

__all__ = ["create_app"]

log = logging.getLogger("abstract_client.gateway")


def create_app(config: GatewayConfig, *, peers: Peers | None = None) -> Starlette:
    gateway = Gateway(config, peers=peers)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        log.info("serving %s", ", ".join(f"{b.name} ({b.cfg.provider})" for b in gateway.backends.values()))
        gateway.loop = asyncio.get_running_loop()
        if peers is not None:
            await peers.start(gateway)
        if gateway.hosts is not None:
            await gateway.hosts.start()
        await gateway.accounting.start()
        await gateway.upstreams.start()  # each backend's start-up line, before the first request
        probing = asyncio.get_running_loop().create_task(gateway.upstreams.run(), name="abstract-client-upstreams")
        yield
        probing.cancel()
        await asyncio.gather(probing, return_exceptions=True)
        await gateway.upstreams.aclose()
        if peers is not None:
            await peers.aclose()
        await gateway.background.aclose()
        if gateway.hosts is not None:
            await gateway.hosts.aclose()
        await gateway.aclose()

    table = [
        Route("/v1/chat/completions", generation_endpoint(gateway, chat=True), methods=["POST"]),
        Route("/v1/completions", generation_endpoint(gateway, chat=False), methods=["POST"]),
        Route("/v1/embeddings", embeddings_endpoint(gateway), methods=["POST"]),
        Route("/v1/responses", responses_endpoint(gateway), methods=["POST"]),
        Route("/v1/messages", messages_endpoint(gateway), methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens_endpoint(gateway), methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
        Route("/v1/models", routes.models, methods=["GET"]),
        Route("/v1/models/load", routes.load_or_unload, methods=["POST"]),
        Route("/v1/models/unload", routes.load_or_unload, methods=["POST"]),
        Route("/v1/requests/{request_id}/cancel", routes.cancel, methods=["POST"]),
        Route("/v1/requests/{request_id}", routes.stop_record, methods=["GET"]),
        Route("/v1/usage", routes.usage, methods=["GET"]),
        Route("/health", routes.health, methods=["GET"]),
        Route("/ready", routes.ready, methods=["GET"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
        Route("/openapi.json", routes.openapi, methods=["GET"]),
    ]
    if config.ui:
        table.append(Route("/", routes.chat_page, methods=["GET"]))

    app = Starlette(routes=table, lifespan=lifespan, exception_handlers={404: _http_error, 405: _http_error})
    app.state.gateway = gateway
    keys = [*([config.api_key] if config.api_key else []), *config.api_keys, *(k.key for k in config.keys)]
    return stack(  # type: ignore[return-value]
        app,
        keys,
        admin_key=config.admin_key,
        max_body_bytes=config.max_body_bytes,
        body_timeout=config.body_timeout,
        browsers=BrowserPolicy.of(config.host, config.allowed_hosts, config.allowed_origins),
        names=config.key_names(),
        metrics_key=config.metrics_key,
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and wrong methods answer like every other error: an OpenAI body."""
    status = int(getattr(exc, "status_code", 500))
    kind = {404: "not_found", 405: "method_not_allowed"}.get(status, "invalid_request_error")
    message = f"{request.method} {request.url.path}: " + ("no such route" if status == 404 else str(exc))
    headers = getattr(exc, "headers", None)  # a 405's Allow
    return error_answer(status, message, code=kind, headers=headers)
