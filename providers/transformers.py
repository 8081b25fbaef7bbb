"""The "transformers" lane: a Hugging Face causal LM in process, on one engine thread.

``generate()`` cannot be stopped where it matters: it prefills the whole prompt before its decode
loop (stopping criteria run only inside that loop), and an exception in a generating thread
leaves a ``TextIteratorStreamer`` consumer blocked. So this lane drives the model itself:

* **Prefill** in chunks of ``prefill_step_size`` tokens (forward passes that fill a
  ``DynamicCache``), the stop checked between chunks;
* **Decode** one forward pass per token; the stop is checked before every step and again after
  sampling, before the token is counted or handed out — nothing is counted or handed out after
  the engine saw the flag (``RequestStats`` is the evidence);
* **Inside a forward pass** too: a pre-hook on every decoder layer raises the stop when the flag
  is set, so a long prefill chunk (or a slow decode step) ends at the next layer, not at the end
  of the pass. The request's KV cache is discarded with it.

Failures (an exception in the forward pass, out of memory, a bad token id) reach the caller as
typed errors with the partial text; the engine thread serves the next request. Eject: new calls
wait, running ones stop (``model_eject``), the thread drains, then the weights are dropped and
the memory given back (``gc.collect()`` and ``malloc_trim``); the report carries process RSS
before and after, and the baseline before the load. The next call reloads (with a WARNING).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from abstract_client.provider import UnloadReport
from abstract_client.stopping.token import StopToken
from abstract_client.types import GenerationRequest, StreamChunk, Timings, Usage

from ._engine import EngineProvider, EngineStop, Failure, RequestStats
from ._hf.detok import Detokenizer
from ._hf.model import HFModel
from ._hf.sampling import Sampler
from ._memory import unload_measuring_rss
from ._step import TokenStep

__all__ = ["TransformersProvider"]

log = logging.getLogger(__name__)


class TransformersProvider(EngineProvider):
    """The ``transformers`` lane: Hugging Face transformers in this process (see the module docstring)."""

    name = "transformers"
    call_options = MappingProxyType(
        {"prefill_step_size": "prompt tokens per prefill chunk (a stop is checked between)"}
    )
    handle: HFModel
    default_embed_batch_size = 16

    def __init__(
        self,
        *,
        model: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        prefill_step_size: int = 128,
        default_max_tokens: int = 512,
        **options: Any,
    ) -> None:
        if prefill_step_size < 1:
            raise ValueError("prefill_step_size must be >= 1")
        super().__init__(model=model, kind="Hugging Face", weights="*.safetensors")
        self.handle = HFModel(
            self.path,
            device=device,
            dtype=dtype,
            prefill_step_size=prefill_step_size,
            default_max_tokens=default_max_tokens,
            options=options,
            on_load=self._install_hooks,
        )
        self._running: StopToken | None = None  # the request on the engine thread, for the layer hooks
        self._phase = "prefill"
        self.forward_passes = 0  # every forward pass the engine started (evidence for tests)

    # -- on the engine thread -----------------------------------------------------------------------

    def _install_hooks(self, model: Any) -> None:
        for layer in _decoder_layers(model):
            layer.register_forward_pre_hook(self._layer_hook)

    def _layer_hook(self, module: Any, args: Any) -> None:
        """Before every decoder layer: the stop, inside a forward pass."""
        token = self._running
        if token is not None and token.is_set:
            raise EngineStop

    def _forward(self, ids: Any, cache: Any) -> Any:
        self.forward_passes += 1
        # transformers 5.25 renamed ``past_key_values`` to ``cache`` (the old name warns)
        kv = {self.handle.cache_argument: cache}
        return self.handle.model(input_ids=ids, use_cache=True, logits_to_keep=1, **kv)

    def _generate(
        self, request: GenerationRequest, token: StopToken, stats: RequestStats, emit: Callable[[object], None]
    ) -> None:
        if token.is_set:
            return
        try:
            import torch
            from transformers import DynamicCache

            self._load_on_thread()
            handle = self.handle
            model, tokenizer = handle.model, handle.tokenizer
            ids = handle.prompt_ids(request)
            extra = handle.extra(request)
            grammar = handle.grammar(request) if request.response_format is not None else None
            sampler = Sampler(request, extra, prompt_ids=ids, grammar=grammar, device=handle.device)
            detok = Detokenizer(tokenizer)
            step = TokenStep(
                request,
                stats,
                emit,
                tokenizer=tokenizer,
                prompt_ids=ids,
                first_usage=Usage(prompt_tokens=len(ids)),
                max_tokens=request.max_tokens or handle.default_max_tokens,
                flush=detok.flush,
            )
            chunk = int(extra.get("prefill_step_size", handle.prefill_step_size))
            prompt = torch.tensor(ids, device=handle.device)
            cache = DynamicCache(config=model.config)
            self._running = token
            t0 = time.perf_counter()
            with torch.inference_mode():
                # prefill: every prompt token but the last, in chunks (the last one starts decode)
                self._phase = "prefill"
                stats.prefill_total, stats.prompt_tokens = len(ids) - 1, len(ids)
                for start in range(0, len(ids) - 1, chunk):
                    if token.is_set:  # between prefill chunks
                        raise EngineStop
                    end = min(start + chunk, len(ids) - 1)
                    self._forward(prompt[start:end][None], cache)
                    stats.prefill_done = end
                t_prefill = time.perf_counter()
                self._phase = "decode"
                last = prompt[-1:]
                finish: str | None = None
                while finish is None:
                    if token.is_set:  # before every decode step
                        raise EngineStop
                    logits = self._forward(last[None], cache).logits[0, -1]
                    chosen = sampler.pick(logits)
                    if token.is_set:  # sampled under the flag: never counted, never handed out
                        raise EngineStop
                    sampler.consumed(chosen)
                    if chosen in handle.eos_ids:  # EOS is never text
                        finish = step.take("", "stop")
                    else:
                        finish = step.take(detok.add(chosen))
                    last = torch.tensor([chosen], device=handle.device)
            done = time.perf_counter()
            emit(
                StreamChunk(
                    finish_reason=finish,
                    usage=Usage(prompt_tokens=len(ids), completion_tokens=stats.tokens),
                    timings=Timings(
                        prompt_ms=(t_prefill - t0) * 1000,
                        predicted_ms=(done - t_prefill) * 1000,
                        prompt_tokens_per_s=len(ids) / max(t_prefill - t0, 1e-9),
                        tokens_per_s=stats.tokens / max(done - t_prefill, 1e-9),
                    ),
                )
            )
            stats.finished = True
        except EngineStop:
            stats.stopped_in = self._phase
            stats.tokens_at_stop, stats.stopped_at = stats.tokens, time.perf_counter()
        except Exception as exc:  # a fresh record, never the exception: its traceback pins tensors
            log.debug("transformers generation failed after %d tokens", stats.tokens, exc_info=True)
            emit(Failure(type(exc).__name__, str(exc)))
        finally:
            self._running = None

    def _embed_on_thread(
        self, texts: list[str], token: StopToken, stats: RequestStats
    ) -> tuple[list[list[float]], int]:
        """The model's final (normed) hidden states, mean-pooled over the input's tokens and
        L2-normalised; the stop is checked before every input (a stop returns those done)."""
        import torch

        self._load_on_thread()
        model, tokenizer = self.handle.model, self.handle.tokenizer
        body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        vectors: list[list[float]] = []
        n_tokens = 0
        with torch.inference_mode():
            for text in texts:
                if token.is_set:
                    stats.stopped_in, stats.tokens_at_stop = "embed", stats.tokens
                    break
                ids = list(tokenizer.encode(text, add_special_tokens=False)) or [int(tokenizer.eos_token_id or 0)]
                hidden = body(input_ids=torch.tensor([ids], device=self.handle.device)).last_hidden_state[0]
                pooled = torch.nn.functional.normalize(hidden.float().mean(dim=0), dim=0)
                vectors.append([float(x) for x in pooled.tolist()])
                n_tokens += len(ids)
                stats.tokens += 1
        return vectors, n_tokens

    def _unload_on_thread(self) -> UnloadReport:
        return unload_measuring_rss(self.name, self.handle)

    # -- the async side -------------------------------------------------------------------------------

    async def native_tools(self, request: GenerationRequest) -> bool:
        """No tool-call parser here: a forced call is carried as schema-constrained output."""
        return False


def _decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a causal LM (``model.model.layers`` for Llama-likes)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        log.warning("transformers: no decoder layers found on %s; the stop lands between passes", type(model).__name__)
        return []
    return list(layers)
