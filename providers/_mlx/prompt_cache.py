"""The MLX lane's prompt cache, one per loaded model, shared by the serial and the batch engine.

A bounded (bytes, LRU) store of KV caches keyed by the exact tokens they hold: the next turn of
a chat, a Regenerate or a repeat starts from the longest cached prefix (mlx-lm's
``LRUPromptCache`` does the prefix search, the copies and the eviction). What makes it ours:

* **A stop keeps its work.** :meth:`keep` stores whatever prefix a KV cache really holds — the
  prompt chunks that completed before a stop in prefill, or the prompt plus exactly the tokens
  handed out before a stop in decode. mlx-lm decodes one token ahead (the token sampled when the
  flag was seen was already fed to the model), so the cache is trimmed back to what the user saw.
* **Keyed by the load.** Entries are keyed by the model *as loaded* (``MLXModel.key`` changes on
  every load), and an eject drops them all: a reload never reuses KV computed by other weights.
* **One thread.** Every method runs on the model's MLX thread (MLX arrays are thread-bound);
  only :attr:`nbytes` and ``len()`` may be read from elsewhere (plain integers).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["PromptCache"]

log = logging.getLogger(__name__)


class PromptCache:
    """The model's prompt cache (mlx-lm's LRU), bounded in bytes: what a request finds of its prompt,
    and what it leaves."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("prompt_cache_bytes must be >= 0 (0 turns the prompt cache off)")
        self.max_bytes = max_bytes
        self._lru: Any = None  # mlx-lm's LRUPromptCache, made on first use (MLX imported lazily)
        self.nbytes = 0
        self.entries = 0
        self.last_kept = 0  # tokens the latest keep() stored (evidence for tests and benchmarks)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return self.entries

    def fetch(self, key: str, prompt: list[int]) -> tuple[Any, list[int]]:
        """``(KV cache to start from or None, the prompt tokens still to prefill)``. At least one
        token is always left to prefill: the first sampled token needs the last prompt token's
        logits, which a cache does not keep."""
        if not self.enabled or self._lru is None or not prompt:
            return None, prompt
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        cache, rest = self._lru.fetch_nearest_cache(key, prompt)
        if cache is not None and not rest:  # the whole prompt is cached: recompute its last token
            if not can_trim_prompt_cache(cache):
                return None, prompt
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        return cache, list(rest)

    def keep(self, key: str, tokens: list[int], cache: Any) -> int:
        """Store ``cache`` (the KV of a prefix of ``tokens``) under the prefix it really holds,
        trimmed to ``tokens`` when it holds more. Returns the number of tokens kept (0: nothing
        stored — the cache is off, empty, or cannot be trimmed back to what was handed out)."""
        self.last_kept = 0
        if not self.enabled or not cache or not tokens:
            return 0
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        held = _offset(cache)
        if held > len(tokens):
            if not can_trim_prompt_cache(cache):
                return 0  # a rotating cache past its window: its extra token cannot be undone
            trim_prompt_cache(cache, held - len(tokens))
            held = len(tokens)
        if held <= 0:
            return 0
        if self._lru is None:
            from mlx_lm.models.cache import LRUPromptCache

            self._lru = LRUPromptCache(max_size=1 << 16, max_bytes=self.max_bytes)
        self._lru.insert_cache(key, list(tokens[:held]), cache)
        self.nbytes, self.entries = int(self._lru.nbytes), len(self._lru)
        self.last_kept = held
        return held

    def clear(self) -> None:
        """Drop every entry (eject): their arrays go with the weights."""
        self._lru = None
        self.nbytes = self.entries = 0


def _offset(cache: list[Any]) -> int:
    """How many tokens a model's KV cache holds (every layer holds the same number)."""
    return int(getattr(cache[0], "offset", 0) or 0)
