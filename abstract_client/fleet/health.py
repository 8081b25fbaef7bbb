"""A member's health, judged only by failures that are the member's own.

**Never counted**: a stop (the caller's, a hedge that lost, an eject), a deadline the caller set,
a 4xx answer (the request's fault: invalid, unknown model, context overflow, rate limit), an
output that fails validation. LiteLLM's router counts callers hanging up as deployment failures
and cools healthy deployments down (litellm #42222); here an attempt whose stop token is set is
never judged at all, whatever error its severed connection surfaced.

**Counted**: connection refused or reset, a connect timeout, a 5xx, a malformed stream, a member
that died mid-answer. ``failure_threshold`` of them within ``failure_window`` seconds take the
member down: callers skip it for ``cooldown * 2^k`` seconds (k: steps in a row, capped at
``max_cooldown``), with ±25 % jitter so a fleet of clients does not come back in step.

A member that is down is probed **off the callers' path** (``fleet/prober.py``): one probe at a
time per member, every ``probe_interval`` seconds (jittered), a single readiness request each
("connection refused" is an answer: not ready). The first probe that succeeds brings the member
back at once — its cooldown need not run out — and clears the streak; a failed probe is one
step of backoff (one failure, one step; capped). Callers never wait on a probe: a down member
whose cooldown ended, still unconfirmed, is tried only when no healthy member is left. A member
with no readiness route (an in-process lane) is taken back when its cooldown ends: its next call
is the probe.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import (
    AbstractClientError,
    GenerationCancelledError,
    GenerationTimeoutError,
    ProviderAPIError,
    ProviderProtocolError,
    RateLimitError,
    ServerUnavailableError,
    TransportError,
)

__all__ = ["HealthPolicy", "MemberHealth", "counts_against", "may_fail_over"]


def counts_against(err: AbstractClientError) -> bool:
    """Is ``err`` the member's failure (and not the request's, or a stop)?"""
    if isinstance(err, GenerationCancelledError):
        return False
    if isinstance(err, GenerationTimeoutError):
        return err.kind == "connect"  # the member did not answer a connect; other deadlines are the caller's
    if isinstance(err, (ServerUnavailableError, TransportError, ProviderProtocolError)):
        return True
    if isinstance(err, RateLimitError):
        return False  # busy, not broken
    if isinstance(err, ProviderAPIError):
        return err.status is None or err.status >= 500
    return False


def may_fail_over(err: AbstractClientError) -> bool:
    """May a call that failed this way BEFORE its first byte go to another member? Only where
    the member certainly produced nothing the caller could see: it refused or timed out the
    connection, its connection failed before a single response byte (killed with the request
    queued, or in prefill), it said it is not ready (503, loading), too busy (429) or that a
    proxy in front of it failed (502/504)."""
    if isinstance(err, GenerationTimeoutError):
        return err.kind == "connect"
    if isinstance(err, TransportError):
        return err.no_response
    if isinstance(err, (ServerUnavailableError, RateLimitError)):
        return True
    return isinstance(err, ProviderAPIError) and err.status in (502, 503, 504)


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """When a member counts as unhealthy (failures within a window) and how long it rests (cooldown,
    doubling up to a cap)."""

    failure_threshold: int = 3
    failure_window: float = 30.0
    cooldown: float = 2.0
    max_cooldown: float = 60.0


@dataclass
class MemberHealth:
    """One member's health: its recent failures and its cooldown; only its own failures move it (a stop
    or a 4xx never does)."""

    policy: HealthPolicy = field(default_factory=HealthPolicy)
    failures: deque[float] = field(default_factory=deque)
    cooldown_until: float = 0.0
    streak: int = 0  # backoff steps in a row without a success
    probe_due: bool = False  # down: not confirmed back yet (a probe's success, or a served call, clears it)
    probeable: bool = True  # has a readiness route (else its next call after the cooldown is the probe)
    on_down: Callable[[], object] | None = field(default=None, repr=False)  # the fleet's prober.wake
    total_failures: int = 0
    cooldowns: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def failed(self, now: float | None = None) -> bool:
        """Record one failure; True if it put the member in cooldown."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self.total_failures += 1
            self.failures.append(now)
            while self.failures and self.failures[0] < now - self.policy.failure_window:
                self.failures.popleft()
            if len(self.failures) < self.policy.failure_threshold and not self.probe_due:
                return False
            self._cool(now)
        if self.on_down is not None:
            self.on_down()
        return True

    def _cool(self, now: float) -> None:
        span = min(self.policy.max_cooldown, self.policy.cooldown * 2**self.streak)
        self.cooldown_until = now + span * random.uniform(0.75, 1.25)
        self.streak += 1
        self.cooldowns += 1
        self.failures.clear()
        self.probe_due = True

    def probe_failed(self) -> None:
        """One failed probe: one step of backoff (the prober makes at most one probe at a time per
        member, so a pile-up of probes cannot step it more than once each)."""
        with self._lock:
            self._cool(time.monotonic())

    def succeeded(self) -> None:
        with self._lock:
            self.streak = 0
            self.failures.clear()
            self.probe_due = False
            self.cooldown_until = 0.0

    def cooling(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) < self.cooldown_until

    def routable(self, now: float | None = None) -> bool:
        """May a caller be sent here while a healthy member is left? Healthy, or an unprobeable
        member whose cooldown ended (its call is the probe)."""
        if self.cooling(now):
            return False
        return not self.probe_due or not self.probeable

    @property
    def state(self) -> str:
        if self.cooling():
            return "cooldown"
        return "probe" if self.probe_due else "healthy"
