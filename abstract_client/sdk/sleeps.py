"""A stop during an SDK's retry sleep ends the sleep.

openai-python and the anthropic SDK sleep between retries (a 429 or 503's ``Retry-After``, up to
60 s; their backoff after a refused connection) with ``time.sleep`` or ``anyio.sleep``, where no
transport can see; so does tenacity, the retry layer of LangChain's ``with_retry``, LlamaIndex
and instructor. Those modules are therefore given a ``time`` and an ``anyio`` whose
``sleep`` is this module's (every other name is the real module's): outside a ``stop_on`` block
it IS the real sleep; inside one it sleeps the same time, and a source that stops meanwhile ends
it at once — the SDK then sends its retry, which the block refuses before a byte is sent, with the
typed error. A call nobody stopped keeps the SDK's own retry policy (count, delays,
``Retry-After``). Installed when a ``stop_on`` block is entered, into the modules already
imported; a module whose ``time`` or ``anyio`` someone else replaced is left as it is.
"""

from __future__ import annotations

import sys
import threading
import time
import types
from typing import Any

import anyio

from ..stopping.loop import loop_caller
from .binding import current_binding

__all__ = ["MODULES", "install"]

# The modules whose retry loop sleeps: both SDKs' generated base client, and tenacity's sleep
# (LangChain's with_retry, LlamaIndex's and instructor's retries)
MODULES = ("openai._base_client", "anthropic._base_client", "tenacity.nap")


def sleep(seconds: float) -> None:
    """``time.sleep``, ended early by a stop of the current ``stop_on`` block."""
    binding = current_binding()
    if not binding.bound or seconds <= 0:
        time.sleep(seconds)
        return
    wake = threading.Event()
    unwatch = binding.watch(lambda *_: wake.set())
    try:
        wake.wait(seconds)
    finally:
        unwatch()


async def asleep(seconds: float) -> None:
    """``anyio.sleep``, ended early by a stop of the current ``stop_on`` block."""
    binding = current_binding()
    if not binding.bound or seconds <= 0:
        await anyio.sleep(seconds)
        return
    woken = anyio.Event()
    call_soon = loop_caller()
    unwatch = binding.watch(lambda *_: call_soon(woken.set))
    try:
        with anyio.move_on_after(seconds):
            await woken.wait()
    finally:
        unwatch()


class _StandIn(types.ModuleType):
    """A module that is ``real`` but for ``sleep``."""

    def __init__(self, real: types.ModuleType, sleep: Any) -> None:
        super().__init__(real.__name__, real.__doc__)
        self._real = real
        self.sleep = sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


_TIME = _StandIn(time, sleep)
_ANYIO = _StandIn(anyio, asleep)
_installed: set[str] = set()


def install() -> None:
    """Give the SDK modules already imported the stop's sleeps (once each; cheap after)."""
    if len(_installed) == len(MODULES):
        return
    for name in MODULES:
        module = sys.modules.get(name)
        if module is None or name in _installed:
            continue
        if getattr(module, "time", None) is time:
            module.time = _TIME  # type: ignore[attr-defined]
        if getattr(module, "anyio", None) is anyio:
            module.anyio = _ANYIO  # type: ignore[attr-defined]
        _installed.add(name)
