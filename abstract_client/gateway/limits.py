"""Limits per key (``keys.Limits``), decided when a request arrives, before anything is sent
upstream or a slot is waited for: a request over a limit is a :class:`Refusal` (a 429 with
``Retry-After`` in the route's own error shape); one within them holds an :class:`Admission`
until it ends, when its tokens settle to what the engine counted.

Tokens are reserved at admission (the request's ``max_tokens``, else :data:`DEFAULT_RESERVE`;
never more than what is left, so a request that finds room is admitted) and settled at the end:
a stopped answer frees what it did not use. A budget crossed by an answer already running lets
that answer finish; the next request is refused until the period ends.

The counts are this gateway process's (each worker and each host limits what it serves).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import deque
from dataclasses import dataclass, field

from .keys import Limits

__all__ = ["DEFAULT_RESERVE", "Admission", "Limiter", "Refusal", "period_bounds"]

DEFAULT_RESERVE = 1024  # tokens reserved for a request that names no max_tokens
WINDOW = 60.0


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


@dataclass(slots=True)
class Refusal:
    limit: str  # concurrent | requests_per_minute | tokens_per_minute | token_budget
    retry_after: int  # seconds
    message: str


@dataclass
class _KeyState:
    limits: Limits
    in_flight: int = 0
    arrivals: deque[float] = field(default_factory=deque)  # admitted requests, last WINDOW s
    settled: deque[tuple[float, int]] = field(default_factory=deque)  # (when, tokens), last WINDOW s
    window_tokens: int = 0  # the sum of ``settled``
    reserved: int = 0  # held by requests in flight
    period_end: float = 0.0
    period_spent: int = 0

    def forget_before(self, now: float) -> None:
        horizon = now - WINDOW
        while self.arrivals and self.arrivals[0] <= horizon:
            self.arrivals.popleft()
        while self.settled and self.settled[0][0] <= horizon:
            self.window_tokens -= self.settled.popleft()[1]


class Admission:
    """A request within its key's limits: :meth:`settle` once, when it ends."""

    __slots__ = ("_limiter", "_settled", "_state", "reserved")

    def __init__(self, limiter: Limiter | None, state: _KeyState | None, reserved: int) -> None:
        self._limiter, self._state, self.reserved, self._settled = limiter, state, reserved, False

    def settle(self, tokens: int) -> None:
        """The request ended having cost ``tokens`` (the engine's count; 0 if it never ran)."""
        if self._settled or self._state is None:
            return
        self._settled = True
        state, now = self._state, time.time()
        state.in_flight -= 1
        state.reserved -= self.reserved
        if tokens:
            state.settled.append((now, tokens))
            state.window_tokens += tokens
            if now < state.period_end:
                state.period_spent += tokens


UNLIMITED = Admission(None, None, 0)


class Limiter:
    """Every key's counts, against its limits (``limits_for(name)``); ``spent`` is what each key
    spent in its budget's period before this process started (from the usage database)."""

    def __init__(self, limits_for: dict[str, Limits | None], spent: dict[str, int] | None = None) -> None:
        self._limits_for = limits_for
        self._states: dict[str, _KeyState] = {}
        self._spent_before = dict(spent or {})

    def _state(self, key: str, limits: Limits, now: float) -> _KeyState:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _KeyState(limits)
            _, state.period_end = period_bounds(limits.budget_period, now)
            state.period_spent = self._spent_before.pop(key, 0)
        if now >= state.period_end:  # a new period: the budget is whole again
            _, state.period_end = period_bounds(limits.budget_period, now)
            state.period_spent = 0
        return state

    def admit(self, key: str, max_tokens: int | None) -> Admission | Refusal:
        limits = self._limits_for.get(key)
        if limits is None or not limits.limited:
            return UNLIMITED
        now = time.time()
        state = self._state(key, limits, now)
        state.forget_before(now)
        if limits.concurrent is not None and state.in_flight >= limits.concurrent:
            return Refusal("concurrent", 1, f"key {key!r} has {state.in_flight} requests in flight (its limit)")
        if limits.requests_per_minute is not None and len(state.arrivals) >= limits.requests_per_minute:
            wait = state.arrivals[0] + WINDOW - now
            why = f"key {key!r} sent {len(state.arrivals)} requests in the last minute (its limit)"
            return Refusal("requests_per_minute", _seconds(wait), why)
        want = DEFAULT_RESERVE if max_tokens is None else max(1, max_tokens)
        room = math.inf
        if limits.tokens_per_minute is not None:
            used = state.window_tokens + state.reserved
            if used >= limits.tokens_per_minute:
                why = f"key {key!r} used {used} tokens in the last minute (its limit: {limits.tokens_per_minute})"
                return Refusal("tokens_per_minute", self._tokens_free_in(state, used, limits, now), why)
            room = limits.tokens_per_minute - used
        if limits.token_budget is not None:
            spent = state.period_spent + state.reserved
            if spent >= limits.token_budget:
                why = (
                    f"key {key!r} spent its token budget ({limits.token_budget} per {limits.budget_period}); "
                    "it renews when the period ends"
                )
                return Refusal("token_budget", _seconds(state.period_end - now), why)
            room = min(room, limits.token_budget - spent)
        reserved = int(min(want, room)) if room != math.inf else want
        state.in_flight += 1
        state.arrivals.append(now)
        state.reserved += reserved
        return Admission(self, state, reserved)

    @staticmethod
    def _tokens_free_in(state: _KeyState, used: int, limits: Limits, now: float) -> int:
        """Seconds until enough settled tokens leave the window to bring ``used`` under the limit
        (reservations free themselves when their requests end: a second, then)."""
        excess = used - (limits.tokens_per_minute or 0) + 1
        for when, n in state.settled:
            excess -= n
            if excess <= 0:
                return _seconds(when + WINDOW - now)
        return 1


def _seconds(wait: float) -> int:
    return max(1, math.ceil(wait))
