"""The :class:`Fleet` itself: an ``LLM`` whose provider is a :class:`FleetProvider`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..llm import LLM
from ..provider import http_clients
from ..types import Timeout
from .health import HealthPolicy
from .member import Member
from .prober import probe_once
from .provider import FleetProvider
from .routing import Policy, Router

__all__ = ["Fleet"]


class Fleet(LLM):
    """One model served by several members (``LLM`` s of any lanes, mixed allowed).

    Args:
        members: the members, as a list (named by their base URL, or lane and model) or a
            mapping of name to ``LLM``. The fleet owns them: ``close()`` closes them.
        policy: ``"prefix"`` (default: where the longest opening of the prompt is cached,
            within ``load_bound``: see :mod:`abstract_client.fleet.prefix`),
            ``"least_loaded"``, ``"round_robin"``, ``"weighted"`` or ``"affinity"`` (a
            conversation, by its opening, sticks to one member). A call's ``session=`` sticks to one member under
            every policy.
        load_bound: ``"prefix"``: no member takes a call that would put it above this multiple
            of the members' mean calls in flight (>= 1; 1.25 by default): a hot prefix spills
            to its next-best members.
        hedge_after: seconds (or ``"p90"``-style: a percentile of observed time to first chunk)
            after which a call with no chunk yet is sent to a second member too; the first to
            answer wins, the other is stopped. None: no hedging.
        max_attempts: members tried for one call when one fails before its first byte
            (connection refused, connect timeout, 429, 502, 503, 504).
        weights: per member (same order, or by name) for ``"weighted"``.
        failure_threshold, failure_window, cooldown, max_cooldown: passive health (see
            :mod:`abstract_client.fleet.health`); a stop is never a failure.
        probe_timeout: seconds for one readiness probe of a member that is down.
        probe_interval: seconds between the background probes of a member that is down
            (±25 % jitter); it serves again the moment one succeeds.
        timeout: the calls' deadlines, as for ``create_llm``.
    """

    provider: FleetProvider

    def __init__(
        self,
        members: Sequence[LLM] | Mapping[str, LLM],
        *,
        policy: Policy = "prefix",
        load_bound: float = 1.25,
        hedge_after: float | str | None = None,
        max_attempts: int = 2,
        weights: Sequence[float] | Mapping[str, float] | None = None,
        failure_threshold: int = 3,
        failure_window: float = 30.0,
        cooldown: float = 2.0,
        max_cooldown: float = 60.0,
        probe_timeout: float = 2.0,
        probe_interval: float = 0.5,
        timeout: Timeout | float | None = None,
    ) -> None:
        health = HealthPolicy(failure_threshold, failure_window, cooldown, max_cooldown)
        named = dict(members) if isinstance(members, Mapping) else {_name_of(m, i): m for i, m in enumerate(members)}
        if not isinstance(members, Mapping) and len(named) != len(members):
            named = {f"{_name_of(m, i)}#{i}": m for i, m in enumerate(members)}
        if weights is None:
            weight_of = dict.fromkeys(named, 1.0)
        elif isinstance(weights, Mapping):
            weight_of = {name: float(weights.get(name, 1.0)) for name in named}
        else:
            if len(weights) != len(named):
                raise ValueError("weights: one per member")
            weight_of = {name: float(w) for name, w in zip(named, weights, strict=True)}
        for name, llm in named.items():
            if not isinstance(llm, LLM) or isinstance(llm, Fleet):
                raise TypeError(f"member {name!r} must be an LLM (not a fleet), not {type(llm).__name__}")
        self.members = [Member.of(name, llm, weight_of[name], health) for name, llm in named.items()]
        provider = FleetProvider(
            self.members,
            router=Router(policy, load_bound=load_bound),
            max_attempts=max_attempts,
            hedge_after=hedge_after,
            probe_timeout=probe_timeout,
            probe_interval=probe_interval,
        )
        super().__init__(provider, timeout=timeout, max_retries=0)  # failover is the fleet's retry

    def __repr__(self) -> str:
        return f"<Fleet {[m.name for m in self.members]} policy={self.provider.router.policy!r}>"

    def member(self, name: str) -> LLM:
        """The member ``name``'s own ``LLM`` (its model management, its own calls)."""
        for m in self.members:
            if m.name == name:
                return m.llm
        raise KeyError(name)

    def status(self) -> dict[str, Any]:
        """A snapshot: per member its state (``healthy``, ``cooldown``, ``probe``), calls in
        flight, served/failed/stopped attempts, cooldowns, hedges; and the fleet's hedges."""
        return {
            "policy": self.provider.router.policy,
            "hedges_sent": sum(m.hedges_sent for m in self.members),
            "hedges_won": sum(m.hedges_won for m in self.members),
            "members": [m.snapshot() for m in self.members],
        }

    async def aprobe(self) -> dict[str, bool]:
        """Active health check now: every member's readiness route (never a generation). A
        member that fails it goes to cooldown; one that passes is healthy again."""
        out: dict[str, bool] = {}
        for m in self.members:
            out[m.name] = await probe_once(m, self.provider.probe_timeout)
        return out

    def probe(self) -> dict[str, bool]:
        """:meth:`aprobe` from sync code."""
        return self._portal.run(self.aprobe)

    def close(self) -> None:
        self.provider.prober.close()
        super().close()
        for m in self.members:
            m.llm.close()

    async def aclose(self) -> None:
        await super().aclose()
        for m in self.members:
            await m.llm.aclose()


def _name_of(llm: LLM, index: int) -> str:
    clients = http_clients(llm.provider)
    if clients is not None and clients.base_url:
        return str(clients.base_url)
    return f"{llm.provider.name}:{llm.provider.model or index}"
