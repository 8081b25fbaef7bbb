"""Limits per key (``keys.Limits``), decided when a request arrives, before anything is sent
upstream or a slot is waited for: a request over a limit is a :class:`Refusal` (a 429 with
``Retry-After`` in the route's own error shape); one within them holds an :class:`Admission`
until it ends, when its tokens settle to what the engine counted.

**The key's, wherever it is served.** A key's counts live in one place every process serving
it sees, and each decision is one atomic step there (:class:`LimitStore`):

* one gateway process: its memory (``limit_stores.MemoryLimits``);
* ``--workers N`` on one host: a SQLite file in the workers' private run directory, one
  ``BEGIN IMMEDIATE`` transaction a decision (``SQLiteLimits``);
* hosts (and their workers) sharing ``--store redis://``: one Lua script a decision
  (``RedisLimits``).

The decision itself is written once in Python (``limit_steps.py``: an admission, a release, a
renewal, sans-io over a JSON state) and once in Lua for Redis, its twin. An admission's ticket expires
``lease`` seconds after it was taken or last renewed; the process holding it renews it while the
request runs (:meth:`Limiter.renew_held`), so a process that dies gives its reservations back
within a lease.

**A reservation counts what the request can cost**: its prompt (:func:`prompt_bound`, an upper
bound from the request's text, no tokenizer call) plus its ``max_tokens`` (:data:`DEFAULT_RESERVE`
when none); it settles to the engine's count when the request ends, and a stopped answer frees
what it did not use. A request whose reservation does not fit in what is left waits for the
key's requests in flight to end (a 429, ``Retry-After: 1``); with none in flight it is admitted
with what is left. So a budget (or a minute's tokens) is crossed by one request at most, by at
most that request's cost beyond what was left.

**A store that does not answer** (``limits_store_down``): ``"local"`` (the default) decides
against this process's own counts meanwhile (N processes then admit up to N times a key's
limits); ``"refuse"`` answers 503 ``limits_unavailable``. Either way, one failure keeps the store
out of the request path for :data:`RETRY_STORE_S`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..spawn import spawn_on
from .keys import Limits
from .limit_stores import LimitStore, MemoryLimits

__all__ = [
    "DEFAULT_RESERVE",
    "MAX_TOKENS",
    "UNLIMITED",
    "Admission",
    "Limiter",
    "Refusal",
    "period_bounds",
    "prompt_bound",
]

log = logging.getLogger("abstract_client.gateway")

DEFAULT_RESERVE = 1024  # tokens reserved for a request that names no max_tokens
RETRY_STORE_S = 1.0  # after a store failure, decisions stay local (or refused) this long
MAX_TOKENS = 10**12  # any count is clamped to this (Lua's numbers are doubles)
# the prompt's bound: a text's UTF-8 bytes (a byte-level tokenizer spends at least a byte a
# token), plus what a chat template adds around each message or part, and an image's allowance
PER_ITEM = 8
IMAGE_TOKENS = 16_384
_PROMPT_FIELDS = ("messages", "prompt", "system", "tools", "input", "inputs", "instructions", "response_format")


def period_bounds(period: str, now: float) -> tuple[float, float]:
    """The calendar period (UTC) holding ``now``: its start and its end, as unix times."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = day, day + dt.timedelta(days=1)
    elif period == "week":
        start = day - dt.timedelta(days=day.weekday())
        end = start + dt.timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = (start + dt.timedelta(days=32)).replace(day=1)
    return start.timestamp(), end.timestamp()


def prompt_bound(kwargs: Mapping[str, Any]) -> int:
    """An upper bound on the tokens of a request's prompt, without a tokenizer: the UTF-8 bytes
    of its text (messages, prompt, system, tools, schema), :data:`PER_ITEM` for each message,
    part or field a template wraps, and :data:`IMAGE_TOKENS` for an image (a data URL or bytes;
    at most its length)."""
    total = 0
    stack: list[Any] = [kwargs.get(name) for name in _PROMPT_FIELDS]
    while stack:
        value = stack.pop()
        if value is None or isinstance(value, bool | int | float):
            continue
        if isinstance(value, str):
            n = len(value.encode("utf-8", "surrogatepass"))
            total += min(n, IMAGE_TOKENS) if value.startswith("data:") else n
        elif isinstance(value, bytes | bytearray | memoryview):
            total += min(len(value), IMAGE_TOKENS)
        elif isinstance(value, Mapping):
            total += PER_ITEM
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            total += PER_ITEM
            stack.extend(value)
        else:  # an image object, or anything else the library takes
            total += IMAGE_TOKENS
    return min(total, MAX_TOKENS)


# -- what a request holds ------------------------------------------------------------------------


@dataclass(slots=True)
class Refusal:
    limit: str  # concurrent | requests_per_minute | tokens_per_minute | token_budget | limits_unavailable
    retry_after: int  # seconds
    message: str
    status: int = 429


class Admission:
    """A request within its key's limits: :meth:`settle` once, when it ends."""

    __slots__ = ("_limiter", "_settled", "key", "reserved", "store", "ticket")

    def __init__(self, limiter: Limiter | None, store: LimitStore | None, key: str, ticket: str, reserved: int) -> None:
        self._limiter, self.store, self.key, self.ticket, self.reserved = limiter, store, key, ticket, reserved
        self._settled = False

    def settle(self, tokens: int) -> None:
        """The request ended having cost ``tokens`` (the engine's count; 0 if it never ran)."""
        if self._settled or self._limiter is None:
            return
        self._settled = True
        self._limiter.release(self, max(0, min(int(tokens), MAX_TOKENS)))


UNLIMITED = Admission(None, None, "", "", 0)


