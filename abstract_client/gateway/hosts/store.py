"""Several gateway hosts through one Redis (``serve --store redis://HOST:PORT/DB``).

What one host (one gateway process: a host, or a worker of ``--workers N``) shares with the
others, and how:

* **Its lease.** ``ac:host:<id>`` is set with a TTL of ``host_lease`` seconds and renewed five
  times per lease. A host whose lease is gone is dead: any host may end its running background
  responses (``owner_lost``), and the fencing token makes sure the dead host, if it was only
  slow, can no longer write to them.
* **Background responses** (``background.SharedBackgroundStore``): a hash per response (its
  owner's key, the host that runs it, the fencing token, status, the ``response`` object) and a
  stream of its events, numbered as the Responses API numbers them. Only the holder of the
  current token appends (a Lua script checks it and appends in one step, idempotently: a retried
  append never repeats an event). Every key expires (``background_retention``).
* **Cancels** over pub/sub, never polling: a background response's cancel goes to its owner's
  channel (and is written into its hash, which the owner reads at its next append: a lost
  message delays the stop by one token, never forever); ``POST /v1/requests/{id}/cancel`` and a
  model unload are asked of every host, whose answers come back on the asker's channel.
* **Stop records** (``GET /v1/requests/{id}``), kept ``background_retention`` seconds.

Redis down or slow: an operation a request waits on is bounded by ``store_timeout`` and fails
as :class:`StoreUnavailable` (the route answers 503); foreground generations never touch the
store on their way. redis-py reconnects by itself; the pub/sub listener resubscribes.

Faults, each with a defined outcome (docs/resumable.md "Faults"):

* **The lease never waits.** Renewing it, sweeping dead hosts' responses and listening are three
  loops; each one that fails is logged and started again (one exception used to end the loop
  that renewed the lease, silently, on every host at once).
* **A malformed record** (a field missing: another version's schema, an operator's edit) is
  logged once and skipped by the sweep; a reader finds no such response. Never a crash.
* **A connection the network drops silently** (a NAT or load balancer forgetting it): the
  listener pings its own connection when it has heard nothing for a fifth of a lease, and
  resubscribes on a new one when three of them pass unheard.
* **A large running set** is swept in batches (``SSCAN`` and pipelines), off the lease's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ...wires.responses_server import encode_event
from ..config import ConfigError, GatewayConfig

__all__ = ["TERMINAL", "Hosts", "StoreUnavailable", "error_event"]

log = logging.getLogger("abstract_client.gateway")

TERMINAL = frozenset({"completed", "failed", "cancelled", "incomplete"})
_ASK_TIMEOUT = 2.0  # a host that does not answer within this is taken not to hold the request
_SWEEP_BATCH = 500  # running entries read per round trip by the sweep
_DEAF_AFTER = 3  # periods (a fifth of a lease) unheard, pings included, before the listener resubscribes
# what every response's hash holds; one without them is malformed (logged once, skipped)
_FIELDS = ("owner", "host", "token", "status", "next", "snapshot")
_SWEPT = ("host", "status")  # what the sweep reads of each (the rest is read for a dead host's only)

# KEYS: meta, events, running set. ARGV: token, first index, ttl ms, status ("": unchanged),
# snapshot ("": unchanged), bytes, id, then the events' data. -1: fenced (another token holds
# the response, or it is gone); 1: a cancel was asked; 0: appended.
_APPEND = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return -1 end
local nxt = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
local first = tonumber(ARGV[2])
for i = 8, #ARGV do
  local index = first + i - 8
  if index >= nxt then
    redis.call('XADD', KEYS[2], '0-' .. (index + 1), 'd', ARGV[i])
    nxt = index + 1
  end
end
redis.call('HSET', KEYS[1], 'next', nxt, 'bytes', ARGV[6])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'snapshot', ARGV[5]) end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'status', ARGV[4])
  if ARGV[4] == 'completed' or ARGV[4] == 'failed' or ARGV[4] == 'cancelled' or ARGV[4] == 'incomplete' then
    redis.call('SREM', KEYS[3], ARGV[7])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if redis.call('HGET', KEYS[1], 'cancel') == '1' then return 1 end
return 0
"""

