"""A backend's slots shared fairly between keys (replacing one first-come-first-served semaphore).

When requests queue for a slot, the next free slot goes to the key that holds the fewest slots
per its weight, and among equals to the one served longest ago; a key's own requests keep their
order. This is deficit round robin with one request as the quantum, weighted: a key sending 30
long generations at once and a key sending one question each get a slot in turn, so the question
waits for one slot to free, never for the 30. ``reserved`` slots are kept from a key that already
holds one (for another key's next request), so a short question need not even wait for a long
answer to end.

A queued request that is stopped (its client left, a cancel, a deadline) leaves the queue at once
and takes no slot; a slot granted in the instant it was stopped goes to the next in line.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque

__all__ = ["FairSlots"]


class FairSlots:
    def __init__(self, capacity: int, *, reserved: int = 0, fair: bool = True) -> None:
        self.capacity, self.reserved, self.fair = capacity, reserved, fair
        self.free = capacity
        self.held: dict[str, int] = {}  # slots each key holds
        self._weights: dict[str, int] = {}
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}
        self._turn = itertools.count()
        self._served: dict[str, int] = {}  # when each key was last granted a slot (a turn number)
        self._arrivals = itertools.count()  # first come first served (fair=False): arrival order
        self._arrived: dict[asyncio.Future[None], int] = {}

    @property
    def value(self) -> int:
        """Slots free now (as a semaphore's ``value``)."""
        return self.free

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def _may_take(self, key: str) -> bool:
        """A free slot is this key's to take (the reserved ones are not, for a key holding one)."""
        if self.free <= 0:
            return False
        return not (self.reserved and self.held.get(key, 0) and self.free <= self.reserved)

    def try_acquire(self, key: str, weight: int = 1) -> bool:
        """Take a slot now if one is free and nobody waits for it."""
        if self._queues or not self._may_take(key):
            return False
        self._take(key, weight)
        return True

    async def acquire(self, key: str, weight: int = 1) -> None:
        """Wait for this key's turn. Cancelled while waiting: out of the queue, no slot held."""
        if self.try_acquire(key, weight):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._weights[key] = weight
        self._queues.setdefault(key, deque()).append(waiter)
        self._arrived[waiter] = next(self._arrivals)
        self._grant()  # a slot others may not take (reserved) may be this key's now
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # granted in the instant it was stopped
                self.release(key)
            else:
                self._forget(key, waiter)
            raise

    def release(self, key: str) -> None:
        self.held[key] -= 1
        if not self.held[key]:
            del self.held[key]
        self.free += 1
        self._grant()

    def _take(self, key: str, weight: int) -> None:
        self.free -= 1
        self.held[key] = self.held.get(key, 0) + 1
        self._weights[key] = weight
        self._served[key] = next(self._turn)

    def _forget(self, key: str, waiter: asyncio.Future[None]) -> None:
        queue = self._queues.get(key)
        if queue is not None:
            try:
                queue.remove(waiter)
            except ValueError:
                pass
            if not queue:
                del self._queues[key]
        self._arrived.pop(waiter, None)
        self._grant()  # a waiter that blocked others (fair=False) may have been the head

    def _next_key(self) -> str | None:
        eligible = [k for k in self._queues if self._may_take(k)]
        if not eligible:
            return None
        if not self.fair:  # first come first served, whoever the key
            return min(eligible, key=lambda k: self._arrived[self._queues[k][0]])
        return min(eligible, key=lambda k: (self.held.get(k, 0) / self._weights.get(k, 1), self._served.get(k, -1)))

    def _grant(self) -> None:
        while self.free > 0:
            key = self._next_key()
            if key is None:
                return
            queue = self._queues[key]
            waiter = queue.popleft()
            if not queue:
                del self._queues[key]
            self._arrived.pop(waiter, None)
            if waiter.done():  # cancelled and not yet forgotten
                continue
            self._take(key, self._weights.get(key, 1))
            waiter.set_result(None)
