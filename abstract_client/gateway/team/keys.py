"""Who uses the gateway, and how much each may: named client keys (``[[key]]``) and their limits
(``[limits.<name>]``, ``[limits.default]`` for every key without a table of its own).

A key's *name* is what usage, limits and ``/metrics`` say; the key itself is never shown. Keys
given without a name (``api_key``, ``api_keys``) are named by a hash of the key (``key-1a2b3c4d``),
the admin key is ``admin``, and a gateway without keys serves ``anonymous``."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, fields
from typing import Any, Literal

__all__ = [
    "ADMIN",
    "ANONYMOUS",
    "KEY_NAME",
    "METRICS",
    "PERIODS",
    "Limits",
    "NamedKey",
    "hashed_name",
    "name_problem",
    "parse_limits",
]

ADMIN = "admin"
ANONYMOUS = "anonymous"
METRICS = "metrics"  # the name of the key that reads /metrics only (``metrics_key``)
KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
PERIODS = ("day", "week", "month")
_RESERVED = (ADMIN, ANONYMOUS, METRICS, "default")
_HASHED = re.compile(r"key-[0-9a-f]{8}\Z", re.IGNORECASE)


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a ``[[key]]`` (None: it can). The gateway's own names are
    reserved in any case, and so is the form it names a key given without a name by."""
    if not isinstance(name, str) or not KEY_NAME.match(name):
        return f"a key's name must be 1-64 of [A-Za-z0-9._-], not {name!r:.70}"
    if name.lower() in _RESERVED:
        return f"a key may not be named {name!r} (the gateway's own name {name.lower()!r})"
    if _HASHED.match(name):
        return f"a key may not be named {name!r}: key-<8 hex digits> names a key given without a name"
    return None


def hashed_name(key: str) -> str:
    """The name of a key configured without one: its hash, never the key."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


@dataclass(frozen=True, slots=True)
class NamedKey:
    name: str
    key: str


@dataclass(frozen=True, slots=True)
class Limits:
    """What one key may use. ``None``: no limit of that kind.

    * ``concurrent``: its requests in flight at once (queued ones included), across backends;
    * ``requests_per_minute``, ``tokens_per_minute``: over the last 60 s. Tokens are what the
      engine did (prompt tokens it computed, not those a prompt cache served, plus generated
      tokens, a stopped answer's included); a request reserves its prompt's bound and its
      ``max_tokens`` at admission (at most what is left) and settles to the engine's count
      when it ends. 0 refuses every request of the key (a key suspended);
    * ``token_budget`` per ``budget_period`` (calendar ``day``, ``week`` or ``month``, UTC):
      a request is refused once the budget is spent; one that crosses it mid-answer finishes;
    * ``weight``: its share of a busy backend's slots against other keys' (fair queuing).
    """

    concurrent: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    token_budget: int | None = None
    budget_period: Literal["day", "week", "month"] = "month"
    weight: int = 1

    @property
    def limited(self) -> bool:
        return any(
            v is not None
            for v in (self.concurrent, self.requests_per_minute, self.tokens_per_minute, self.token_budget)
        )


_FIELDS = [f.name for f in fields(Limits)]


def _limits_of(where: str, table: Any, error: type[Exception]) -> Limits:
    if not isinstance(table, dict):
        raise error(f"{where} must be a table of limits ({', '.join(_FIELDS)})")
    unknown = set(table) - set(_FIELDS)
    if unknown:
        raise error(f"{where}: unknown limit(s) {sorted(unknown)}; known: {_FIELDS}")
    for name, value in table.items():
        if name == "budget_period":
            if value not in PERIODS:
                raise error(f"{where}: budget_period must be one of {list(PERIODS)}, not {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(f"{where}: {name} must be a whole number, not {value!r}")
        if value < (1 if name == "weight" else 0):
            raise error(f"{where}: {name} must be >= {1 if name == 'weight' else 0}, not {value}")
    return Limits(**table)


def parse_limits(tables: Any, key_names: set[str], error: type[Exception]) -> dict[str, Limits]:
    """``[limits]``: ``default`` and one table per key name. A name no key has is refused (a typo
    would otherwise leave that key unlimited)."""
    if not isinstance(tables, dict):
        raise error("[limits] must hold tables: [limits.default], [limits.<key name>]")
    out: dict[str, Limits] = {}
    for name, table in tables.items():
        if name != "default" and name not in key_names:
            known = sorted(key_names) or "none: name them in [[key]] tables"
            raise error(f"[limits.{name}]: no key is named {name!r} (keys: {known})")
        out[name] = _limits_of(f"[limits.{name}]", table, error)
    return out
