"""What the gateway serves: one backend (from the command line) or several (``--config``,
TOML), routed by the request's ``model`` name."""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .team.keys import ADMIN, Limits, NamedKey, hashed_name, name_problem, parse_limits

__all__ = ["BackendConfig", "ConfigError", "GatewayConfig", "key_from_env", "load_config"]


class ConfigError(ValueError):
    """A gateway configuration that cannot be served; its message is one line for the user."""


def _check(value: Any, kind: type | tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"{what} must be {_name(kind)}, not {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"{what} must be {_name(kind)}, not {value!r}")


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {int: "an integer", float: "a number", str: "a string", dict: "a table"}.get(k, k.__name__) for k in kinds
    )


@dataclass(slots=True)
class BackendConfig:
    """One backend: ``name`` is the model name clients ask for."""

    name: str
    provider: str
    model: str | None = None
    base_url: str | list[str] | None = None  # several: the same model on replicas, served as one Fleet
    options: dict[str, Any] = field(default_factory=dict)
    max_concurrent: int = 4  # generations running at once on this backend
    queue_timeout: float = 30.0  # seconds a request may wait for a slot before a 503
    # slots a key already holding one may not take: kept for another key's next request, so a
    # short question never waits behind a whole batch of one key's long answers (fair.py)
    reserved_slots: int = 0
    fair_queuing: bool = True  # False: the next slot goes to the first come, whoever its key

    def __post_init__(self) -> None:
        where = f"backend {self.name!r}"
        _check(self.name, str, f"{where}: name")
        _check(self.provider, str, f"{where}: provider")
        if self.model is not None:
            _check(self.model, str, f"{where}: model")
        if isinstance(self.base_url, list):
            if not self.base_url or not all(isinstance(u, str) for u in self.base_url):
                raise ConfigError(f"{where}: base_url must be a URL or a non-empty list of URLs")
        elif self.base_url is not None:
            _check(self.base_url, str, f"{where}: base_url")
        _check(self.options, dict, f"{where}: options")
        _check(self.max_concurrent, int, f"{where}: max_concurrent")
        _check(self.queue_timeout, (int, float), f"{where}: queue_timeout")
        if self.max_concurrent < 1 or not math.isfinite(self.queue_timeout) or self.queue_timeout < 0:
            raise ConfigError(f"{where}: max_concurrent must be >= 1 and queue_timeout >= 0")
        _check(self.fair_queuing, bool, f"{where}: fair_queuing")
        _check(self.reserved_slots, int, f"{where}: reserved_slots")
        if not 0 <= self.reserved_slots < self.max_concurrent:
            raise ConfigError(f"{where}: reserved_slots must be >= 0 and below max_concurrent ({self.max_concurrent})")


