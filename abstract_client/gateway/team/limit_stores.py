"""Where a key's limit state lives (``limit_steps.py`` the steps run on it, ``limits.py`` what
decides with them): one process's memory, a SQLite file a host's workers share, or the Redis
store several hosts share. Each runs one step atomically."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Protocol

from .limit_steps import LUA, STEPS, fresh_state, sane

__all__ = ["LimitStore", "MemoryLimits", "RedisLimits", "SQLiteLimits"]


class LimitStore(Protocol):
    """Where a key's state lives: ``step`` runs one of the steps on it, atomically."""

    name: str
    errors: tuple[type[Exception], ...]

    async def step(self, key: str, op: str, *args: Any) -> list[Any]: ...

    def step_now(self, key: str, op: str, *args: Any) -> list[Any] | None:
        """The step at once, on this thread, where the store can (None: it must be awaited)."""
        ...

    async def aclose(self) -> None: ...


class MemoryLimits:
    """One process: the states in a dict, each step under a lock (a settle may come from any
    thread)."""

    name = "memory"
    errors: tuple[type[Exception], ...] = ()

    def __init__(self) -> None:
        self.states: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def step_now(self, key: str, op: str, *args: Any) -> list[Any]:
        with self._lock:
            state = self.states.get(key)
            if state is None:
                state = self.states[key] = fresh_state()
            return STEPS[op](state, *args)

    async def step(self, key: str, op: str, *args: Any) -> list[Any]:
        return self.step_now(key, op, *args)

    async def aclose(self) -> None:
        return


class SQLiteLimits:
    """The workers of one host: the states in a SQLite file they all open (in their private
    run directory), each step one ``BEGIN IMMEDIATE`` transaction."""

    name = "sqlite"
    errors: tuple[type[Exception], ...] = (sqlite3.Error, OSError)

    def __init__(self, path: Path, busy_timeout: float = 1.0) -> None:
        self.path = path
        self.db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")  # the counts of a running gateway, not records
        self.db.execute("CREATE TABLE IF NOT EXISTS limits (key TEXT PRIMARY KEY, state TEXT NOT NULL)")
        self._lock = threading.Lock()  # one connection, its transactions one at a time

    def step_now(self, key: str, op: str, *args: Any) -> list[Any]:
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                row = self.db.execute("SELECT state FROM limits WHERE key = ?", (key,)).fetchone()
                try:
                    state = sane(json.loads(row[0])) if row else fresh_state()
                except ValueError:
                    state = fresh_state()
                result = STEPS[op](state, *args)
                data = json.dumps(state, separators=(",", ":"))
                self.db.execute("INSERT OR REPLACE INTO limits (key, state) VALUES (?, ?)", (key, data))
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
            return result

    async def step(self, key: str, op: str, *args: Any) -> list[Any]:
        return self.step_now(key, op, *args)

    async def aclose(self) -> None:
        self.db.close()


class RedisLimits:
    """Hosts sharing ``--store``: each key's state at ``ac:limits:<name>``, each step one Lua
    script (``limit_steps.LUA``), bounded by ``timeout``."""

    name = "redis"

    def __init__(self, url: str, timeout: float) -> None:
        from redis.exceptions import RedisError

        self.url, self.timeout = url, timeout
        self.errors: tuple[type[Exception], ...] = (RedisError, OSError, TimeoutError)
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}

    def _script(self) -> Any:
        loop = asyncio.get_running_loop()
        script = self._clients.get(loop)
        if script is None:
            import redis.asyncio

            client = redis.asyncio.Redis.from_url(
                self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
            )
            script = self._clients[loop] = client.register_script(LUA)
        return script

    def step_now(self, key: str, op: str, *args: Any) -> list[Any] | None:
        return None

    async def step(self, key: str, op: str, *args: Any) -> list[Any]:
        argv = [op, *(int(a) if isinstance(a, bool) else a for a in args)]
        if op == "renew":  # now, lease, then the tickets
            argv = [op, args[0], args[1], *args[2]]
        async with asyncio.timeout(self.timeout):
            raw = await self._script()(keys=[f"ac:limits:{key}"], args=argv)
        return [x.decode() if isinstance(x, bytes) else x for x in raw]

    async def aclose(self) -> None:
        for script in self._clients.values():
            await script.registered_client.aclose()
        self._clients.clear()
