"""llama-server's ``timings`` object (its chat, native and Responses routes send it; so do
servers built on it)."""

from __future__ import annotations

from typing import Any

from ..types import Timings, Usage

__all__ = ["timings_from", "usage_of_timings"]


def timings_from(obj: Any) -> Timings | None:
    if not isinstance(obj, dict):
        return None

    def num(key: str) -> float | None:
        value = obj.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return Timings(
        prompt_ms=num("prompt_ms"),
        predicted_ms=num("predicted_ms"),
        prompt_tokens_per_s=num("prompt_per_second"),
        tokens_per_s=num("predicted_per_second"),
    )


def usage_of_timings(obj: Any) -> Usage | None:
    """The server's own count so far, from a chunk's ``timings`` (llama-server sends them on every
    chunk with ``timings_per_token``): the prompt (processed + served from its cache) and the
    tokens decoded. None when they are not there."""
    if not isinstance(obj, dict):
        return None
    counts = [obj.get(k) for k in ("prompt_n", "cache_n", "predicted_n")]
    numbers = [n for n in counts if isinstance(n, int) and not isinstance(n, bool) and n >= 0]
    if len(numbers) != 3:
        return None
    prompt, cached, decoded = numbers
    return Usage(prompt_tokens=prompt + cached, completion_tokens=decoded, cached_tokens=cached)
