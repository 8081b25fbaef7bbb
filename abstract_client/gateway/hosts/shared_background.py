"""Background responses kept in the store, readable and cancellable on every host
(``serve --store``; the store itself is ``hosts.py``).

The host that runs a response is its only writer: its events go to the store in order, in
batches, as the holder of the response's fencing token (:class:`SharedBackground`). Every host
reads them from the store (:class:`SharedResponse`), the owner's own included, so a reader
sees the same events, in the same order, whichever host it lands on — and resumes after a cut
on any of them with ``starting_after``. A writer that finds itself fenced (another host ended
the response because this one's lease lapsed) stops its generation; one that cannot reach the
store for a whole lease stops it too: nobody could read what it makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio

from ...wires.responses_server import ResponseBuilder
from ..background import _CANCEL_WAIT_S, Background, BackgroundStore
from .store import TERMINAL, Hosts, StoreUnavailable, error_event

if TYPE_CHECKING:
    from ..config import GatewayConfig
    from ..flight import Flight

__all__ = ["SharedBackground", "SharedBackgroundStore", "SharedResponse"]

log = logging.getLogger("abstract_client.gateway")

_SNAPSHOT_EVERY_S = 0.5  # a running response's `response` object in the store is at most this old
_RETRY_S = 0.2  # between attempts to write to a store that did not answer (growing with the outage)
_RETRY_MAX_S = 2.0
_STORE_LOST = "the store was unreachable for longer than a host's lease: the response was stopped"


class SharedBackground(Background):
    """The owner's side of a background response in the store. Its events are not kept here:
    they are sent to the store, in order, by one writer task."""

    def __init__(self, builder: ResponseBuilder, flight: Flight, owner: str | None, hosts: Hosts) -> None:
        super().__init__(builder, flight, owner)
        self.hosts = hosts
        self.token = ""
        self.written = 0  # events the store holds
        self.fenced = False
        self._pending: list[bytes] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._snapshot_at = 0.0
        self._writer: asyncio.Task[None] | None = None

    def _keep(self, data: bytes) -> None:
        self._pending.append(data)

    def _appended(self) -> None:
        """Wake the writer (the readers read the store)."""
        self._wake.set()

    async def open(self) -> None:
        """Record the response in the store (a :class:`StoreUnavailable` here is the route's
        503), then start writing its events."""
        self.token = await self.hosts.create(self.id, self.owner, self.builder.response())
        self._writer = asyncio.get_running_loop().create_task(self._write(), name=f"background writer {self.id}")

    async def close(self) -> None:
        """The last write: the remaining events and the final status (bounded by a lease)."""
        self._closing = True
        self._wake.set()
        if self._writer is not None:
            with anyio.move_on_after(self.hosts.lease_ms / 1000 + 1):
                await asyncio.shield(self._writer)

    async def _write(self) -> None:
        """Send the events in order. A store gone for a lease stops the generation (nobody could
        read what it makes) and the writer keeps trying: once the store answers again, the
        response's end (``failed``, code ``store_lost``) is written for every reader on every
        host, within ``background_retention`` (after it the store forgets the response anyway)."""
        failing_since: float | None = None
        while not self.fenced:
            if not self._pending and not self._closing:
                await self._wake.wait()
                self._wake.clear()
                continue
            final = self._closing  # every event appended before close() is pending now
            try:
                await self._flush(final)
            except StoreUnavailable as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                down = now - failing_since
                if down > self.hosts.lease_ms / 1000 and self.failure is None and not self.done:
                    log.warning("background response %s: the store is gone (%s); stopping it", self.id, exc)
                    self.fail("store_lost", 503, "store_lost", _STORE_LOST)
                if down > self.hosts.retention_ms / 1000:
                    log.error("background response %s: the store did not come back; its end is not written", self.id)
                    return
                await asyncio.sleep(min(_RETRY_S * (1 + down), _RETRY_MAX_S))
                continue
            failing_since = None
            if final:
                return

    async def _flush(self, final: bool) -> None:
        batch = self._pending[:]
        now = time.monotonic()
        snapshot = None
        if final or now - self._snapshot_at >= _SNAPSHOT_EVERY_S:
            snapshot, self._snapshot_at = self.builder.response(), now
        status = self.builder.status if final else ""
        answer = await self.hosts.append(
            self.id, self.token, self.written, batch, size=self.bytes, status=status, snapshot=snapshot
        )
        if answer == -1:  # another host ended it: this host's lease had lapsed
            self.fenced = True
            log.warning("background response %s: fenced by another host; stopping it", self.id)
            self.flight.stop("owner_lost")
            return
        del self._pending[: len(batch)]
        self.written += len(batch)
        if answer == 1:  # a cancel written into its record (its message may have been lost)
            self.flight.stop("cancel_endpoint")

    async def snapshot(self) -> dict[str, Any]:
        return await SharedResponse(self.hosts, self.id, self.owner).snapshot()

    def follow(self, after: int | None) -> AsyncIterator[bytes]:
        return SharedResponse(self.hosts, self.id, self.owner).follow(after)


class SharedResponse:
    """A background response as any host's reader sees it: from the store."""

    def __init__(self, hosts: Hosts, response_id: str, owner: str | None) -> None:
        self.hosts, self.id, self.owner = hosts, response_id, owner

    async def follow(self, after: int | None) -> AsyncIterator[bytes]:
        """Its events; a store that stops answering mid-read ends the read with an ``error``
        event (code ``store_unavailable``: read on with ``starting_after`` later)."""
        try:
            async for data in self.hosts.events(self.id, after):
                yield data
        except StoreUnavailable as exc:
            yield error_event("store_unavailable", f"the store shared by the gateway hosts is unavailable ({exc})")

    async def snapshot(self) -> dict[str, Any]:
        meta = await self.hosts.meta(self.id)
        if meta is None:
            raise StoreUnavailable("the store no longer holds this response")
        return dict(json.loads(meta["snapshot"]))

    async def cancel(self) -> None:
        """Stop its engine, on whichever host runs it; return once it ended (bounded)."""
        meta = await self.hosts.meta(self.id)
        if meta is None or meta["status"] in TERMINAL:
            return
        await self.hosts.ask_cancel(self.id, meta["host"])
        with anyio.move_on_after(_CANCEL_WAIT_S):
            async for _ in self.hosts.events(self.id, int(meta["next"]) - 1):
                pass