@dataclass(slots=True)
class GatewayConfig:
    backends: list[BackendConfig]
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # a bearer key every request must carry (never logged)
    api_keys: list[str] = field(default_factory=list)  # more client keys; each owns its requests
    admin_key: str | None = None  # may cancel any request; with it set, only it loads/unloads
    log_level: str = "info"
    access_log: bool = False  # uvicorn's line per request (off: it is ~6 % of a small request's cost)
    max_body_bytes: int = 32 * 2**20  # a larger request body is a 413, refused before it is read
    write_timeout: float = 30.0  # a client that reads nothing for this long is stopped (stalled)
    header_timeout: float = 10.0  # a request head not complete within this gets a 408 (slowloris)
    body_timeout: float = 30.0  # a request body not complete within this gets a 408
    workers: int = 1  # processes sharing the port (HTTP lanes only; see gateway/workers.py)
    ui: bool = False  # serve the chat page (chat.html) at "/"
    allowed_hosts: list[str] = field(default_factory=list)  # Host names besides loopback and the bind address; "*": any
    allowed_origins: list[str] = field(
        default_factory=list
    )  # web origins (besides the gateway's own page) that may call
    # Responses API background responses (POST /v1/responses with background: true)
    max_background: int = 64  # held at once (running, or finished and kept): more is a 429
    background_retention: float = 600.0  # seconds a finished one is kept for GET / resume, then 404
    background_max_bytes: int = 16 * 2**20  # events one may hold: past this it is stopped, failed
    # A Redis (or Valkey) URL shared by several gateway hosts: background responses, stop
    # records and cancels then reach across hosts (gateway/hosts.py). None: one host, as ever.
    store: str | None = None
    store_timeout: float = 2.0  # a store operation a request waits on longer than this is a 503
    host_lease: float = 5.0  # a host silent this long is dead: its running responses end owner_lost
    # image URLs on loopback and private addresses passed on to a backend that may fetch them
    # (vLLM does); link-local and metadata addresses are refused whatever this says
    private_image_urls: bool = False
    health_interval: float = 5.0  # seconds between the background probes of each backend (upstreams.py)
    # a request's model must name a backend, even on a one-backend gateway (else: any name reaches it)
    strict_model_names: bool = False
    # Named client keys ([[key]]: usage and limits say the name, never the key) and their
    # limits ([limits.<name>]; [limits.default] for every client key without its own)
    keys: list[NamedKey] = field(default_factory=list)
    limits: dict[str, Limits] = field(default_factory=dict)
    usage: bool = True  # account every request (usage.py): off only to measure what it costs
    data_dir: str | None = None  # where usage.sqlite3 lives (default: data_home())
    usage_retention_days: float = 90.0  # usage records older than this are deleted
    # a key that reads /metrics with every key's series and nothing else (Prometheus scrapes with it)
    metrics_key: str | None = None
    # a key's limits when the store holding its counts does not answer: "local" decides against
    # each process's own counts meanwhile, "refuse" answers 503 limits_unavailable (limits.py)
    limits_store_down: str = "local"
    limits_lease: float = 10.0  # a dead process's reservations come back within this (seconds)

    def __post_init__(self) -> None:
        if not self.backends:
            raise ConfigError("the gateway needs at least one backend")
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise ConfigError(f"backend names must be unique: {names}")
        _check(self.host, str, "host")
        _check(self.port, int, "port")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be between 0 and 65535, not {self.port}")
        _check(self.max_body_bytes, int, "max_body_bytes")
        if self.max_body_bytes < 1024:
            raise ConfigError("max_body_bytes must be at least 1024")
        _check(self.write_timeout, (int, float), "write_timeout")
        if not self.write_timeout > 0:
            raise ConfigError("write_timeout must be > 0 seconds")
        for field_name in ("header_timeout", "body_timeout"):
            _check(getattr(self, field_name), (int, float), field_name)
            if not getattr(self, field_name) > 0:
                raise ConfigError(f"{field_name} must be > 0 seconds")
        _check(self.max_background, int, "max_background")
        if self.max_background < 0:
            raise ConfigError("max_background must be >= 0 (0: no background responses)")
        _check(self.background_retention, (int, float), "background_retention")
        if not (math.isfinite(self.background_retention) and self.background_retention > 0):
            raise ConfigError("background_retention must be > 0 seconds")
        _check(self.background_max_bytes, int, "background_max_bytes")
        if self.background_max_bytes < 4096:
            raise ConfigError("background_max_bytes must be at least 4096")
        if self.store is not None:
            _check(self.store, str, "store")
            if not self.store.startswith(("redis://", "rediss://", "unix://")):
                raise ConfigError(f"store must be a redis://, rediss:// or unix:// URL, not {self.store!r:.60}")
        _check(self.private_image_urls, bool, "private_image_urls")
        for name in ("store_timeout", "host_lease"):
            _check(getattr(self, name), (int, float), name)
        if not (0 < self.store_timeout <= 30):
            raise ConfigError("store_timeout must be > 0 and <= 30 seconds")
        if not (1 <= self.host_lease <= 10):
            raise ConfigError("host_lease must be between 1 and 10 seconds")
        _check(self.health_interval, (int, float), "health_interval")
        if not (0.5 <= self.health_interval <= 300):
            raise ConfigError("health_interval must be between 0.5 and 300 seconds")
        _check(self.strict_model_names, bool, "strict_model_names")
        _check(self.ui, bool, "ui")
        _check(self.access_log, bool, "access_log")
        _check(self.workers, int, "workers")
        if not 1 <= self.workers <= 64:
            raise ConfigError(f"workers must be between 1 and 64, not {self.workers}")
        _check(self.api_keys, list, "api_keys")
        for name in ("allowed_hosts", "allowed_origins"):
            values = getattr(self, name)
            _check(values, list, name)
            for value in values:
                _check(value, str, name)
        for name, key in [
            ("api_key", self.api_key),
            ("admin_key", self.admin_key),
            ("metrics_key", self.metrics_key),
        ] + [("api_keys", k) for k in self.api_keys]:
            if key is None:
                continue
            _check(key, str, name)
            if key != key.strip():
                raise ConfigError(f"{name} has leading or trailing whitespace, which no client would send")
            if not key.strip():
                raise ConfigError(f"{name} has an empty key: refusing to serve with a key nobody can send")
        self._check_keys()
        _check(self.usage, bool, "usage")
        _check(self.usage_retention_days, (int, float), "usage_retention_days")
        if not (math.isfinite(self.usage_retention_days) and 0 < self.usage_retention_days <= MAX_RETENTION_DAYS):
            raise ConfigError(f"usage_retention_days must be > 0 and <= {MAX_RETENTION_DAYS}")
        _check(self.limits_store_down, str, "limits_store_down")
        if self.limits_store_down not in ("local", "refuse"):
            raise ConfigError(f"limits_store_down must be 'local' or 'refuse', not {self.limits_store_down!r:.40}")
        _check(self.limits_lease, (int, float), "limits_lease")
        if not (2 <= self.limits_lease <= 300):
            raise ConfigError("limits_lease must be between 2 and 300 seconds")
        if self.data_dir is not None:
            _check(self.data_dir, str, "data_dir")

    def _check_keys(self) -> None:
        names: list[str] = []
        for named in self.keys:
            if not isinstance(named, NamedKey):
                raise ConfigError("keys must be [[key]] tables with a name and a key (or key_env)")
            problem = name_problem(named.name)
            if problem is not None:
                raise ConfigError(problem)
            _check(named.key, str, f"key {named.name!r}")
            if not named.key.strip() or named.key != named.key.strip():
                raise ConfigError(f"key {named.name!r} is empty or has leading or trailing whitespace")
            names.append(named.name)
        if len(set(names)) != len(names):
            raise ConfigError(f"key names must be unique: {names}")
        every = [k.key for k in self.keys] + [
            k for k in (self.api_key, *self.api_keys, self.admin_key, self.metrics_key) if k
        ]
        if len(set(every)) != len(every):
            raise ConfigError("the same key is configured twice: usage could not say whose a request is")
        given = len([k for k in (self.api_key, *self.api_keys, self.admin_key) if k]) + len(self.keys)
        if len(self.key_names()) != given:  # two keys given without a name whose hashes begin alike
            raise ConfigError("two keys have the same name: name them in [[key]] tables")
        _check(self.limits, dict, "limits")
        known = set(self.key_names()) | {"default"}
        for name, limits in self.limits.items():
            if name not in known:
                raise ConfigError(f"[limits.{name}]: no key is named {name!r} (keys: {sorted(known - {'default'})})")
            if not isinstance(limits, Limits):
                raise ConfigError(f"[limits.{name}] must be a table of limits")

    def key_names(self) -> dict[str, str]:
        """Every client key (and the admin key) by the name usage and limits know it by."""
        named = {k.key: k.name for k in self.keys}
        for key in (self.api_key, *self.api_keys):
            if key:
                named[key] = hashed_name(key)
        if self.admin_key:
            named[self.admin_key] = ADMIN
        return {name: key for key, name in named.items()}

    def limits_for(self, name: str) -> Limits | None:
        """A key's limits: its own table, else the default (never for the admin key)."""
        own = self.limits.get(name)
        if own is not None or name == ADMIN:
            return own
        return self.limits.get("default")


