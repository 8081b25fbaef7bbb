"""Which member serves the next call.

* ``least_loaded``: the fewest calls in flight; ties go round robin.
* ``round_robin``: each member in turn.
* ``weighted``: smooth weighted round robin (nginx's): member i serves ``w_i / Σw`` of the calls,
  interleaved rather than in bursts.
* ``prefix`` (default): where the longest opening of the prompt is already cached, within a bound on load
  (``fleet/prefix.py``): calls that share a system prompt share a member, a conversation's next
  turn follows its previous one, and a hot prefix spills to its next-best members.
* ``affinity``: a conversation sticks to one member, so its KV cache (llama-server's prompt
  cache, vLLM's prefix cache) is reused: the key is the call's ``session=`` or, without one, its
  opening (the system message and the first user message); the member is chosen by rendezvous
  hashing, so a member that leaves moves only its own conversations.

A call's ``session=`` wins under ``prefix`` too (rendezvous on it, no load bound: a session is a
promise to stick). Calls with no prompt (embeddings, token counts) go least-loaded.

Members in cooldown are skipped; if every candidate is cooling down, none is chosen.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..types import GenerationRequest
from .prefix import PrefixTable, place, prefix_blocks, rendezvous

if TYPE_CHECKING:
    from .member import Member

__all__ = ["POLICIES", "Policy", "RouteKey", "Router", "affinity_key"]

Policy = Literal["least_loaded", "round_robin", "weighted", "affinity", "prefix"]
POLICIES: tuple[Policy, ...] = ("least_loaded", "round_robin", "weighted", "affinity", "prefix")


@dataclass(frozen=True)
class RouteKey:
    """What a call is routed by: its ``session=`` (or affinity's opening), and under ``prefix``
    its prompt's block chain."""

    sticky: str
    session: bool
    blocks: tuple[int, ...] = ()


def affinity_key(request: GenerationRequest, session: str | None) -> str:
    """What keeps a conversation on one member: its ``session=``, else a hash of its opening messages."""
    if session is not None:
        return "session:" + session
    opening = []
    for message in request.messages:
        content = message.get("content")
        opening.append(f"{message.get('role')}:{content if isinstance(content, str) else repr(content)}")
        if message.get("role") == "user":
            break
    return "prefix:" + "\n".join(opening)


class Router:
    """Picks the member for a call under the fleet's policy, among the healthy ones not yet tried.
    ``load_bound`` (``prefix``): no member takes a call that would put it above this multiple of
    the members' mean load."""

    def __init__(self, policy: Policy, *, load_bound: float = 1.25) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if not load_bound >= 1.0:
            raise ValueError(f"load_bound must be >= 1 (a multiple of the mean load), not {load_bound!r}")
        self.policy = policy
        self.load_bound = load_bound
        self.table = PrefixTable()
        self._lock = threading.Lock()
        self._next = 0
        self._current: dict[str, float] = {}  # smooth weighted round robin's running weights

    def key_for(self, request: GenerationRequest, session: str | None) -> RouteKey:
        """A generation call's routing key under this policy."""
        sticky = affinity_key(request, session)
        blocks = prefix_blocks(request) if self.policy == "prefix" else ()
        return RouteKey(sticky, session is not None, blocks)

    def pick(self, members: Sequence[Member], key: RouteKey | None, *, first: bool = True) -> Member | None:
        """The member for the next attempt among ``members`` (already filtered: not cooling,
        not tried yet); None if there is none. ``first``: the call's first attempt (a failover
        or a hedge does not move the round-robin turn: the next call still gets its own)."""
        if not members:
            return None
        with self._lock:
            if key is not None and (key.session or self.policy == "affinity"):
                sticky = key.sticky
                return max(members, key=lambda m: rendezvous(sticky, m.name))
            if self.policy == "prefix" and key is not None:
                chosen = place(members, key.blocks, self.table, self.load_bound)
                self.table.record(key.blocks, chosen.name)
                return chosen
            if self.policy == "weighted" and first:
                total = sum(m.weight for m in members)
                for m in members:
                    self._current[m.name] = self._current.get(m.name, 0.0) + m.weight
                chosen = max(members, key=lambda m: self._current[m.name])
                self._current[chosen.name] -= total
                return chosen
            start = self._next
            if first:
                self._next += 1
            ordered = [members[(start + i) % len(members)] for i in range(len(members))]
            if self.policy == "least_loaded":
                return min(ordered, key=lambda m: m.in_flight)  # min keeps the first of equals
            return ordered[0]