class SharedBackgroundStore(BackgroundStore):
    """:class:`BackgroundStore` with its responses in the store: this host bounds what it runs
    and keeps (``max_background``), every host reads and cancels any of them."""

    def __init__(self, config: GatewayConfig, hosts: Hosts) -> None:
        super().__init__(config)
        self.hosts = hosts
        hosts.on_cancel_response = self._cancel_here

    def new_record(self, builder: ResponseBuilder, flight: Flight, owner: str | None) -> Background:
        return SharedBackground(builder, flight, owner, self.hosts)

    async def get(self, response_id: str, owner: str | None, admin: bool) -> SharedResponse | None:
        meta = await self.hosts.meta(response_id)
        if meta is None or not (admin or (meta["owner"] or None) == owner):
            return None  # another key's response is not even confirmed to exist
        return SharedResponse(self.hosts, response_id, meta["owner"] or None)

    def _drop(self, response_ids: list[str]) -> None:
        super()._drop(response_ids)
        if response_ids:  # the store forgets them too (they would expire after background_retention)
            task = asyncio.get_running_loop().create_task(self._forget(response_ids))
            self._tasks.add(task)  # held until done (a task nobody holds may be collected mid-way)
            task.add_done_callback(self._tasks.discard)

    async def _forget(self, response_ids: list[str]) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.hosts.forget(response_ids)

    def _cancel_here(self, response_id: str) -> None:
        record = self.items.get(response_id)
        if record is not None and not record.done:
            record.flight.stop("cancel_endpoint")
