"""The loaded transformers model, as the engine thread sees it: loaded, used and dropped on that
thread only, with the process's memory measured around it (RSS: the weights live in ordinary
process memory on the CPU, and in the CUDA allocator on a GPU)."""

from __future__ import annotations

import ctypes
import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from abstract_client.types import GenerationRequest

from .._memory import give_memory_back, rss_bytes
from .._shaping import chat_messages

__all__ = ["HFModel"]

log = logging.getLogger(__name__)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_MMAP_THRESHOLD = 128 * 1024  # glibc's own default


def keep_large_allocations_returnable() -> None:
    """Pin glibc's mmap threshold at its default (128 KiB). glibc raises it after the first large
    free (here: the checkpoint's tensors, freed as they are converted), so the weights allocated
    next land in the engine thread's malloc arena, which ``malloc_trim`` cannot give back: an
    eject then left ~100 MB of a 135M model resident. Pinned, every tensor of 128 KiB or more is
    its own mapping, returned to the OS when freed. (Process-wide, once; Linux with glibc only.)"""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        except (OSError, AttributeError):
            pass


class HFModel:
    """The transformers lane's model handle: weights, tokenizer, device, and the per-request options."""

    def __init__(
        self,
        path: Path,
        *,
        device: str | None,
        dtype: str | None,
        prefill_step_size: int,
        default_max_tokens: int,
        options: dict[str, Any],
        on_load: Callable[[Any], None],
    ) -> None:
        self.path = path
        self.device_name = device
        self.dtype_name = dtype
        self.prefill_step_size = prefill_step_size
        self.default_max_tokens = default_max_tokens
        self.options = options  # create_llm's extra options: the defaults of every request
        self._on_load = on_load  # the provider's stop hooks go in before any forward pass
        self.model: Any = None
        self.tokenizer: Any = None
        self.device: Any = None
        self.eos_ids: set[int] = set()
        self.cache_argument = "past_key_values"  # or "cache" (transformers >= 5.25)
        self.lltokenizer: Any = None  # llguidance's view of the tokenizer, for response_format
        self.rss_baseline: int | None = None  # process RSS before the load
        self.ejected = False

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def ensure_loaded(self) -> tuple[Any, Any]:
        if self.model is None:
            import torch
            import transformers
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if self.ejected:
                log.warning("transformers: reloading %s on demand after an eject", self.path)
            transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            keep_large_allocations_returnable()
            _import_model_class(self.path)
            # the baseline an eject is judged by: before the weights, after the code (Python never
            # unloads a module: the ~130 MB transformers imports for a model class stay)
            self.rss_baseline = rss_bytes()
            device = self.device_name or _default_device(torch)
            dtype: Any = self.dtype_name
            if dtype is None:  # float32 on a CPU (bf16 matmuls are slow on most), the checkpoint's elsewhere
                dtype = torch.float32 if device == "cpu" else "auto"
            elif dtype != "auto":
                dtype = getattr(torch, dtype)
            tokenizer = AutoTokenizer.from_pretrained(str(self.path))
            model: Any = AutoModelForCausalLM.from_pretrained(str(self.path), dtype=dtype)
            model = model.to(device).eval()
            if "cache" in inspect.signature(model.forward).parameters:
                self.cache_argument = "cache"
            self._on_load(model)
            self.model, self.tokenizer, self.device = model, tokenizer, torch.device(device)
            eos = model.generation_config.eos_token_id
            self.eos_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None}
            if tokenizer.eos_token_id is not None:
                self.eos_ids.add(int(tokenizer.eos_token_id))
            self.ejected = False
        return self.model, self.tokenizer

    def drop(self) -> None:
        """Forget the weights and give their memory back (on the engine thread, idle)."""
        on_gpu = self.device is not None and self.device.type == "cuda"
        self.model = self.tokenizer = self.lltokenizer = None
        self.ejected = True
        give_memory_back()
        if on_gpu:
            import torch

            torch.cuda.empty_cache()

    def extra(self, request: GenerationRequest) -> dict[str, Any]:
        return {**self.options, **request.extra}

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        _, tokenizer = self.ensure_loaded()
        if request.raw:
            return list(tokenizer.encode(request.prompt or "", add_special_tokens=True))
        kwargs: dict[str, Any] = {"add_generation_prompt": True}
        if request.tools:
            kwargs["tools"] = request.tools
        if request.reasoning is not None:
            kwargs["enable_thinking"] = request.reasoning is not False
        # the template's text, then the tokens: the template already has the special tokens
        text = tokenizer.apply_chat_template(
            chat_messages(request.messages, provider="transformers"), tokenize=False, **kwargs
        )
        return list(tokenizer.encode(text, add_special_tokens=False))

    def grammar(self, request: GenerationRequest) -> Any:
        """llguidance's matcher for ``response_format`` (its tokenizer view built once per load)."""
        from .._shaping import GrammarMask

        model, tokenizer = self.ensure_loaded()
        if self.lltokenizer is None:
            import llguidance.hf

            self.lltokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=model.config.vocab_size)
        fmt = request.response_format
        assert fmt is not None
        return GrammarMask(self.lltokenizer, fmt.schema, provider="transformers")


def _import_model_class(path: Path) -> None:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = AutoConfig.from_pretrained(str(path))
    MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)  # imports the modeling module


def _default_device(torch: Any) -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"
