"""The usage log of one gateway process: what every request cost, by key (a
``usage_records.UsageRecord`` each), written to its store (``usage_stores``: SQLite, or the
Redis store several hosts share).

Off the request path: a request only appends its record to a list (``UsageLog.add``) and one
line to this process's journal (:class:`Journal`: what a ``kill -9`` would lose, written by the
next gateway to start); a writer thread takes the list every :data:`FLUSH_SECONDS` and writes
it in one transaction. Refusals by a limit are counted per key, limit and minute, never a
record each. A write that fails (a full disk, a database locked past its busy timeout, a store
that hangs) never fails a request: the records of that batch are dropped, counted exactly
(``dropped``: ``/metrics`` and ``GET /v1/usage`` say it) and an ERROR line says how many and
why (once a minute while it lasts); the next success says so once, with the count. A batch
counted dropped that the store applied after all (a paused Redis runs it when it wakes) is
found by its id and counted written instead, once. The writer survives any exception.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path
from typing import Any

from .usage_records import Refusals, UsageRecord
from .usage_stores import RedisUsage, SQLiteUsage

__all__ = ["FLUSH_SECONDS", "MAX_PENDING", "Journal", "UsageLog"]

log = logging.getLogger("abstract_client.gateway")

FLUSH_SECONDS = 0.5  # how long a record waits for its batch
MAX_PENDING = 200_000  # records held while the database cannot be written; more are dropped (counted)
READ_BACK_SECONDS = 120.0  # how long a failed batch is looked for in the store (applied late?)
_JOURNAL = "usage-journal-"


class Journal:
    """What this process's records pending are, appended as they come to a file beside the
    usage database (a line a record, no fsync: it survives the process's ``kill -9``, not the
    machine's crash). One file a batch: the writer starts a new one when it takes a batch and
    deletes the old one once the batch is written (or counted dropped). The live files are
    locked (``flock``); a starting gateway writes the records of files nobody holds — a process
    that died — as batches named after their files, which the store applies once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._prefix = f"{_JOURNAL}{os.getpid()}-{secrets.token_hex(4)}-"
        self._seq = 0
        self.name, self._fd = self._open()

    def _open(self) -> tuple[str, int]:
        self._seq += 1
        name = f"{self._prefix}{self._seq}"
        fd = os.open(self.directory / f"{name}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return name, fd

    def append(self, record: UsageRecord) -> None:
        os.write(self._fd, json.dumps(astuple(record), separators=(",", ":")).encode() + b"\n")

    def rotate(self) -> tuple[str, int]:
        """Start the next batch's file; the one just ended, to :meth:`drop` once it is written."""
        ended = (self.name, self._fd)
        self.name, self._fd = self._open()
        return ended

    def drop(self, ended: tuple[str, int]) -> None:
        name, fd = ended
        with contextlib.suppress(OSError):
            os.unlink(self.directory / f"{name}.jsonl")
        os.close(fd)

    def close(self) -> None:
        self.drop((self.name, self._fd))

    @staticmethod
    def orphans(directory: Path) -> Iterator[tuple[str, list[UsageRecord]]]:
        """The journals of processes that died (files nobody locks): (batch name, records),
        each file deleted once the caller has the records written (after the next ``yield``)."""
        for path in sorted(directory.glob(f"{_JOURNAL}*.jsonl")):
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a live process's
                os.close(fd)
                continue
            try:
                records = []
                for line in path.read_bytes().splitlines():
                    with contextlib.suppress(ValueError, TypeError):  # a line cut by the kill
                        records.append(UsageRecord(*json.loads(line)))
                yield path.stem, records
                path.unlink(missing_ok=True)
            finally:
                os.close(fd)


class UsageLog:
    """The usage of this gateway process: records in, batches out to its store, queries."""

    def __init__(
        self, path: Path, *, retention_days: float = 90.0, store: str | None = None, journal: bool = True
    ) -> None:
        self.retention = retention_days * 86400
        self.store: SQLiteUsage | RedisUsage = SQLiteUsage(path) if store is None else RedisUsage(store, self.retention)
        self.path = self.store.where
        self._pending: list[UsageRecord] = []
        self._refusals: Refusals = defaultdict(int)
        self._uncertain: list[tuple[str, int, float]] = []  # failed batches: (id, records, when)
        self._lock = threading.Lock()  # the pending list
        self._db_lock = threading.Lock()  # the store: the writer thread and readers take turns
        self._wake = threading.Event()
        self._closed = False
        self.written = 0
        self.dropped = 0  # records lost to a failed write (exact)
        self._failing: str | None = None  # the error of the current streak of failed writes
        self._said_at = 0.0
        self._pruned_at = 0.0
        # the records of a process that died before writing them (kill -9), written now
        self.journal: Journal | None = None
        if journal:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.journal = Journal(path.parent)
            except OSError as exc:  # records then wait in memory only, as before
                log.warning("usage: no journal in %s (%s): a kill -9 loses the last batch", path.parent, exc)
            else:
                self._replay(path.parent)
        self._thread = threading.Thread(target=self._run, name="abstract-client-usage", daemon=True)
        self._thread.start()

    def _replay(self, directory: Path) -> None:
        try:
            for name, records in Journal.orphans(directory):
                if records and name not in self.store.applied([name]):
                    self.store.write(records, {}, name)
                    log.info(
                        "usage: %d record(s) of a gateway process that died written from its journal", len(records)
                    )
        except Exception as exc:  # the store may be down at start-up: the files wait for the next start
            log.warning("usage: the journals of processes that died could not be written (%s)", exc)

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
            if self.journal is not None:
                try:
                    self.journal.append(record)
                except OSError:  # a full disk: the record is pending all the same
                    pass

    def add_refusal(self, at: float, key: str, model: str, route: str, limit: str) -> None:
        """A request refused by a limit: one more in its key's, limit's and minute's count."""
        with self._lock:
            self._refusals[(int(at // 60), key, model, route, limit)] += 1

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(FLUSH_SECONDS)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # never the end of the writer: the batch was counted as dropped
                log.exception("usage: the writer failed")

    def flush(self) -> None:
        """Write what is pending, in one transaction (the writer thread; tests and close too)."""
        with self._db_lock:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            refusals, self._refusals = self._refusals, defaultdict(int)
            ended = self.journal.rotate() if self.journal is not None and batch else None
        count = len(batch) + sum(refusals.values())
        batch_id = ended[0] if ended is not None else secrets.token_hex(8)
        try:
            self._write(batch, refusals, batch_id, count)
        finally:
            if ended is not None and self.journal is not None:
                self.journal.drop(ended)  # written, or counted dropped: its file is done with

    def _write(self, batch: list[UsageRecord], refusals: Refusals, batch_id: str, count: int) -> None:
        now = time.time()
        try:
            if count:
                self.store.write(batch, refusals, batch_id)
                self.written += count
            if now - self._pruned_at > 3600:  # retention, at start and hourly
                self.store.prune(now - self.retention)
                self._pruned_at = now
            if self._uncertain:
                self._read_back(now)
        except Exception as exc:  # the store's errors, and anything else: never the writer's end
            with self._lock:
                self.dropped += count
            if count:
                self._uncertain.append((batch_id, count, now))
            why = str(exc) or type(exc).__name__
            if not isinstance(exc, self.store.errors) and self._failing is None:  # a defect: its trace, once
                log.exception("usage: writing a batch failed")
            if self._failing is None or now - self._said_at >= 60:  # a streak: said once a minute
                log.error(
                    "usage: %d record(s) not written to %s (%s); %d dropped since start",
                    count,
                    self.path,
                    why,
                    self.dropped,
                )
                self._said_at = now
            self._failing = why
            return
        if self._failing is not None and count:
            log.info("usage: writing to %s again (%d dropped since start)", self.path, self.dropped)
            self._failing = None

    def _read_back(self, now: float) -> None:
        """Batches counted as dropped that the store applied after all (a timeout while it was
        paused, say): counted written instead, once. Asked until :data:`READ_BACK_SECONDS`."""
        applied = self.store.applied([b for b, _, _ in self._uncertain])
        kept = []
        for batch_id, count, at in self._uncertain:
            if batch_id in applied:
                with self._lock:
                    self.dropped -= count
                self.written += count
                log.info("usage: %d record(s) counted as dropped were written after all", count)
            elif now - at < READ_BACK_SECONDS:
                kept.append((batch_id, count, at))
        self._uncertain = kept

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(5)
        with self._db_lock:
            self._flush()
            self.store.close()
        if self.journal is not None:
            self.journal.close()

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
