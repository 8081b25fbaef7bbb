"""Run a coroutine on the gateway's loop from any thread, never waited on: what a request does
after its answer (a stop record for the other hosts, a key's release in the shared store) costs
the request nothing, and a store down or slow costs it nothing either."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["spawn_on"]


def spawn_on(
    loop: asyncio.AbstractEventLoop | None,
    op: Coroutine[Any, Any, Any],
    tasks: set[asyncio.Task[Any]],
    failed: Callable[[Exception], None],
    expected: tuple[type[Exception], ...] = (Exception,),
) -> None:
    """Start ``op`` on ``loop`` (from its own thread or another one), held in ``tasks`` until it
    ends; an ``expected`` failure goes to ``failed``. A loop that is gone (shutdown) closes
    ``op`` unstarted."""
    if loop is None or loop.is_closed():
        op.close()
        return

    async def quietly() -> None:
        try:
            await op
        except expected as exc:
            failed(exc)

    def start() -> None:
        task = loop.create_task(quietly())
        tasks.add(task)  # held until done (a task nobody holds may be collected mid-way)
        task.add_done_callback(tasks.discard)

    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if on_loop:
        start()
        return
    try:
        loop.call_soon_threadsafe(start)
    except RuntimeError:  # the loop is gone (shutdown)
        with contextlib.suppress(RuntimeError):
            op.close()
