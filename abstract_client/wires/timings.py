"""llama-server's ``timings`` object (its chat, native and Responses routes send it; so do
servers built on it)."""

from __future__ import annotations

from typing import Any

from ..types import Timings

__all__ = ["timings_from"]


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