MAX_RETENTION_DAYS = 3660  # ten years: what a usage answer walks at most on the shared store


def key_from_env(name: str) -> str:
    """The API key held by environment variable ``name``: unset or empty refuses to start (a
    gateway meant to need a key must never serve without one)."""
    value = os.environ.get(name, "")
    if not value.strip():
        raise ConfigError(f"the API key variable {name} is unset or empty: refusing to serve without auth")
    # A key read from a file into a variable often ends in a newline no client sends: the key is
    # what is between (the start-up check already judged it so, and the compare must agree).
    return value.strip()


_SERVER_KEYS = {
    "host",
    "port",
    "api_key",
    "api_key_env",
    "api_keys",
    "admin_key",
    "admin_key_env",
    "log_level",
    "access_log",
    "max_body_bytes",
    "write_timeout",
    "workers",
    "header_timeout",
    "body_timeout",
    "ui",
    "allowed_hosts",
    "allowed_origins",
    "max_background",
    "background_retention",
    "background_max_bytes",
    "store",
    "store_timeout",
    "host_lease",
    "private_image_urls",
    "health_interval",
    "strict_model_names",
    "data_dir",
    "usage",
    "usage_retention_days",
    "metrics_key",
    "metrics_key_env",
    "limits_store_down",
    "limits_lease",
}
_BACKEND_KEYS = set(BackendConfig.__dataclass_fields__)


