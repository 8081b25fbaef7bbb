"""The "gguf" lane: a GGUF model in process through llama-cpp-python, on one engine thread.

``Llama.create_chat_completion`` cannot be stopped where it matters: it evaluates the prompt in
``n_batch`` slices inside one call, and even the next-token check of a streaming loop leaves a
whole slice (seconds for a long prompt on a CPU) to run after the stop. So this lane drives the
context itself, over llama-cpp-python's low-level API:

* **Prefill** one ``n_batch`` slice per ``llama_decode``, the stop checked between slices;
* **Inside a slice**: the context's abort callback (``_gguf/model.py``) reads the request's stop
  flag after every graph node, so a stop lands inside the evaluation; ``llama_decode`` returns 2
  and the context keeps only what was complete before;
* **Decode** one token per ``llama_decode``; the stop is checked before every step and again
  after sampling, before the token is counted or handed out (``RequestStats`` is the evidence).

The context keeps its KV between requests: the next request reuses the longest common prefix
(the conversation so far, or the prompt of a Regenerate after a Stop), reported as
``usage.cached_tokens``. Eject: running calls stop (``model_eject``), the engine thread drains,
then the contexts and weights are closed under the lock that every ``llama_decode`` holds — a
close can never free under an evaluation. The next call reloads (with a WARNING).
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from abstract_client.provider import UnloadReport
from abstract_client.stopping.token import Step, StopToken
from abstract_client.types import GenerationRequest, StreamChunk, Timings, Usage

from ._engine import EngineProvider, EngineStop, Failure, RequestStats
from ._gguf.model import GGUFModel
from ._hf.detok import Detokenizer
from ._memory import unload_measuring_rss
from ._step import TokenStep

__all__ = ["GGUFProvider"]

log = logging.getLogger(__name__)


class GGUFProvider(EngineProvider):
    """The ``gguf`` lane: llama.cpp in this process (see the module docstring)."""

    name = "gguf"
    call_options = MappingProxyType(
        {
            "n_batch": "prompt tokens per prefill decode (a stop is checked between them)",
            "repetition_context_size": "how many recent tokens the repetition penalty looks at",
        }
    )
    handle: GGUFModel
    model_is_file = True
    default_embed_batch_size = 16

    def __init__(
        self,
        *,
        model: str | None = None,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        flash_attn: bool = True,
        abort_callback: bool = True,
        default_max_tokens: int = 512,
        **options: Any,
    ) -> None:
        """``model``: a ``.gguf`` file. ``n_batch``: the prompt slice one ``llama_decode``
        evaluates (the stop is checked between slices, and inside one through the abort
        callback). ``n_threads``: default every CPU. ``flash_attn``: on, as llama-server's ``auto``
        chooses on a CPU (so both lanes compute the same numbers). ``abort_callback=False`` leaves the stop
        between slices only (measured in ``benchmarks/bench_gguf.py``)."""
        if n_batch < 1 or n_ctx < 2:
            raise ValueError("n_batch must be >= 1 and n_ctx >= 2")
        super().__init__(model=model, kind="GGUF", weights="*.gguf")
        self.handle = GGUFModel(
            self.path,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=n_threads,
            n_gpu_layers=n_gpu_layers,
            flash_attn=flash_attn,
            abort_callback=abort_callback,
            default_max_tokens=default_max_tokens,
            options=options,
        )
        self._phase = "prefill"

    # -- on the engine thread -----------------------------------------------------------------------

    def _generate(
        self, request: GenerationRequest, token: StopToken, stats: RequestStats, emit: Callable[[object], None]
    ) -> None:
        if token.is_set:
            return
        handle = self.handle
        flag = ctypes.create_string_buffer(2)  # this request's stop, as the abort callback reads it
        with handle.lock:  # every llama.cpp call of this request; a close waits for it
            self._run(request, token, stats, emit, flag)

    def _run(
        self,
        request: GenerationRequest,
        token: StopToken,
        stats: RequestStats,
        emit: Callable[[object], None],
        flag: ctypes.Array[ctypes.c_char],
    ) -> None:
        handle = self.handle
        handle.flag = flag  # a close() from another thread aborts through it from now on
        unhook: Callable[[], None] | None = None
        try:
            self._load_on_thread()
            ids = handle.prompt_ids(request)
            n_ctx = handle.llm.n_ctx()
            if len(ids) >= n_ctx:
                emit(
                    Failure(
                        "ContextOverflow",
                        f"the prompt has {len(ids)} tokens; the context holds {n_ctx} (n_ctx)",
                        n_prompt_tokens=len(ids),
                        n_ctx=n_ctx,
                    )
                )
                return
            extra = handle.extra(request)
            sampler = handle.sampler(request, extra, ids)
            assert handle.text is not None
            reuse = handle.reuse_prefix(ids)
            detok = Detokenizer(handle.text)
            step = TokenStep(
                request,
                stats,
                emit,
                tokenizer=handle.text,
                prompt_ids=ids,
                first_usage=Usage(prompt_tokens=len(ids), cached_tokens=reuse),
                max_tokens=request.max_tokens or handle.default_max_tokens,
                flush=detok.flush,
            )
            chunk = min(int(extra.get("n_batch", handle.n_batch)), handle.n_batch)  # one ubatch per decode
            stats.prompt_tokens, stats.cached_tokens = len(ids), reuse
            stats.prefill_total, stats.prefill_done = len(ids), reuse
            handle.arm(flag)
            unhook = token.add_hook(lambda: ctypes.memset(flag, 1, 1), step=Step.SEVER)
            t0 = time.perf_counter()
            self._phase = "prefill"
            for start in range(reuse, len(ids), chunk):
                if token.is_set:  # between slices
                    raise EngineStop
                end = min(start + chunk, len(ids))
                handle.decode(ids[start:end])  # a stop inside the slice raises EngineStop
                stats.prefill_done = end
            t_prefill = time.perf_counter()
            self._phase = "decode"
            finish: str | None = None
            while finish is None:
                if token.is_set:  # before every decode step
                    raise EngineStop
                chosen = int(sampler.sample(handle.llm._ctx, -1))
                if token.is_set:  # sampled under the flag: never counted, never handed out
                    raise EngineStop
                if handle.is_end(chosen):  # EOS is never text
                    finish = step.take("", "stop")
                else:
                    full = handle.llm.n_tokens + 1 >= n_ctx  # the context holds no next token
                    finish = step.take(detok.add(chosen), "length" if full else None)
                if finish is None:
                    handle.decode([chosen])
            done = time.perf_counter()
            emit(
                StreamChunk(
                    finish_reason=finish,
                    usage=Usage(prompt_tokens=len(ids), completion_tokens=stats.tokens, cached_tokens=reuse),
                    timings=Timings(
                        prompt_ms=(t_prefill - t0) * 1000,
                        predicted_ms=(done - t_prefill) * 1000,
                        prompt_tokens_per_s=(len(ids) - reuse) / max(t_prefill - t0, 1e-9),
                        tokens_per_s=stats.tokens / max(done - t_prefill, 1e-9),
                    ),
                )
            )
            stats.finished = True
        except EngineStop:
            stats.stopped_in = self._phase
            stats.tokens_at_stop, stats.stopped_at = stats.tokens, time.perf_counter()
            if not token.is_set:  # aborted by a close() from another thread, not by a stop
                emit(Failure("ModelClosed", "the model was closed during the request"))
        except Exception as exc:  # a fresh record, never the exception: its traceback pins the context
            log.debug("gguf generation failed after %d tokens", stats.tokens, exc_info=True)
            emit(Failure(type(exc).__name__, str(exc)))
        finally:
            if unhook is not None:
                unhook()
            if handle.loaded:
                handle.arm(None)  # the flag dies with this request; the context must not point at it
            handle.flag = None

    def _embed_on_thread(
        self, texts: list[str], token: StopToken, stats: RequestStats
    ) -> tuple[list[list[float]], int]:
        """Mean-pooled, L2-normalised embeddings from a second context (embeddings on) over the
        same weights; the stop is checked before every input (a stop returns those done)."""
        self._load_on_thread()
        embedder = self.handle.ensure_embedder()
        vectors: list[list[float]] = []
        n_tokens = 0
        for text in texts:
            if token.is_set:
                stats.stopped_in, stats.tokens_at_stop = "embed", stats.tokens
                break
            n_tokens += len(embedder.tokenize(text.encode(), add_bos=True))
            with self.handle.lock:
                vector = embedder.embed(text, normalize=True)
            vectors.append([float(x) for x in vector])
            stats.tokens += 1
        return vectors, n_tokens

    def _unload_on_thread(self) -> UnloadReport:
        return unload_measuring_rss(self.name, self.handle)

    # -- the async side -------------------------------------------------------------------------------

    async def native_tools(self, request: GenerationRequest) -> bool:
        """No tool-call parser here: a forced call is carried as schema-constrained output."""
        return False
