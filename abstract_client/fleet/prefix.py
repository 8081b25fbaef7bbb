"""Prefix-aware placement: a call goes where the longest opening of its prompt is already cached,
within a bound on load.

What a server prefills is the rendered conversation from its start (tools, system prompt,
history), and its prompt cache (llama-server's slots and host cache, vLLM's prefix blocks) serves
the longest prefix it has seen. So a call is described by the chain of its prompt's blocks
(:func:`prefix_blocks`): pieces of a canonical rendering (at most 256 bytes, never across two
messages), each hashed with everything before it, so two calls share their first k hashes exactly
when they share their first k blocks.

:class:`PrefixTable` remembers which members were sent each block (bounded, least recently used
first out), and :func:`place` orders the candidates:

1. the deepest match first: the member that was sent the most of this prompt's blocks (a
   conversation's next turn follows its previous one; users of one system prompt share a member);
2. among equals, the fewest calls in flight (a prefix cached on two members alternates by load);
3. then rendezvous hashing on the prompt's first block, so a prefix nobody has seen lands on the
   same member in every process (gateway workers, restarts) and a member that leaves moves only
   its own prefixes; when it is back, ties go to it again.

The first candidate whose load after taking the call stays within ``bound`` times the mean load
(:func:`load_limit`; consistent hashing with bounded loads, Mirrokni et al. 2018) serves: a hot
prefix spills to its next-best members in order, never to all at once. A member at least that
light always exists, so the bound never refuses a call.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..types import GenerationRequest

if TYPE_CHECKING:
    from .member import Member

__all__ = ["BLOCK_CHARS", "PrefixTable", "load_limit", "place", "prefix_blocks", "rendezvous"]

BLOCK_CHARS = 256  # about 64 tokens: fine enough to tell system prompts apart, cheap to hash
_TABLE_BLOCKS = 65_536  # blocks remembered (~16 MB of prompt text's worth of hashes)


def _parts(request: GenerationRequest) -> list[str]:
    """The prompt in the order most chat templates render it: the opening system messages, the
    tools, then each message (role, text, images by a digest of their data, tool calls). Equal
    inputs give equal parts, and an earlier turn's parts are the first parts of the next turn's.
    (The system prompt before the tools: tenants of one agent framework share its tool list but
    not their instructions, and the first block is what places a prefix nobody has seen.)"""
    messages = list(request.messages)
    opening = 0
    while opening < len(messages) and messages[opening].get("role") in ("system", "developer"):
        opening += 1
    parts = [_message_part(m) for m in messages[:opening]]
    if request.tools:
        parts.append("tools:" + json.dumps(request.tools, sort_keys=True, default=str))
    parts += [_message_part(m) for m in messages[opening:]]
    return parts


def _message_part(message: Any) -> str:
    content = message.get("content")
    if not isinstance(content, str):
        content = json.dumps(content, sort_keys=True, default=_digest)
    calls = message.get("tool_calls")
    calls_text = json.dumps(calls, sort_keys=True, default=str) if calls else ""
    return f"<{message.get('role')}>{content}{calls_text}"


def _digest(value: Any) -> str:
    data = value if isinstance(value, bytes) else str(value).encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def prefix_blocks(request: GenerationRequest, block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """The chain of a prompt's block hashes: block i's hash covers blocks 0..i. Each part (the
    tools, a message) is cut into blocks of its own, its last one shorter: a block never spans
    two messages, so a message's blocks are the same whatever follows it (a short conversation's
    next turn still shares its blocks)."""
    chain: list[int] = []
    h = hashlib.blake2b(digest_size=8)
    for part in _parts(request):
        data = part.encode()
        for start in range(0, max(len(data), 1), block_chars):
            h.update(data[start : start + block_chars] + b"\0")
            chain.append(int.from_bytes(h.copy().digest(), "big"))
    return tuple(chain)


class PrefixTable:
    """Which members were sent each block: an LRU of block hash → member names (most recent last)."""

    def __init__(self, capacity: int = _TABLE_BLOCKS) -> None:
        self.capacity = capacity
        self._members: OrderedDict[int, dict[str, None]] = OrderedDict()
        self._lock = threading.Lock()

    def depths(self, blocks: Sequence[int], names: Sequence[str]) -> dict[str, int]:
        """Per member, how many of the chain's leading blocks it was sent."""
        depth = dict.fromkeys(names, 0)
        alive = set(names)
        with self._lock:
            for i, block in enumerate(blocks):
                holders = self._members.get(block)
                if not holders:
                    break
                alive &= holders.keys()
                if not alive:
                    break
                for name in alive:
                    depth[name] = i + 1
        return depth

    def record(self, blocks: Sequence[int], name: str) -> None:
        """``name`` was sent this chain: it now holds (or will hold) every block of it."""
        with self._lock:
            for block in blocks:
                holders = self._members.setdefault(block, {})
                holders.pop(name, None)
                holders[name] = None
                self._members.move_to_end(block)
            while len(self._members) > self.capacity:
                self._members.popitem(last=False)


def rendezvous(key: object, name: str) -> int:
    """``name``'s score for ``key`` (rendezvous hashing: the highest scores ``key``'s member, and
    a member that leaves moves only the keys it scored highest)."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest(), "big")


def load_limit(members: Sequence[Member], bound: float) -> int:
    """The most calls one member may hold after taking this one: ``bound`` times the mean, the
    mean counted as at least one call (at low load a member with a call in flight may take
    another rather than send a cached prefix to a cold member: a queue of one costs less than a
    prefill)."""
    mean = (sum(m.in_flight for m in members) + 1) / len(members)
    return math.ceil(bound * max(1.0, mean))


def place(members: Sequence[Member], blocks: Sequence[int], table: PrefixTable, bound: float) -> Member:
    """The member for a call whose prompt is ``blocks`` (see the module's docstring)."""
    depth = table.depths(blocks, [m.name for m in members])
    home = blocks[0] if blocks else 0
    ranked = sorted(members, key=lambda m: (-depth[m.name], m.in_flight, -rendezvous(home, m.name)))
    limit = load_limit(members, bound)
    for member in ranked:
        if member.in_flight + 1 <= limit:
            return member
    return min(ranked, key=lambda m: m.in_flight)  # unreachable with bound >= 1; kept for safety
