"""What the gateway serves: one backend (from the command line) or several (``--config``,
TOML), routed by the request's ``model`` name."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BackendConfig", "GatewayConfig", "load_config"]


@dataclass(slots=True)
class BackendConfig:
    """One backend: ``name`` is the model name clients ask for."""

    name: str
    provider: str
    model: str | None = None
    base_url: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    max_concurrent: int = 4  # generations running at once on this backend
    queue_timeout: float = 30.0  # seconds a request may wait for a slot before a 503


@dataclass(slots=True)
class GatewayConfig:
    backends: list[BackendConfig]
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # a bearer key every request must carry (never logged)
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.backends:
            raise ValueError("the gateway needs at least one backend")
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backend names must be unique: {names}")
        for b in self.backends:
            if b.max_concurrent < 1 or b.queue_timeout < 0:
                raise ValueError(f"{b.name}: max_concurrent >= 1 and queue_timeout >= 0")


def load_config(path: str | Path) -> GatewayConfig:
    """``[server]`` (host, port, api_key or api_key_env, log_level) and ``[[backend]]`` tables
    (name, provider, model, base_url, max_concurrent, queue_timeout, options)."""
    data = tomllib.loads(Path(path).read_text())
    server = dict(data.get("server") or {})
    env = server.pop("api_key_env", None)
    if env:
        server["api_key"] = os.environ.get(str(env)) or None
    backends = []
    for entry in data.get("backend") or []:
        entry = dict(entry)
        if "name" not in entry or "provider" not in entry:
            raise ValueError(f"a [[backend]] needs name and provider: {entry}")
        backends.append(BackendConfig(**entry))
    return GatewayConfig(backends=backends, **server)
