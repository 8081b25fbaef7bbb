"""Running the gateway: uvicorn with the gateway's own protocol, one process or ``workers``
sharing the port, every request stopped at once on SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import socket
from typing import Any

from ..registry import runs_in_process
from .app import create_app
from .config import ConfigError, GatewayConfig
from .flight import Backend
from .gateway import Gateway
from .hosts.workers import Peers, run_workers
from .http.protocol import protocol_class

__all__ = ["serve", "uvicorn_config"]

log = logging.getLogger("abstract_client.gateway")


def serve(config: GatewayConfig) -> None:
    """Run the gateway until SIGINT/SIGTERM. The signal stops every request in flight at once
    (reason ``shutdown``: streams end with an error frame, upstreams are severed), so the
    graceful wait that follows is short; it is bounded at 3 s all the same. With
    ``workers > 1`` (HTTP lanes only), that many processes share the port (:mod:`.workers`)."""
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request is noise
    check_usage_store(config)  # an unwritable database is one line at start-up, before any worker
    if config.workers == 1:
        _serve_one(config, None, None)
        return
    in_process = [b.name for b in config.backends if runs_in_process(b.provider)]
    if in_process:
        raise ConfigError(f"workers > 1 serves HTTP lanes only; in-process backend(s): {in_process}")
    for backend in config.backends:  # a wrong backend is said here, once, not by every worker
        Backend(backend).llm.close()
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP (with
    # Nagle on, every small answer waits ~40 ms for a delayed ACK)
    bound = socket.socket(_family(config.host), socket.SOCK_STREAM, socket.IPPROTO_TCP)
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    bound.bind((config.host, config.port))
    bound.listen(2048)
    log.info("serving on %s:%d with %d workers", config.host, bound.getsockname()[1], config.workers)
    # with a store, every worker is a host of it: one mechanism between workers and hosts
    run_workers(config.workers, bound, lambda peers: _serve_one(config, None if config.store else peers, bound))


def check_usage_store(config: GatewayConfig) -> None:
    """The usage database can be written (else a :class:`ConfigError`, said before serving)."""
    if not config.usage or config.store is not None:  # a shared store may come up after this host
        return
    from .team.usage_records import UsageUnwritable, usage_file
    from .team.usage_stores import SQLiteUsage

    try:
        SQLiteUsage(usage_file(config.data_dir)).close()
    except UsageUnwritable as exc:
        raise ConfigError(str(exc)) from None


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