class Limiter:
    """Every key's limits (``limits_for(name)``) against its counts in ``store``. ``spent``: what
    each key spent in its budget's period before this process started (from the usage store),
    the seed of a key's state that the store does not hold yet."""

    def __init__(
        self,
        limits_for: Mapping[str, Limits | None],
        spent: Mapping[str, int] | None = None,
        *,
        store: LimitStore | None = None,
        lease: float = 10.0,
        when_down: str = "local",
    ) -> None:
        self._limits_for = limits_for
        self._spent_before = dict(spent or {})
        self.store: LimitStore = store or MemoryLimits()
        self.local: MemoryLimits = self.store if isinstance(self.store, MemoryLimits) else MemoryLimits()
        self.lease_ms = int(lease * 1000)
        self.when_down = when_down
        self.held: dict[tuple[int, str], set[str]] = {}  # (id of its store, key) -> tickets running here
        self._down_until = 0.0
        self._failing = False
        self.store_failures = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def limited(self, key: str) -> bool:
        limits = self._limits_for.get(key)
        return limits is not None and limits.limited

    async def admit(
        self, key: str, max_tokens: int | None, prompt_tokens: int = 0, *, count_only: bool = False
    ) -> Admission | Refusal:
        limits = self._limits_for.get(key)
        if limits is None or not limits.limited:
            return UNLIMITED
        self._loop = asyncio.get_running_loop()
        now = time.time()
        want = (DEFAULT_RESERVE if max_tokens is None else max(1, max_tokens)) + max(0, prompt_tokens)
        _, end = period_bounds(limits.budget_period, now)
        ticket = secrets.token_hex(8)
        args = (
            int(now * 1000),
            ticket,
            min(want, MAX_TOKENS),
            self.lease_ms,
            self._spent_before.get(key, 0),
            int(end * 1000),
            count_only,
            *(-1 if v is None else v for v in (limits.concurrent, limits.requests_per_minute)),
            *(-1 if v is None else v for v in (limits.tokens_per_minute, limits.token_budget)),
        )
        store = self.store
        if store is not self.local and time.monotonic() < self._down_until:  # it failed a moment ago
            if self.when_down != "local":
                return _unavailable(key, f"the {store.name} store did not answer a moment ago")
            store = self.local
        try:
            verdict = store.step_now(key, "admit", *args)
            if verdict is None:
                verdict = await store.step(key, "admit", *args)
        except store.errors as exc:
            why = str(exc) or type(exc).__name__
            self.store_failures += 1
            self._down_until = time.monotonic() + RETRY_STORE_S
            if not self._failing:
                then = "counting in each process meanwhile" if self.when_down == "local" else "refusing limited keys"
                log.warning("limits: the %s store did not answer (%s); %s", store.name, why, then)
                self._failing = True
            if self.when_down != "local":
                return _unavailable(key, why)
            store = self.local
            verdict = self.local.step_now(key, "admit", *args)
        else:
            if self._failing and store is self.store:
                log.info("limits: the %s store answers again", store.name)
                self._failing = False
        ok, limit, retry, reserved, counted = verdict
        if not ok:
            return Refusal(str(limit), int(retry), _why(key, str(limit), int(counted), limits))
        self.held.setdefault((id(store), key), set()).add(ticket)
        return Admission(self, store, key, ticket, int(reserved))

    def release(self, admission: Admission, tokens: int) -> None:
        store = admission.store
        assert store is not None
        tickets = self.held.get((id(store), admission.key))
        if tickets is not None:
            tickets.discard(admission.ticket)
        args = (int(time.time() * 1000), admission.ticket, tokens)
        try:
            if store.step_now(admission.key, "release", *args) is not None:
                return
        except store.errors as exc:  # its reservation expires with its lease
            log.debug("limits: a release was not written (%s)", exc)
            return
        self._spawn(store.step(admission.key, "release", *args))

    def _spawn(self, op: Any) -> None:
        def failed(exc: Exception) -> None:  # its reservation expires with its lease
            log.debug("limits: a release was not written (%s)", exc)

        spawn_on(self._loop, op, self._tasks, failed)

    async def renew_held(self) -> None:
        """Renew the reservations of the requests running here (their process is alive)."""
        stores = {id(s): s for s in (self.store, self.local)}
        now = int(time.time() * 1000)
        for (store_id, key), tickets in list(self.held.items()):
            if not tickets:
                del self.held[(store_id, key)]
                continue
            store = stores[store_id]
            try:
                await store.step(key, "renew", now, self.lease_ms, sorted(tickets))
            except store.errors as exc:
                log.debug("limits: reservations not renewed (%s)", exc)

    async def run_renewals(self) -> None:
        """Renew the held reservations three times a lease, until cancelled."""
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                await self.renew_held()
            except Exception:
                log.exception("limits: renewing reservations failed")

    async def aclose(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.aclose()


def _unavailable(key: str, why: str) -> Refusal:
    return Refusal("limits_unavailable", 1, f"key {key!r}: its limits cannot be checked ({why})", 503)


def _why(key: str, limit: str, counted: int, limits: Limits) -> str:
    if limit == "concurrent":
        return f"key {key!r} has {counted} requests in flight (its limit)"
    if limit == "requests_per_minute":
        return f"key {key!r} sent {counted} requests in the last minute (its limit: {limits.requests_per_minute})"
    if limit == "tokens_per_minute":
        return f"key {key!r} used {counted} tokens in the last minute (its limit: {limits.tokens_per_minute})"
    return (
        f"key {key!r} spent its token budget ({limits.token_budget} per {limits.budget_period}); "
        "it renews when the period ends"
    )
