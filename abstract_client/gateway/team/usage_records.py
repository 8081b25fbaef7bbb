"""One request's usage record (:class:`UsageRecord`), and the names and days the usage store and
its readers share."""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "OUTCOMES",
    "Refusals",
    "UsageRecord",
    "UsageUnwritable",
    "data_home",
    "day_of",
    "day_of_minute",
    "usage_file",
]

OUTCOMES = ("completed", "stopped", "error", "refused")
# (minute, key, model, route, limit) -> refusals: what a batch adds
Refusals = dict[tuple[int, str, str, str, str], int]


def data_home() -> Path:
    """The gateway's data directory: ``$ABSTRACT_CLIENT_DATA_DIR``, else
    ``$XDG_DATA_HOME/abstract-client``, else ``~/.local/share/abstract-client``."""
    given = os.environ.get("ABSTRACT_CLIENT_DATA_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "abstract-client"


_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\Z")


def day_of(name: str, value: str) -> str:
    """A query's day, ``YYYY-MM-DD`` and nothing else (ISO's week dates and ordinal days are
    refused: a ``ValueError`` saying what is wrong, in one line)."""
    try:
        if not _DAY.match(value):
            raise ValueError
        return dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise ValueError(f"{name} must be a date, YYYY-MM-DD, not {value[:40]!r}") from None


def usage_file(data_dir: str | None) -> Path:
    """The SQLite file of a gateway whose data directory is ``data_dir`` (None: :func:`data_home`)."""
    return (Path(data_dir).expanduser() if data_dir else data_home()) / "usage.sqlite3"


@dataclass(slots=True)
class UsageRecord:
    """One request. Tokens are the engine's count: ``prompt_tokens`` the prompt it was given,
    ``cached_tokens`` how many of them a prompt cache served (not computed), ``generated_tokens``
    what it generated — up to the stop, for a stopped answer. A request refused before it
    reached an engine costs nothing (``outcome`` ``refused``, ``reason`` the limit)."""

    started_at: float  # unix time the request arrived
    key: str  # its name
    model: str  # the backend that served it (the gateway's name for the model)
    route: str
    request_id: str
    outcome: str  # completed | stopped | error | refused
    reason: str | None = None  # a stop's reason, an error's type, a refusal's limit
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    queued_ms: float | None = None  # waiting for a slot
    first_token_ms: float | None = None  # arrival to the first token sent (streams)
    total_ms: float | None = None

    @property
    def day(self) -> str:
        return dt.datetime.fromtimestamp(self.started_at, dt.UTC).strftime("%Y-%m-%d")

    @property
    def computed_tokens(self) -> int:
        """What the engine did: the prompt it computed (not the cache's share) and what it generated."""
        return max(0, self.prompt_tokens - self.cached_tokens) + self.generated_tokens


class UsageUnwritable(Exception):
    """The usage store cannot be opened or written at start-up (the message is one line)."""


def day_of_minute(minute: int) -> str:
    return dt.datetime.fromtimestamp(minute * 60, dt.UTC).strftime("%Y-%m-%d")