# KEYS: meta, events, running set, the owner's lease. ARGV: the token seen, a new token, the
# error event's data before and after its sequence number, the failed snapshot, ttl ms, id.
# 1: this call ended it; 0: it was not running under that token, or its owner is alive.
_OWNER_LOST = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'in_progress' then return 0 end
if redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
local nxt = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
redis.call('XADD', KEYS[2], '0-' .. (nxt + 1), 'd', ARGV[3] .. nxt .. ARGV[4])
redis.call('HSET', KEYS[1], 'token', ARGV[2], 'status', 'failed', 'snapshot', ARGV[5], 'next', nxt + 1)
redis.call('SREM', KEYS[3], ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return 1
"""

# the events that end a response's stream (the builder's last, or the error a host wrote for it)
_LAST_EVENTS = tuple(
    b"event: " + kind + b"\n"
    for kind in (b"response.completed", b"response.incomplete", b"response.failed", b"response.cancelled", b"error")
)
_OWNER_LOST_MESSAGE = "the gateway host that ran this response went away before it ended"


class StoreUnavailable(Exception):
    """The store did not answer within ``store_timeout`` (down, slow, or unreachable)."""


def _key(kind: str, name: str) -> str:
    return f"ac:{kind}:{name}"


class Hosts:
    """This host's line to the store and, through it, to the other hosts."""

    def __init__(self, config: GatewayConfig) -> None:
        try:
            import redis.asyncio as redis  # the `redis` extra: only a gateway with a store needs it
        except ImportError:
            raise ConfigError("--store needs redis-py: pip install 'abstract-client[redis]'") from None
        assert config.store is not None
        self.config = config
        self.id = f"h{secrets.token_hex(6)}"
        self.timeout = config.store_timeout
        self.lease_ms = int(config.host_lease * 1000)
        self.retention_ms = int(config.background_retention * 1000)
        self.redis = redis.from_url(config.store, decode_responses=False, socket_connect_timeout=self.timeout)
        self._append = self.redis.register_script(_APPEND)
        self._owner_lost = self.redis.register_script(_OWNER_LOST)
        self._acks: dict[str, asyncio.Queue[bool]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.on_op: Callable[[list[str]], bool] = lambda words: False  # a broadcast op, on this host
        self.on_cancel_response: Callable[[str], object] = lambda response_id: None
        self.subscribed = asyncio.Event()
        self._bad_records: set[str] = set()
        self.store_ok: bool | None = None  # None: not known yet (the lease loop's first renewal tells)
        self.where = _without_password(config.store)

    # -- life --------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the lease (best effort: the store may be down at start-up; the loop retries) and
        start the lease loop and the listener."""
        with contextlib.suppress(StoreUnavailable):
            await self._bounded(self.redis.set(_key("host", self.id), b"1", px=self.lease_ms))
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._supervised("lease", self._keep_lease), name="gateway host lease"),
            loop.create_task(self._supervised("sweep", self._keep_sweeping), name="gateway host sweep"),
            loop.create_task(self._supervised("listener", self._listen), name="gateway host listener"),
        ]

    async def aclose(self) -> None:
        """Bounded, whatever the store does: a shutdown never waits on it for long (a client
        library may turn a cancel into its own error, which the loops would take for a store
        that failed: they check ``_closing`` as well)."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.redis.delete(_key("host", self.id)), 1)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.redis.aclose(), 1)

    async def _bounded(self, op: Awaitable[Any], timeout: float | None = None) -> Any:
        """``op`` within ``store_timeout``; any failure of the store is :class:`StoreUnavailable`."""
        from redis.exceptions import RedisError

        try:
            async with asyncio.timeout(timeout or self.timeout):
                return await op
        except (RedisError, OSError, TimeoutError) as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # a cancel the client turned into its own error
                raise asyncio.CancelledError from None
            # what went wrong, once: whoever says it adds its own "the store did not answer"
            why = f"{type(exc).__name__}: {exc}" if str(exc) else f"no answer within {timeout or self.timeout:g}s"
            raise StoreUnavailable(why[:300]) from None

    async def _supervised(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run one of the host's loops for its life: a loop that fails is logged and started
        again (a loop that ended on an exception left this host without a lease, silently)."""
        while not self._closing:
            try:
                await loop()
            except Exception:
                if self._closing:
                    return
                log.exception("store: the %s loop failed; starting it again", name)
                await asyncio.sleep(1)

    async def _keep_lease(self) -> None:
        """Renew the lease five times per lease; nothing else runs on this loop."""
        period = self.lease_ms / 5000
        while not self._closing:
            try:
                await self._bounded(self.redis.set(_key("host", self.id), b"1", px=self.lease_ms), period)
            except StoreUnavailable as exc:
                self._reachable(False, str(exc))
            else:
                self._reachable(True)
            await asyncio.sleep(period)

    def _reachable(self, ok: bool, why: str = "") -> None:
        """Say when the store comes and goes (the lease loop's view): one line each way, not
        one per retry."""
        if ok and self.store_ok is not True:
            log.info("store: reachable at %s (host %s)", self.where, self.id)
        elif not ok and self.store_ok is not False:
            log.warning(
                "store: unreachable at %s (%s); background responses answer 503 until it is back", self.where, why
            )
        self.store_ok = ok

    async def _keep_sweeping(self) -> None:
        period = self.lease_ms / 5000
        while not self._closing:
            with contextlib.suppress(StoreUnavailable):
                await self.sweep()
            await asyncio.sleep(period)

    async def sweep(self) -> None:
        """End every running response whose host's lease is gone (any host may: a token
        decides). In batches: a round trip reads ``_SWEEP_BATCH`` entries, one more asks which
        of their hosts are alive."""
        cursor = 0
        while True:
            cursor, batch = await self._bounded(self.redis.sscan("ac:running", cursor, count=_SWEEP_BATCH))
            if batch:
                await self._sweep_batch([raw.decode() for raw in batch])
            if not cursor:
                return

    async def _sweep_batch(self, response_ids: list[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for response_id in response_ids:
            pipe.hmget(_key("resp", response_id), _SWEPT)
        rows = await self._bounded(pipe.execute())
        gone: list[str] = []
        by_host: dict[str, list[str]] = {}
        for response_id, row in zip(response_ids, rows, strict=True):
            fields = dict(zip(_SWEPT, row, strict=True))
            if all(value is None for value in fields.values()):
                gone.append(response_id)  # expired or forgotten: nothing to end
            elif any(value is None for value in fields.values()):
                self._malformed(response_id, fields)
            elif fields["status"].decode() not in TERMINAL:
                by_host.setdefault(fields["host"].decode(), []).append(response_id)
        if gone:
            await self._bounded(self.redis.srem("ac:running", *gone))
        hosts = list(by_host)
        if not hosts:
            return
        pipe = self.redis.pipeline(transaction=False)
        for host in hosts:
            pipe.exists(_key("host", host))
        for host, alive in zip(hosts, await self._bounded(pipe.execute()), strict=True):
            # a host never takes itself for dead: after an outage its lease may be renewed only
            # after this sweep, and its own writer ends what it runs (``store_lost``)
            if alive or host == self.id:
                continue
            for response_id in by_host[host]:
                meta = await self.meta(response_id)
                if meta is None:
                    continue
                try:
                    await self.end_owner_lost(response_id, meta)
                except (ValueError, TypeError):  # its snapshot is not a JSON object: skipped, said once
                    self._malformed(response_id, {"snapshot": None})

    def _malformed(self, response_id: str, fields: dict[str, Any]) -> None:
        """Say once that a record lacks fields (another version's, or edited by hand); it is
        skipped, never taken for a dead host's or a running one."""
        if response_id in self._bad_records:
            return
        if len(self._bad_records) < 10_000:  # bounded: a store full of them is said once each, up to this
            self._bad_records.add(response_id)
        missing = ", ".join(name for name, value in fields.items() if value is None)
        log.warning("store: the record of %s lacks %s; it is skipped", response_id, missing)

    # -- background responses ---------------------------------------------------------------------

    async def create(self, response_id: str, owner: str | None, snapshot: dict[str, Any]) -> str:
        """Record a new background response run by this host; its fencing token."""
        token = str(await self._bounded(self.redis.incr("ac:token")))
        meta = {
            "owner": owner or "",
            "host": self.id,
            "token": token,
            "status": snapshot["status"],
            "next": 0,
            "bytes": 0,
            "snapshot": json.dumps(snapshot),
        }
        pipe = self.redis.pipeline(transaction=True)
        # this host's lease with it: after a store restart (every lease gone) no sweep may take
        # a response for its dead host's before the lease loop renews it
        pipe.set(_key("host", self.id), b"1", px=self.lease_ms)
        pipe.hset(_key("resp", response_id), mapping=meta)  # type: ignore[arg-type]
        pipe.pexpire(_key("resp", response_id), self.retention_ms)
        pipe.sadd("ac:running", response_id)
        await self._bounded(pipe.execute())
        return token

    async def append(
        self,
        response_id: str,
        token: str,
        first: int,
        events: list[bytes],
        *,
        size: int,
        status: str = "",
        snapshot: dict[str, Any] | None = None,
    ) -> int:
        """Append ``events`` (numbered from ``first``) as the holder of ``token``: 0, or 1 when a
        cancel was asked, or -1 when fenced."""
        keys = [_key("resp", response_id), _key("events", response_id), "ac:running"]
        args: list[Any] = [token, first, self.retention_ms, status, json.dumps(snapshot) if snapshot else "", size]
        return int(await self._bounded(self._append(keys=keys, args=[*args, response_id, *events])))

    async def forget(self, response_ids: list[str]) -> None:
        keys = [_key(kind, rid) for rid in response_ids for kind in ("resp", "events")]
        await self._bounded(self.redis.delete(*keys))

    async def meta(self, response_id: str) -> dict[str, Any] | None:
        """The response's record; None when the store has none, or a malformed one (logged)."""
        raw = await self._bounded(self.redis.hgetall(_key("resp", response_id)))
        if not raw:
            return None
        meta = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in raw.items()}
        if any(name not in meta for name in _FIELDS) or not meta["next"].isdigit():
            self._malformed(response_id, {name: meta.get(name) for name in _FIELDS})
            return None
        return meta

    async def ask_cancel(self, response_id: str, host: str) -> None:
        """A cancel for a background response: written into its hash (read at the owner's next
        append), then sent to its owner at once."""
        await self._bounded(self.redis.hset(_key("resp", response_id), "cancel", "1"))
        await self._bounded(self.redis.publish(_key("to", host), f"cancel-response {response_id}"))

    async def end_owner_lost(self, response_id: str, meta: dict[str, Any]) -> bool:
        """End a running response whose owner is dead: an ``error`` event (code ``owner_lost``),
        status ``failed``. True if this call ended it (the token decides between hosts)."""
        snapshot = json.loads(meta["snapshot"])
        snapshot["status"] = "failed"
        snapshot["error"] = {"code": "owner_lost", "message": _OWNER_LOST_MESSAGE}
        event = {"type": "error", "code": "owner_lost", "message": _OWNER_LOST_MESSAGE, "param": None}
        data = "event: error\ndata: " + json.dumps({**event, "sequence_number": 0})[:-2]  # "...: 0}" → "...: "
        keys = [_key("resp", response_id), _key("events", response_id), "ac:running", _key("host", meta["host"])]
        new_token = str(await self._bounded(self.redis.incr("ac:token")))
        args = [meta["token"], new_token, data, "}\n\n", json.dumps(snapshot), self.retention_ms, response_id]
        ended = bool(await self._bounded(self._owner_lost(keys=keys, args=args)))
        if ended:
            log.warning("background response %s: its host %s is gone (owner_lost)", response_id, meta["host"])
        return ended

    async def events(self, response_id: str, after: int | None) -> AsyncIterator[bytes]:
        """The response's events after sequence number ``after`` (all for None), as they come,
        until it ended. A dead owner's response is ended by the hosts' sweep (within its lease
        and a fifth of one), and its readers read that end; a response gone from the store (a
        restart without persistence) ends with an ``error`` event, never an open stream."""
        last = b"0-0" if after is None else b"0-%d" % (after + 1)
        key = _key("events", response_id)
        ended = False  # its status says it ended: what is left to read is read without waiting
        while True:
            block = None if ended else 1000
            got = await self._bounded(self.redis.xread({key: last}, count=512, block=block), self.timeout + 1)
            for _, entries in got or []:
                for entry_id, fields in entries:
                    last = entry_id
                    yield fields[b"d"]
                    if fields[b"d"].startswith(_LAST_EVENTS):  # nothing comes after it
                        return
            if got:
                continue
            if ended:
                return
            meta = await self.meta(response_id)
            if meta is None:
                yield error_event("store_lost", "the store no longer holds this response (it restarted?)")
                return
            # the final status is written with the last events: once it is there, they all are
            ended = meta["status"] in TERMINAL

    # -- requests of other hosts: cancels by id, model unloads, stop records ----------------------

    async def ask(self, *words: str) -> bool:
        """Ask every other host to act on ``words`` (``cancel <id> <owner> <admin>``,
        ``stop-backend <name>``); True if any of them did. Bounded by the store's timeout and
        the hosts' answers (2 s)."""
        nonce = secrets.token_hex(8)
        answers: asyncio.Queue[bool] = asyncio.Queue()
        self._acks[nonce] = answers
        try:
            message = json.dumps({"from": self.id, "nonce": nonce, "words": list(words)})
            receivers = int(await self._bounded(self.redis.publish("ac:ops", message)))
            # this host hears its own message (when its listener is up) and does not answer it
            expected = receivers - (1 if self.subscribed.is_set() else 0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_ASK_TIMEOUT):
                    for _ in range(expected):
                        if await answers.get():
                            return True
            return False
        finally:
            del self._acks[nonce]

    async def put_stop_record(self, call_id: str, record: dict[str, Any]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(_key("stop", call_id), json.dumps(record), px=self.retention_ms)
        pipe.set(_key("stopid", record["request_id"]), call_id, px=self.retention_ms)
        await self._bounded(pipe.execute())

    async def stop_record(self, call_id: str | None, request_id: str) -> dict[str, Any] | None:
        """The record of ``call_id`` (the owner's), or with ``call_id`` None (the admin's) the
        latest of ``request_id``."""
        if call_id is None:
            found = await self._bounded(self.redis.get(_key("stopid", request_id)))
            if found is None:
                return None
            call_id = found.decode()
        raw = await self._bounded(self.redis.get(_key("stop", call_id)))
        return None if raw is None else dict(json.loads(raw))

    async def _listen(self) -> None:
        """This host's channels: broadcast ops, its own direct messages, and answers to its asks.
        Resubscribes after the store comes back (a message sent meanwhile is lost: a cancel is
        also in the response's hash; an ask is answered by nobody, and says so), and when its
        connection has gone deaf: a network that drops a connection silently (a NAT's idle
        timeout) leaves a subscriber that hears nothing for ever, so it pings itself when idle
        and takes ``_DEAF_AFTER`` unanswered periods for a dead connection."""
        from redis.exceptions import RedisError

        period = self.lease_ms / 5000
        while not self._closing:
            pubsub = self.redis.pubsub()
            try:
                await self._bounded(pubsub.subscribe("ac:ops", _key("to", self.id), _key("ack", self.id)))
                self.subscribed.set()
                heard = time.monotonic()
                while True:
                    message = await pubsub.get_message(timeout=period)
                    if message is not None:
                        heard = time.monotonic()
                        if message.get("type") == "message":
                            await self._on_message(message["channel"].decode(), message["data"].decode())
                    elif time.monotonic() - heard > _DEAF_AFTER * period:
                        raise StoreUnavailable(f"nothing heard for {_DEAF_AFTER * period:g}s, pings included")
                    else:
                        await self._bounded(pubsub.ping(), period)
            except (RedisError, OSError, StoreUnavailable) as exc:
                # said once when a working subscription is lost; a store that stays down is the
                # lease loop's to say
                lost = self.subscribed.is_set()
                self.subscribed.clear()
                (log.warning if lost else log.debug)("store: the listener lost its connection (%s); resubscribing", exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), 1)

    async def _on_message(self, channel: str, data: str) -> None:
        if channel == _key("ack", self.id):
            nonce, _, answer = data.partition(" ")
            queue = self._acks.get(nonce)
            if queue is not None:
                queue.put_nowait(answer == "1")
        elif channel == _key("to", self.id):
            op, _, response_id = data.partition(" ")
            if op == "cancel-response":
                self.on_cancel_response(response_id)
        else:
            try:
                message = json.loads(data)
                sender, nonce, words = message["from"], message["nonce"], message["words"]
            except (ValueError, KeyError, TypeError):
                return
            if sender == self.id:
                return
            acted = self.on_op([str(w) for w in words])
            with contextlib.suppress(StoreUnavailable):
                await self._bounded(self.redis.publish(_key("ack", sender), f"{nonce} {1 if acted else 0}"))


def _without_password(url: str) -> str:
    """A store URL fit for a log line."""
    scheme, sep, rest = url.partition("://")
    _, at, hostpart = rest.rpartition("@")
    return f"{scheme}{sep}{hostpart}" if at else url


def error_event(code: str, message: str) -> bytes:
    return encode_event({"type": "error", "code": code, "message": message, "param": None})
