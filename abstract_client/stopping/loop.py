"""Calling into an event loop from any thread, for asyncio and trio alike.

anyio cancel scopes and events are not thread-safe: a stop that arrives on another thread must be
handed to the loop that owns them. ``loop_caller()`` captures the running loop once (on the loop)
and returns a function that schedules a callback on it from anywhere, without ever blocking the
caller (so a stop from the loop's own thread cannot deadlock).
"""

from __future__ import annotations

from collections.abc import Callable

import sniffio

__all__ = ["LoopCaller", "loop_caller", "loop_key", "on_event_loop"]

LoopCaller = Callable[[Callable[[], object]], None]


def loop_caller() -> LoopCaller:
    """Return ``call(fn)`` that runs ``fn()`` soon on the current event loop; thread-safe."""
    lib = sniffio.current_async_library()
    if lib == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def call_trio(fn: Callable[[], object]) -> None:
            try:
                token.run_sync_soon(fn)
            except trio.RunFinishedError:
                pass

        return call_trio

    import asyncio

    loop = asyncio.get_running_loop()

    def call_asyncio(fn: Callable[[], object]) -> None:
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:  # loop closed: nothing left to wake
            pass

    return call_asyncio


def on_event_loop() -> bool:
    """Whether this thread is running an event loop (asyncio or trio) right now."""
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return False
    return True


def loop_key() -> object:
    """An identity for the running event loop, to keep per-loop resources apart."""
    lib = sniffio.current_async_library()
    if lib == "trio":
        import trio

        return trio.lowlevel.current_trio_token()
    import asyncio

    return asyncio.get_running_loop()
