"""One member of a fleet: an ``LLM`` (any lane), its name, weight, health and live counters."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .health import HealthPolicy, MemberHealth

if TYPE_CHECKING:
    from ..llm import LLM

__all__ = ["Member"]


@dataclass(eq=False)
class Member:
    """A fleet member: its ``LLM``, weight, health and counters (in flight, served)."""

    name: str
    llm: LLM
    weight: float = 1.0
    health: MemberHealth = field(default_factory=MemberHealth)
    attempts: set[Any] = field(default_factory=set, repr=False)  # its attempts not yet closed
    served: int = 0  # attempts that produced the answer the caller got
    failed: int = 0  # attempts that failed in a way counted against the member
    stopped: int = 0  # attempts stopped (the caller's stop, a lost hedge, an eject): never failures
    hedges_sent: int = 0  # hedged attempts started on this member
    hedges_won: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, name: str, llm: LLM, weight: float, policy: HealthPolicy) -> Member:
        if weight <= 0:
            raise ValueError(f"member {name!r}: weight must be > 0")
        return cls(name=name, llm=llm, weight=weight, health=MemberHealth(policy))

    @property
    def in_flight(self) -> int:
        """Attempts running on this member. A stopped one leaves the count the moment its stop
        is requested (before its caller is woken), not when its stream has unwound a moment
        later: ``status()`` read right after a stop never shows the call still in flight."""
        with self._lock:
            attempts = list(self.attempts)
        return sum(1 for a in attempts if a.running)

    def enter(self, attempt: Any) -> None:
        with self._lock:
            self.attempts.add(attempt)

    def leave(self, attempt: Any) -> None:
        with self._lock:
            self.attempts.discard(attempt)

    def count(self, attr: str, delta: int = 1) -> None:
        with self._lock:
            setattr(self, attr, getattr(self, attr) + delta)

    def snapshot(self) -> dict[str, Any]:
        h = self.health
        left = max(0.0, h.cooldown_until - time.monotonic())
        return {
            "name": self.name,
            "provider": self.llm.provider.name,
            "state": h.state,
            "in_flight": self.in_flight,
            "served": self.served,
            "failed": self.failed,
            "stopped": self.stopped,
            "cooldowns": h.cooldowns,
            "cooldown_left_s": round(left, 3),
            "hedges_sent": self.hedges_sent,
            "hedges_won": self.hedges_won,
            "weight": self.weight,
        }
