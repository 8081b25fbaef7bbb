"""One LLM over several replicas: :class:`Fleet`.

A fleet is an ``LLM`` (the whole surface, the same contract: one request id and one stop token
per call, whatever member serves it) whose provider runs each call on its members: routing
(``routing.py``), failover before the first byte and hedging (``provider.py``, ``attempt.py``),
and health that only a member's own failures move (``health.py``).
"""

from __future__ import annotations

from .fleet import Fleet
from .health import HealthPolicy, counts_against, may_fail_over
from .member import Member
from .routing import POLICIES, Policy

__all__ = ["POLICIES", "Fleet", "HealthPolicy", "Member", "Policy", "counts_against", "may_fail_over"]
