"""Rule 3: every await on the backend can be stopped from any thread, and has a deadline.

:func:`step` runs one await inside an anyio cancel scope that the stop token cancels (from any
thread, through the loop) and that ends at the phase's deadline (connect is httpx's; first token,
idle and total are ours). A call whose private connection is up does not need the scope to be
stopped: the stop shuts its socket down, which wakes the read by itself — so a stream pays for a
scope per chunk only when it has an idle/total deadline or no socket (in-process engines).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

import anyio

from ..errors import GenerationTimeoutError, TimeoutKind
from ..http.guard import current_guard
from ..stopping.loop import loop_caller
from .call import Call
from .translate import attach, cancelled, raise_translated

__all__ = ["Phase", "deadline", "needs_scope", "step"]

T = TypeVar("T")
Phase = Literal["first", "idle"]


def deadline(call: Call, phase: Phase) -> tuple[float, TimeoutKind]:
    """Seconds left (``inf`` for none) before the phase's nearest deadline, and its kind."""
    limits: list[tuple[float, TimeoutKind]] = []
    t, p = call.spec.timeout, call.progress
    if t.total is not None:
        limits.append((call.t0 + t.total, "total"))
    if phase == "first" and t.first_token is not None:
        limits.append((call.t0 + t.first_token, "first_token"))
    if phase == "idle" and t.idle is not None and p.last_chunk_at is not None:
        limits.append((p.last_chunk_at + t.idle, "idle"))
    if not limits:
        return math.inf, "total"
    at, kind = min(limits)
    return at - time.perf_counter(), kind


def needs_scope(call: Call, phase: Phase) -> bool:
    """Whether an await needs its own cancel scope (see the module docstring)."""
    t = call.spec.timeout
    return not call.severable or t.total is not None or (phase == "idle" and t.idle is not None)


async def step(call: Call, fn: Callable[[], Awaitable[T]], phase: Phase) -> T:
    """Await ``fn()`` stoppable and bounded; translate whatever comes out (rules 3-5)."""
    left, kind = deadline(call, phase)
    call_soon = loop_caller()
    scope = anyio.CancelScope(deadline=anyio.current_time() + left)
    remove_hook = call.token.add_hook(lambda: call_soon(scope.cancel))
    guard_reset = current_guard.set(call.guard)  # a connection made now is this call's
    try:
        with scope:
            return await fn()
    except BaseException as exc:
        raise_translated(call, exc)
        raise  # unreachable: raise_translated always raises
    finally:
        remove_hook()
        current_guard.reset(guard_reset)
    # Only reached when the scope swallowed its own cancellation: our stop, or the deadline.
    if call.token.is_set:
        raise cancelled(call)
    if call.guard is not None:
        call.guard.sever()
    raise attach(call, GenerationTimeoutError(f"{kind} timeout exceeded", kind=kind))
