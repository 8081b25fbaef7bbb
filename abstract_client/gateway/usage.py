"""What every request cost, by key: one :class:`UsageRecord` per request (its key, model, route,
the tokens the engine counted — a stopped answer's up to its stop — its outcome and its times),
kept in SQLite (``usage.sqlite3`` under the gateway's data directory).

Off the request path: a request only appends its record to a list (``UsageLog.add``); a writer
thread takes the list every :data:`FLUSH_SECONDS` and writes it in one transaction. A write that
fails (a full disk, a database locked past its busy timeout, a file gone read-only) never fails
a request: the records of that batch are dropped, counted exactly (``dropped``: ``/metrics`` and
``GET /v1/usage`` say it) and an ERROR line says how many and why (once a minute while it lasts); the next success
says so once, with the count.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = [
    "FLUSH_SECONDS",
    "MAX_PENDING",
    "OUTCOMES",
    "RedisUsage",
    "SQLiteUsage",
    "UsageLog",
    "UsageRecord",
    "UsageUnwritable",
    "data_home",
    "day_of",
    "open_for_reading",
    "usage_file",
    "usage_rows",
]

log = logging.getLogger("abstract_client.gateway")

FLUSH_SECONDS = 0.5  # how long a record waits for its batch
MAX_PENDING = 200_000  # records held while the database cannot be written; more are dropped (counted)
OUTCOMES = ("completed", "stopped", "error", "refused")


def data_home() -> Path:
    """The gateway's data directory: ``$ABSTRACT_CLIENT_DATA_DIR``, else
    ``$XDG_DATA_HOME/abstract-client``, else ``~/.local/share/abstract-client``."""
    given = os.environ.get("ABSTRACT_CLIENT_DATA_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "abstract-client"


def day_of(name: str, value: str) -> str:
    """A query's day, ``YYYY-MM-DD`` (a ``ValueError`` saying what is wrong, in one line)."""
    try:
        if len(value) != 10:
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


_COLUMNS = [f.name for f in fields(UsageRecord)]
_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    started_at REAL NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL,
    route TEXT NOT NULL, request_id TEXT NOT NULL, outcome TEXT NOT NULL, reason TEXT,
    prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL, generated_tokens INTEGER NOT NULL,
    queued_ms REAL, first_token_ms REAL, total_ms REAL, day TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_day_key ON usage (day, key);
CREATE INDEX IF NOT EXISTS usage_started ON usage (started_at);
"""
_INSERT = f"INSERT INTO usage ({', '.join(_COLUMNS)}, day) VALUES ({', '.join('?' * (len(_COLUMNS) + 1))})"


class UsageUnwritable(Exception):
    """The usage store cannot be opened or written at start-up (the message is one line)."""


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=2.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")  # readers (GET /v1/usage, the CLI) never wait on the writer
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    return db


class SQLiteUsage:
    """One record per row in a file: the default, one host (its workers share the file)."""

    errors: tuple[type[Exception], ...] = (sqlite3.Error, OSError)

    def __init__(self, path: Path) -> None:
        self.where = str(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = _connect(path)
            self.db.execute("BEGIN IMMEDIATE")  # can it be written, not only read?
            self.db.execute("ROLLBACK")
        except (OSError, sqlite3.Error) as exc:
            raise UsageUnwritable(f"the usage database {path} cannot be written: {exc}") from None

    def write(self, batch: list[UsageRecord]) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany(_INSERT, [(*astuple(r), r.day) for r in batch])
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def prune(self, before: float) -> None:
        self.db.execute("DELETE FROM usage WHERE started_at < ?", (before,))

    def rows(self, **query: Any) -> list[dict[str, Any]]:
        return usage_rows(self.db, **query)

    def spent_since(self, since: float) -> dict[str, int]:
        cur = self.db.execute(
            "SELECT key, SUM(MAX(0, prompt_tokens - cached_tokens) + generated_tokens) FROM usage"
            " WHERE started_at >= ? GROUP BY key",
            (since,),
        )
        return {key: int(n or 0) for key, n in cur.fetchall()}

    def close(self) -> None:
        self.db.close()


# ARGV: (hash, field, n, expire-at) per counter. A field that is not an integer (an operator's
# edit) is replaced, not an error: HINCRBY on it would fail the batch, and every batch after it.
_ADD = """
for i = 1, #ARGV, 4 do
  local old = redis.call('HGET', ARGV[i], ARGV[i + 1])
  if old and not tonumber(old) then
    redis.call('HSET', ARGV[i], ARGV[i + 1], ARGV[i + 2])
  else
    redis.call('HINCRBY', ARGV[i], ARGV[i + 1], ARGV[i + 2])
  end
  redis.call('EXPIREAT', ARGV[i], ARGV[i + 3])