def load_config(path: str | Path) -> GatewayConfig:
    """``[server]`` (host, port, api_key or api_key_env, log_level, access_log, max_body_bytes) and
    ``[[backend]]`` tables (name, provider, model, base_url, max_concurrent, queue_timeout,
    options). Anything wrong is a :class:`ConfigError` with a one-line message."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"no config file at {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    unknown = set(data) - {"server", "backend", "key", "limits"}
    if unknown:
        raise ConfigError(
            f"{path}: unknown table(s) {sorted(unknown)} (expected [server], [[backend]], [[key]], [limits])"
        )
    server = dict(data.get("server") or {})
    unknown = set(server) - _SERVER_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown [server] key(s) {sorted(unknown)}; known: {sorted(_SERVER_KEYS)}")
    for env_key, key in (
        ("api_key_env", "api_key"),
        ("admin_key_env", "admin_key"),
        ("metrics_key_env", "metrics_key"),
    ):
        env = server.pop(env_key, None)
        if env is not None:
            _check(env, str, env_key)
            server[key] = key_from_env(env)
    backends = []
    entries = data.get("backend") or []
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: backends are [[backend]] tables")
    for entry in entries:
        entry = dict(entry)
        unknown = set(entry) - _BACKEND_KEYS
        if unknown:
            raise ConfigError(f"{path}: unknown [[backend]] key(s) {sorted(unknown)}; known: {sorted(_BACKEND_KEYS)}")
        if "name" not in entry or "provider" not in entry:
            raise ConfigError(f"{path}: a [[backend]] needs name and provider: {entry}")
        backends.append(BackendConfig(**entry))
    keys = _named_keys(path, data.get("key") or [])
    names = {k.name for k in keys} | {hashed_name(k) for k in server.get("api_keys") or [] if isinstance(k, str)}
    if isinstance(server.get("api_key"), str):
        names.add(hashed_name(server["api_key"]))
    if server.get("admin_key"):
        names.add(ADMIN)
    limits = parse_limits(data.get("limits") or {}, names, ConfigError)
    return GatewayConfig(backends=backends, keys=keys, limits=limits, **server)


def _named_keys(path: str | Path, entries: Any) -> list[NamedKey]:
    """``[[key]]`` tables: ``name`` and ``key`` or ``key_env`` (the variable holding it)."""
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: keys are [[key]] tables")
    keys = []
    for entry in entries:
        unknown = set(entry) - {"name", "key", "key_env"}
        if unknown or "name" not in entry or ("key" in entry) == ("key_env" in entry):
            raise ConfigError(f"{path}: a [[key]] has a name and one of key, key_env; not {sorted(entry)}")
        key = entry.get("key")
        if "key_env" in entry:
            _check(entry["key_env"], str, "key_env")
            key = key_from_env(entry["key_env"])
        keys.append(NamedKey(entry["name"], key))
    return keys
