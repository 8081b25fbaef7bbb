"""``abstract-client serve``: an OpenAI-compatible gateway in front of any lane, where a client's
disconnect (or ``POST /v1/requests/{id}/cancel``) stops the generation through the contract —
the upstream socket is severed, or the in-process engine's flag is set.

Needs the ``server`` extra (Starlette + uvicorn)."""

from __future__ import annotations

from .config import BackendConfig, ConfigError, GatewayConfig, key_from_env, load_config

__all__ = ["BackendConfig", "ConfigError", "GatewayConfig", "create_app", "key_from_env", "load_config", "serve"]


def create_app(config: GatewayConfig) -> object:
    from .app import create_app as _create

    return _create(config)


def serve(config: GatewayConfig) -> None:
    from .server import serve as _serve

    _serve(config)