end
return 1
"""
_SUMS = ("requests", "prompt_tokens", "cached_tokens", "generated_tokens", "computed")


class RedisUsage:
    """Several hosts (``--store redis://…``): every host adds its records to one hash per day
    (``ac:usage:<day>``: a counter per key, model, outcome and sum, added by one script per
    batch), so any host answers ``GET /v1/usage`` for all. A day's hash expires ``retention``
    after the day. A counter that is not ours (an operator's edit, another version's) is
    skipped when read and replaced when written: never an error for the rest."""

    def __init__(self, url: str, retention: float) -> None:
        try:
            import redis
            from redis.exceptions import RedisError
        except ImportError:
            raise UsageUnwritable("--store needs redis-py: pip install 'abstract-client[redis]'") from None
        from .hosts import _without_password

        self.errors: tuple[type[Exception], ...] = (RedisError, OSError)
        self.where = _without_password(url)
        self.retention = retention
        # a store that hangs, or a connection the network drops silently, is a timeout: that batch
        # is dropped (counted), and the next one opens a new connection
        self.redis = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._said_malformed = False
        self._add = self.redis.register_script(_ADD)

    def write(self, batch: list[UsageRecord]) -> None:
        sums: dict[tuple[str, str], int] = defaultdict(int)  # (day, counter) -> what the batch adds
        for r in batch:
            head = f"{r.key}\t{r.model}\t{r.outcome}\t"
            counts = (1, r.prompt_tokens, r.cached_tokens, r.generated_tokens, r.computed_tokens)
            for field, n in zip(_SUMS, counts, strict=True):
                if n:
                    sums[(r.day, head + field)] += n
        args: list[Any] = []
        for (day, field), n in sums.items():
            end = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp() + 86400
            args += [f"ac:usage:{day}", field, n, int(end + self.retention)]
        self._add(args=args)  # one script: the batch counts whole or not at all

    def prune(self, before: float) -> None:  # each day's hash expires by itself
        return

    def _days(self, start: str | None, end: str | None) -> list[str]:
        today = dt.datetime.now(dt.UTC).date()
        first = dt.date.fromisoformat(start) if start else today - dt.timedelta(days=int(self.retention // 86400) + 1)
        last = min(dt.date.fromisoformat(end), today) if end else today
        return [(first + dt.timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]

    def _by_day(self, start: str | None, end: str | None) -> list[tuple[str, dict[bytes, bytes]]]:
        """Each day's counters, ``start`` … ``end`` (one round trip)."""
        days = self._days(start, end)
        pipe = self.redis.pipeline(transaction=False)
        for day in days:
            pipe.hgetall(f"ac:usage:{day}")
        return list(zip(days, pipe.execute(), strict=True))

    def rows(self, *, start: str | None = None, end: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        out = []
        for day, counters in self._by_day(start, end):
            groups: dict[tuple[str, str, str], dict[str, Any]] = {}
            for k, model, outcome, what, n in self._counters(counters):
                if key is not None and k != key:
                    continue
                row = groups.setdefault(
                    (k, model, outcome),
                    {"day": day, "key": k, "model": model, "outcome": outcome, **dict.fromkeys(_SUMS[:4], 0)},
                )
                if what in row:
                    row[what] = n
            out += [groups[g] for g in sorted(groups)]
        return out

    def spent_since(self, since: float) -> dict[str, int]:
        start = dt.datetime.fromtimestamp(since, dt.UTC).date().isoformat()
        spent: dict[str, int] = {}
        for _, counters in self._by_day(start, None):
            for k, _, _, what, n in self._counters(counters):
                if what == "computed":
                    spent[k] = spent.get(k, 0) + n
        return spent

    def _counters(self, counters: dict[bytes, bytes]) -> Iterator[tuple[str, str, str, str, int]]:
        """A day's counters; a malformed one (an operator's edit, another version's field) is
        skipped and said once, never an error for the whole answer."""
        for raw, value in counters.items():
            try:
                k, model, outcome, what = raw.decode().split("\t")
                n = int(value)
            except (UnicodeDecodeError, ValueError):
                if not self._said_malformed:
                    log.warning("usage: a malformed counter in the store is skipped: %r", raw[:120])
                    self._said_malformed = True
                continue
            yield k, model, outcome, what, n

    def close(self) -> None:
        self.redis.close()


class UsageLog:
    """The usage of this gateway process: records in, batches out to its store, queries."""

    def __init__(self, path: Path, *, retention_days: float = 90.0, store: str | None = None) -> None:
        self.retention = retention_days * 86400
        self.store: SQLiteUsage | RedisUsage = SQLiteUsage(path) if store is None else RedisUsage(store, self.retention)
        self.path = self.store.where
        self._pending: list[UsageRecord] = []
        self._lock = threading.Lock()  # the pending list
        self._db_lock = threading.Lock()  # the store: the writer thread and readers take turns
        self._wake = threading.Event()
        self._closed = False
        self.written = 0
        self.dropped = 0  # records lost to a failed write (exact)
        self._failing: str | None = None  # the error of the current streak of failed writes
        self._said_at = 0.0
        self._pruned_at = 0.0
        self._thread = threading.Thread(target=self._run, name="abstract-client-usage", daemon=True)
        self._thread.start()

    @property
    def _db(self) -> sqlite3.Connection:  # the SQLite store's connection (tests read it)
        assert isinstance(self.store, SQLiteUsage)
        return self.store.db

    def add(self, record: UsageRecord) -> None:
        """On the request path: only an append."""
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self.dropped += 1
                return
            self._pending.append(record)

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(FLUSH_SECONDS)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        """Write what is pending, in one transaction (the writer thread; tests and close too)."""
        with self._db_lock:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        now = time.time()
        try:
            if batch:
                self.store.write(batch)
                self.written += len(batch)
            if now - self._pruned_at > 3600:  # retention, at start and hourly
                self.store.prune(now - self.retention)
                self._pruned_at = now
        except self.store.errors as exc:
            with self._lock:
                self.dropped += len(batch)
            why = str(exc) or type(exc).__name__
            if self._failing is None or now - self._said_at >= 60:  # a streak: said once a minute
                log.error(
                    "usage: %d record(s) not written to %s (%s); %d dropped since start",
                    len(batch),
                    self.path,
                    why,
                    self.dropped,
                )
                self._said_at = now
            self._failing = why
            return
        if self._failing is not None and batch:
            log.info("usage: writing to %s again (%d dropped since start)", self.path, self.dropped)
            self._failing = None

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(5)
        with self._db_lock:
            self._flush()
            self.store.close()

    def rows(self, **query: Any) -> list[dict[str, Any]]:
        """Usage grouped by day, key, model and outcome (what is pending is written first)."""
        with self._db_lock:
            self._flush()
            return self.store.rows(**query)

    def spent_since(self, since: float) -> dict[str, int]:
        """Tokens computed per key since ``since`` (a budget's period so far), from the store."""
        with self._db_lock:
            self._flush()
            return self.store.spent_since(since)


def usage_rows(
    db: sqlite3.Connection, *, start: str | None = None, end: str | None = None, key: str | None = None
) -> list[dict[str, Any]]:
    """Usage grouped by day, key, model and outcome (a stopped answer apart from a completed one),
    for days ``start`` … ``end`` (``YYYY-MM-DD``, inclusive), of one key or all."""
    where, args = [], []
    if start is not None:
        where.append("day >= ?")
        args.append(start)
    if end is not None:
        where.append("day <= ?")
        args.append(end)
    if key is not None:
        where.append("key = ?")
        args.append(key)
    sql = (
        "SELECT day, key, model, outcome, COUNT(*), SUM(prompt_tokens), SUM(cached_tokens), SUM(generated_tokens)"
        " FROM usage" + (" WHERE " + " AND ".join(where) if where else "") + " GROUP BY day, key, model, outcome"
        " ORDER BY day, key, model, outcome"
    )
    names = ("day", "key", "model", "outcome", "requests", "prompt_tokens", "cached_tokens", "generated_tokens")
    return [dict(zip(names, row, strict=True)) for row in db.execute(sql, args).fetchall()]


def open_for_reading(path: Path) -> sqlite3.Connection:
    """The usage database of a gateway, read-only (``abstract-client usage``)."""
    if not path.exists():
        raise FileNotFoundError(f"no usage database at {path}")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
