"""Where usage records are kept: a SQLite file (:class:`SQLiteUsage`, one host; its workers
share it) or the Redis store several hosts share (:class:`RedisUsage`: a counter a key, model,
outcome and sum, a hash a day). Each writes a batch whole or not at all, under its id, and says
afterwards whether a batch it was given is there (:meth:`applied`)."""

from __future__ import annotations

import datetime as dt
import logging
import re
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import astuple, fields
from pathlib import Path
from typing import Any

from .usage_records import Refusals, UsageRecord, UsageUnwritable, day_of_minute

__all__ = ["BATCH", "RedisUsage", "SQLiteUsage", "open_for_reading", "usage_rows"]

log = logging.getLogger("abstract_client.gateway")

_INTEGER = re.compile(rb"-?[0-9]{1,18}\Z")  # a counter of ours: what HINCRBY can add to without overflow
BATCH = "ac:usage:batch:"  # a batch's marker in the shared store

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
CREATE TABLE IF NOT EXISTS refusals (
    minute INTEGER NOT NULL, day TEXT NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL,
    route TEXT NOT NULL, reason TEXT NOT NULL, requests INTEGER NOT NULL,
    PRIMARY KEY (minute, key, model, route, reason)
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, at REAL NOT NULL);
"""
_REFUSED = (
    "INSERT INTO refusals (minute, day, key, model, route, reason, requests) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (minute, key, model, route, reason) DO UPDATE SET requests = requests + excluded.requests"
)
_INSERT = f"INSERT INTO usage ({', '.join(_COLUMNS)}, day) VALUES ({', '.join('?' * (len(_COLUMNS) + 1))})"


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=2.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")  # readers (GET /v1/usage, the CLI) never wait on the writer
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    return db


class SQLiteUsage:
    """One record per row in a file: the default, one host (its workers share the file).
    Refusals by a limit are counted per key, limit and minute (``refusals``), not a row each."""

    errors: tuple[type[Exception], ...] = (sqlite3.Error, OSError)
    unavailable = ("the usage database", "usage_unavailable")  # how /v1/usage says it failed

    def __init__(self, path: Path) -> None:
        self.where = str(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = _connect(path)
            # can it be written, not only read? A write that reaches the file: an immutable or
            # read-only file opens (read-only) and takes BEGIN IMMEDIATE, and fails only here
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('opened_at', ?)", (str(time.time()),))
            self.db.execute("COMMIT")
        except (OSError, sqlite3.Error) as exc:
            raise UsageUnwritable(f"the usage database {path} cannot be written: {exc}") from None

    def write(self, batch: list[UsageRecord], refusals: Refusals, batch_id: str) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany(_INSERT, [(*astuple(r), r.day) for r in batch])
            self.db.executemany(
                _REFUSED,
                [(m, day_of_minute(m), k, model, route, why, n) for (m, k, model, route, why), n in refusals.items()],
            )
            self.db.execute("INSERT INTO batches (id, at) VALUES (?, ?)", (batch_id, time.time()))
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def prune(self, before: float) -> None:
        self.db.execute("DELETE FROM usage WHERE started_at < ?", (before,))
        self.db.execute("DELETE FROM refusals WHERE minute < ?", (int(before // 60),))
        self.db.execute("DELETE FROM batches WHERE at < ?", (time.time() - 7 * 86400,))

    def applied(self, batch_ids: list[str]) -> set[str]:
        """Which of these batches the database holds (each batch's id is written with it)."""
        marks = ",".join("?" * len(batch_ids))
        return {row[0] for row in self.db.execute(f"SELECT id FROM batches WHERE id IN ({marks})", batch_ids)}

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


# ARGV[1]: the batch's marker key (kept an hour: a batch that timed out and was applied later is
# found there, and counted once); then (hash, field, n, expire-at) per counter. A field that is
# not an integer of ours (an operator's edit, "1.5", "0x10", " 7", "inf", past 10^18) is replaced,
# and so is a day's key of another type: HINCRBY on it would fail the batch, and every one after it.
_ADD = """
for i = 2, #ARGV, 4 do
  local t = redis.call('TYPE', ARGV[i]).ok
  if t ~= 'hash' and t ~= 'none' then redis.call('DEL', ARGV[i]) end
  local old = redis.call('HGET', ARGV[i], ARGV[i + 1])
  local ours = old and string.match(old, '^%-?%d+$') and string.len(string.gsub(old, '-', '')) <= 18
  if old and not ours then
    redis.call('HSET', ARGV[i], ARGV[i + 1], ARGV[i + 2])
  else
    redis.call('HINCRBY', ARGV[i], ARGV[i + 1], ARGV[i + 2])
  end
  redis.call('EXPIREAT', ARGV[i], ARGV[i + 3])
end
redis.call('SET', ARGV[1], '1', 'EX', 3600)
return 1
"""
_SUMS = ("requests", "prompt_tokens", "cached_tokens", "generated_tokens", "computed")


class RedisUsage:
    """Several hosts (``--store redis://…``): every host adds its records to one hash per day
    (``ac:usage:<day>``: a counter per key, model, outcome and sum, added by one script per
    batch), so any host answers ``GET /v1/usage`` for all. A day's hash expires ``retention``
    after the day. A counter that is not ours (an operator's edit, another version's) is
    skipped when read and replaced when written: never an error for the rest."""

    unavailable = ("the store shared by the gateway hosts", "store_unavailable")

    def __init__(self, url: str, retention: float) -> None:
        try:
            import redis
            from redis.exceptions import RedisError
        except ImportError:
            raise UsageUnwritable("--store needs redis-py: pip install 'abstract-client[redis]'") from None
        from ..hosts.store import _without_password

        self.errors: tuple[type[Exception], ...] = (RedisError, OSError)
        self.where = _without_password(url)
        self.retention = retention
        # a store that hangs, or a connection the network drops silently, is a timeout: that batch
        # is dropped (counted), and the next one opens a new connection
        self.redis = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._said_malformed = False
        self._add = self.redis.register_script(_ADD)
        self._wrong_type: type[Exception] = redis.exceptions.ResponseError

    def write(self, batch: list[UsageRecord], refusals: Refusals, batch_id: str) -> None:
        sums: dict[tuple[str, str], int] = defaultdict(int)  # (day, counter) -> what the batch adds
        for r in batch:
            head = f"{r.key}\t{r.model}\t{r.outcome}\t"
            counts = (1, r.prompt_tokens, r.cached_tokens, r.generated_tokens, r.computed_tokens)
            for field, n in zip(_SUMS, counts, strict=True):
                if n:
                    sums[(r.day, head + field)] += n
        for (minute, key, model, _, _), n in refusals.items():
            sums[(day_of_minute(minute), f"{key}\t{model}\trefused\trequests")] += n
        args: list[Any] = [BATCH + batch_id]
        for (day, field), n in sums.items():
            end = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp() + 86400
            args += [f"ac:usage:{day}", field, n, int(end + self.retention)]
        self._add(args=args)  # one script: the batch counts whole or not at all

    def applied(self, batch_ids: list[str]) -> set[str]:
        """Which of these batches (each one that failed: a timeout may have come after the
        store applied it, or before a paused store ran it) the store holds after all."""
        pipe = self.redis.pipeline(transaction=False)
        for batch_id in batch_ids:
            pipe.exists(BATCH + batch_id)
        return {b for b, n in zip(batch_ids, pipe.execute(), strict=True) if n}

    def prune(self, before: float) -> None:  # each day's hash expires by itself
        return

    def _days(self, start: str | None, end: str | None) -> list[str]:
        """The days of ``start`` … ``end`` the store can hold: within the retention (a range of
        any width costs what the retention costs, never more)."""
        today = dt.datetime.now(dt.UTC).date()
        oldest = today - dt.timedelta(days=int(self.retention // 86400) + 1)
        first = max(dt.date.fromisoformat(start), oldest) if start else oldest
        last = min(dt.date.fromisoformat(end), today) if end else today
        return [(first + dt.timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]

    def _by_day(self, start: str | None, end: str | None) -> list[tuple[str, dict[bytes, bytes]]]:
        """Each day's counters, ``start`` … ``end`` (one round trip). A day's key of another
        type (not ours) is skipped, said once."""
        days = self._days(start, end)
        pipe = self.redis.pipeline(transaction=False)
        for day in days:
            pipe.hgetall(f"ac:usage:{day}")
        out = []
        for day, counters in zip(days, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(counters, Exception):
                if not isinstance(counters, self._wrong_type):
                    raise counters
                self._say_malformed(f"ac:usage:{day}".encode())
                continue
            out.append((day, counters))
        return out

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
                if not _INTEGER.match(value):  # int() takes " 7", "1_0" and "٣": not ours
                    raise ValueError
                k, model, outcome, what = raw.decode().split("\t")
                n = int(value)
            except (UnicodeDecodeError, ValueError):
                self._say_malformed(raw)
                continue
            yield k, model, outcome, what, n

    def _say_malformed(self, raw: bytes) -> None:
        if not self._said_malformed:
            log.warning("usage: a malformed counter in the store is skipped: %r", raw[:120])
            self._said_malformed = True

    def close(self) -> None:
        self.redis.close()


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
    cond = " WHERE " + " AND ".join(where) if where else ""
    rows = (
        "SELECT day, key, model, outcome, COUNT(*) AS n, SUM(prompt_tokens) AS p, SUM(cached_tokens) AS c,"
        f" SUM(generated_tokens) AS g FROM usage{cond} GROUP BY day, key, model, outcome"
    )
    has_refusals = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'refusals'").fetchone()
    if has_refusals:  # a database an older version wrote has none
        rows += f" UNION ALL SELECT day, key, model, 'refused', SUM(requests), 0, 0, 0 FROM refusals{cond}"
        rows += " GROUP BY day, key, model"
        args = args + args
    sql = (
        f"SELECT day, key, model, outcome, SUM(n), SUM(p), SUM(c), SUM(g) FROM ({rows})"
        " GROUP BY day, key, model, outcome ORDER BY day, key, model, outcome"
    )
    names = ("day", "key", "model", "outcome", "requests", "prompt_tokens", "cached_tokens", "generated_tokens")
    return [dict(zip(names, row, strict=True)) for row in db.execute(sql, args).fetchall()]


def open_for_reading(path: Path) -> sqlite3.Connection:
    """The usage database of a gateway, read-only (``abstract-client usage``)."""
    if not path.exists():
        raise FileNotFoundError(f"no usage database at {path}")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
