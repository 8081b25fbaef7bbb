"""The loaded MLX model as both engines see it (the serial one in ``mlx.py``, the batch in
``batch.py``): loaded, used and dropped on the MLX thread only. It is the narrow handle the
engines share, so neither reaches into the other (or into the provider)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from abstract_client.types import GenerationRequest

from .._shaping import GrammarProcessor, chat_messages
from .prompt_cache import PromptCache

__all__ = ["MLXModel"]

log = logging.getLogger(__name__)


class MLXModel:
    """The MLX lane's model handle: weights and tokenizer (loaded on the MLX thread), samplers, logits
    processors, the prompt cache."""

    def __init__(
        self,
        path: Path,
        *,
        prefill_step_size: int,
        default_max_tokens: int,
        max_kv_size: int | None,
        prompt_cache_bytes: int,
        options: dict[str, Any],
    ) -> None:
        self.path = path
        self.prefill_step_size = prefill_step_size
        self.default_max_tokens = default_max_tokens
        self.max_kv_size = max_kv_size
        self.options = options  # create_llm's extra options: the defaults of every request
        self.model: Any = None
        self.tokenizer: Any = None
        self.lltokenizer: Any = None  # llguidance's view of the tokenizer, for response_format
        self.memory_baseline: int | None = None  # active memory before the model was loaded
        self.ejected = False
        self.loads = 0
        # both engines' prompt cache: on the MLX thread only, dropped with the weights
        self.prompt_cache = PromptCache(prompt_cache_bytes)

    @property
    def key(self) -> str:
        """What prompt-cache entries are keyed by: this model, as loaded (a reload is another
        key, so no entry computed by earlier weights is ever reused)."""
        return f"{self.path}#{self.loads}"

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def ensure_loaded(self) -> tuple[Any, Any]:
        if self.model is None:
            import mlx.core as mx
            from mlx_lm import load

            if self.ejected:
                log.warning("mlx: reloading %s on demand after an eject", self.path)
            self.memory_baseline = mx.get_active_memory()
            loaded = load(str(self.path))
            self.model, self.tokenizer = loaded[0], loaded[1]
            self.ejected = False
            self.loads += 1
        return self.model, self.tokenizer

    def drop(self) -> None:
        """Forget the weights and every prompt-cache entry (the caller collects and clears
        MLX's cache)."""
        self.prompt_cache.clear()
        self.model = self.tokenizer = self.lltokenizer = None
        self.ejected = True

    def extra(self, request: GenerationRequest) -> dict[str, Any]:
        return {**self.options, **request.extra}

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        _, tokenizer = self.ensure_loaded()
        if request.raw:
            return list(tokenizer.encode(request.prompt or ""))
        kwargs: dict[str, Any] = {"add_generation_prompt": True}
        if request.tools:
            kwargs["tools"] = request.tools
        if request.reasoning is not None:
            kwargs["enable_thinking"] = request.reasoning is not False
        return list(tokenizer.apply_chat_template(chat_messages(request.messages), **kwargs))

    def sampler(self, request: GenerationRequest) -> Any:
        """mlx-lm's sampler for the request's temperature / top-p / min-p / top-k."""
        from mlx_lm.sample_utils import make_sampler

        extra = self.extra(request)
        return make_sampler(
            temp=request.temperature or 0.0,
            top_p=extra.get("top_p", 0.0),
            min_p=extra.get("min_p", 0.0),
            top_k=extra.get("top_k", 0),
        )

    def logits_processors(self, request: GenerationRequest, shown: int) -> list[Any]:
        """Seed mlx's RNG for the request and build its logits processors: ``logit_bias`` (JSON
        keys are strings), ``repetition_penalty``, and the ``response_format`` grammar, which is
        shown ``shown`` prompt tokens. mlx's RNG is global: requests with a seed run one at a time
        on the engine thread (the batch engine waits for them)."""
        import mlx.core as mx
        from mlx_lm.sample_utils import make_logits_processors

        if request.seed is not None:
            mx.random.seed(request.seed)
        extra = self.extra(request)
        bias = extra.get("logit_bias")
        processors: list[Any] = make_logits_processors(
            logit_bias={int(k): float(v) for k, v in bias.items()} if bias else None,
            repetition_penalty=extra.get("repetition_penalty"),
        )
        if request.response_format is not None:
            processors.append(self.grammar(request, shown))
        return processors

    def grammar(self, request: GenerationRequest, prompt_len: int) -> Any:
        """The constraining logits processor for ``response_format`` (llguidance's tokenizer is
        built once per loaded model: ~0.6 s for a 49k vocabulary)."""
        model, tokenizer = self.ensure_loaded()
        if self.lltokenizer is None:
            import llguidance.hf

            n_vocab = getattr(getattr(model, "args", None), "vocab_size", None)
            self.lltokenizer = llguidance.hf.from_tokenizer(tokenizer._tokenizer, n_vocab=n_vocab)
        fmt = request.response_format
        assert fmt is not None
        return GrammarProcessor(self.lltokenizer, fmt.schema, prompt_len=prompt_len)
