"""The "mlx" lane: mlx-lm in-process, on one dedicated thread per loaded model.

Nothing severs a socket here, so the stop is only as good as where it is checked: the request's
stop token (every request has one, so an eject can stop it) is checked in mlx-lm's
``prompt_progress_callback`` between prefill chunks and before every sampled token is emitted —
for streaming and non-streaming calls alike. On a stop the generator is closed in ``finally``
on the MLX thread, ``mx.synchronize()`` runs, and no exception object (whose traceback would pin
the model's memory) crosses the thread: the contract raises a fresh typed stop.

Prefill stops only between chunks of ``prefill_step_size`` tokens (default 32: on a CPU build of
MLX a 64-token chunk of SmolLM2-135M takes seconds; on Apple silicon a larger step is cheaper
and still fast to stop). The caller always gets the stop at once; the engine follows at the
chunk boundary.

Eject (``unload_model``): new calls wait, ours are stopped (``model_eject``) and drained; if a
decode is still running at the deadline, ``ModelBusyError`` and nothing is freed; else every
reference is dropped on the MLX thread, ``gc.collect()``, ``mx.clear_cache()``, and the report
carries ``mx.get_active_memory()`` before and after. The next call reloads (with a WARNING).

``max_batch_size > 1``: concurrent calls share decode steps (``_mlx/batch.py``), each with its
own stop; a stop removes only that sequence at the next batch step.

Both engines start from the model's prompt cache (``_mlx/prompt_cache.py``) and leave their KV in
it — completed or stopped: a stop keeps the prefill chunks done, or the prompt and the tokens
handed out, so Regenerate after a Stop does not prefill again.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from types import MappingProxyType
from typing import Any

from abstract_client.errors import (
    NotSupportedError,
)
from abstract_client.images import url_refused
from abstract_client.provider import UnloadReport
from abstract_client.stopping.token import StopToken
from abstract_client.types import GenerationRequest, StreamChunk, Timings, Usage

from ._engine import END, EngineProvider, EngineStop, Failure, RequestStats
from ._mlx.batch import BatchEngine, Sequence, runs_alone
from ._mlx.model import MLXModel
from ._mlx.vision import VisionModel, generate_with_images, is_vision_model, require_mlx_vlm
from ._shaping import held_back
from ._step import TokenStep

log = logging.getLogger(__name__)


class MLXProvider(EngineProvider):
    """The ``mlx`` lane: mlx-lm (and mlx-vlm) in this process (see the module docstring)."""

    name = "mlx"
    call_options = MappingProxyType(
        {"prefill_step_size": "prompt tokens per prefill chunk (a stop is checked between)"}
    )
    handle: MLXModel
    default_embed_batch_size = 16

    def __init__(
        self,
        *,
        model: str | None = None,
        prefill_step_size: int = 32,
        default_max_tokens: int = 512,
        max_kv_size: int | None = None,
        max_batch_size: int = 1,
        prompt_cache_bytes: int = 256 * 2**20,
        **options: Any,
    ) -> None:
        super().__init__(model=model, kind="MLX", weights="model*.safetensors", on_exit=_clear_streams)
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        vision = is_vision_model(self.path)
        if vision:
            require_mlx_vlm(self.path)
            if max_batch_size > 1:
                raise ValueError("a vision model runs one request at a time: max_batch_size must be 1")
            prompt_cache_bytes = 0  # an image's KV depends on its pixels, not the ids a cache is keyed by
        self.handle = (VisionModel if vision else MLXModel)(
            self.path,
            prefill_step_size=prefill_step_size,
            default_max_tokens=default_max_tokens,
            max_kv_size=max_kv_size,
            prompt_cache_bytes=prompt_cache_bytes,
            options=options,
        )
        # max_batch_size=1: the serial engine (one stream_generate at a time); more: continuous
        # batching (_mlx/batch.py). Both share the model's prompt cache (_mlx/prompt_cache.py).
        self.batch = (
            None if max_batch_size == 1 else BatchEngine(self.handle, self.thread, max_batch_size=max_batch_size)
        )

    # -- on the MLX thread --------------------------------------------------------------------------

    def _generate(
        self, request: GenerationRequest, token: StopToken, stats: RequestStats, emit: Callable[[object], None]
    ) -> None:
        import mlx.core as mx

        try:
            if token.is_set:
                return
            if isinstance(self.handle, VisionModel):
                generate_with_images(self.handle, request, token, stats, emit)
            else:
                self._generate_text(request, token, stats, emit)
        except EngineStop:
            stats.tokens_at_stop, stats.stopped_at = stats.tokens, time.perf_counter()
        except Exception as exc:  # a fresh record, never the exception: its traceback pins the model
            emit(Failure(type(exc).__name__, str(exc)))
        finally:
            mx.synchronize()

    def _generate_text(
        self, request: GenerationRequest, token: StopToken, stats: RequestStats, emit: Callable[[object], None]
    ) -> None:
        from mlx_lm import stream_generate
        from mlx_lm.models.cache import make_prompt_cache

        gen = kv = None
        handle = self.handle
        ids: list[int] = []
        handed_out: list[int] = []  # token ids counted and passed on: what the KV may keep
        try:
            model, tokenizer = handle.ensure_loaded()
            ids = handle.prompt_ids(request)
            extra = handle.extra(request)
            # a repetition penalty looks back over the prompt's last tokens, which a cache hit
            # would hide from it: such a request prefills all of its prompt (and still keeps it)
            if extra.get("repetition_penalty") is None:
                kv, rest = handle.prompt_cache.fetch(handle.key, ids)
            else:
                rest = ids
            cached = len(ids) - len(rest)
            stats.prompt_tokens, stats.cached_tokens = len(ids), cached
            if kv is None:
                kv = make_prompt_cache(model, max_kv_size=handle.max_kv_size)

            def on_prefill(done: int, total: int) -> None:
                stats.prefill_done, stats.prefill_total = done, total
                if token.is_set:  # between prefill chunks: the only place prefill can stop
                    stats.stopped_in = "prefill"
                    raise EngineStop

            processors = handle.logits_processors(request, len(rest))  # the grammar is shown `rest`
            max_tokens = request.max_tokens or handle.default_max_tokens
            # stream_generate's detokenizer is its own: this one sees the counted tokens, for the
            # text a stop's partial text must not lose (what the detokenizer still holds back)
            counted = tokenizer.detokenizer
            step = TokenStep(
                request,
                stats,
                emit,
                tokenizer=tokenizer,
                prompt_ids=ids,
                first_usage=Usage(prompt_tokens=len(ids), cached_tokens=cached),
                max_tokens=max_tokens,
                held=lambda: held_back(counted),
            )
            gen = stream_generate(
                model,
                tokenizer,
                rest,
                max_tokens=max_tokens,
                sampler=handle.sampler(request),
                logits_processors=processors,
                prefill_step_size=extra.get("prefill_step_size", handle.prefill_step_size),
                prompt_progress_callback=on_prefill,
                prompt_cache=kv,
            )
            for resp in gen:
                if token.is_set:  # before every sampled token is emitted
                    stats.stopped_in = "decode"
                    raise EngineStop
                handed_out.append(int(resp.token))
                if resp.finish_reason is None:
                    counted.add_token(int(resp.token))
                # the final response's text carries the detokenizer's flush (and no EOS text)
                finish = step.take(resp.text, resp.finish_reason)
                if finish is not None:
                    emit(
                        StreamChunk(
                            finish_reason=finish,
                            usage=Usage(prompt_tokens=len(ids), completion_tokens=stats.tokens, cached_tokens=cached),
                            timings=Timings(prompt_tokens_per_s=resp.prompt_tps, tokens_per_s=resp.generation_tps),
                        )
                    )
                    stats.finished = True
                    break
        except EngineStop:
            raise  # a stop keeps its KV (below)
        except Exception:
            kv = None  # whatever failed, its KV is not kept
            raise
        finally:
            if gen is not None:
                gen.close()  # on this thread: mlx streams are thread-bound
            del gen
            if kv is not None and ids:
                # completed or stopped, what was computed stays: the prompt chunks done, the
                # prompt and the tokens handed out (trimmed to them)
                handle.prompt_cache.keep(handle.key, ids + handed_out, kv)
            del kv

    def _embed_on_thread(
        self, texts: list[str], token: StopToken, stats: RequestStats
    ) -> tuple[list[list[float]], int]:
        """The model's final (normed) hidden states, mean-pooled over the input's tokens and
        L2-normalised (as llama-server's ``--pooling mean`` does); the stop is checked before
        every input, so a stop returns the inputs finished so far."""
        import mlx.core as mx

        model, tokenizer = self.handle.ensure_loaded()
        body = getattr(model, "model", None)
        if body is None:
            raise NotSupportedError(f"{type(model).__name__} exposes no hidden states", provider=self.name)
        vectors: list[list[float]] = []
        n_tokens = 0
        for text in texts:
            if token.is_set:
                stats.stopped_in, stats.tokens_at_stop = "embed", stats.tokens
                break
            ids = list(tokenizer.encode(text)) or [int(tokenizer.eos_token_id or 0)]
            hidden = body(mx.array([ids]))[0].astype(mx.float32)  # (tokens, hidden size)
            pooled = mx.mean(hidden, axis=0)
            pooled = pooled / mx.maximum(mx.linalg.norm(pooled), 1e-12)
            values: Any = pooled.tolist()  # evaluates on this thread
            vectors.append([float(x) for x in values])
            n_tokens += len(ids)
            stats.tokens += 1
        mx.synchronize()
        return vectors, n_tokens

    def _unload_on_thread(self) -> UnloadReport:
        import mlx.core as mx

        before = mx.get_active_memory()
        if self.batch is not None:
            self.batch.clear()  # the generator goes with the weights (the prompt cache: in drop)
        self.handle.drop()
        gc.collect()
        mx.synchronize()
        mx.clear_cache()
        after = mx.get_active_memory()
        return UnloadReport(
            server_unloaded=True,
            memory_before=before,
            extra={"memory_baseline": self.handle.memory_baseline},
            memory_after=after,
            detail=f"mlx: active memory {before / 2**20:.1f} MiB → {after / 2**20:.1f} MiB",
        )

    # -- the async side -------------------------------------------------------------------------------

    def _start(
        self, request: GenerationRequest, token: StopToken, stats: RequestStats, emit: Callable[[object], None]
    ) -> Future[None] | None:
        # max_batch_size > 1: the batch, except requests it cannot honour exactly (run alone)
        if self.batch is None:
            return super()._start(request, token, stats, emit)
        if runs_alone(request, self.handle.options):
            return self.batch.alone(lambda: self._job(request, token, stats, emit))
        self.batch.submit(Sequence(request, token, stats, emit, end=END))
        return None

    async def images_refused(self, request: GenerationRequest) -> str | None:
        if isinstance(self.handle, VisionModel):
            return url_refused(request.messages, self.name)
        return (
            f"{self.path.name} is a text model (its config.json has no vision_config): "
            "load a vision model (mlx-vlm, the 'vlm' extra) for image parts"
        )

    async def native_tools(self, request: GenerationRequest) -> bool:
        """The tokenizer's chat template has tool calling (mlx-lm's tool parsers read the calls);
        mlx-lm cannot force a call, so a forced one is carried as constrained output."""
        if request.raw or request.tool_choice not in (None, "auto", "none"):
            return False

        def has_tool_calling() -> bool:
            return bool(self.handle.ensure_loaded()[1].has_tool_calling)

        return await self.thread.run(has_tool_calling)


def _clear_streams() -> None:
    try:
        import mlx.core as mx
    except ImportError:  # pragma: no cover
        return
    mx.clear_streams()  # without it the process can abort at exit (streams are thread-bound)
