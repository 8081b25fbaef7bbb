"""Continuous batching for the MLX lane: mlx-lm's ``BatchGenerator`` driven on the one MLX thread.

Concurrent requests on one model share decode steps. Each keeps its own stop token: before
every ``next()`` (one decode step for the batch plus at most one prefill chunk) the loop removes
the sequences whose stop was requested (``remove(uid)``) — during prefill or decode — and their
consumers get the end at once; the others continue. A token is counted and handed out only after
its request's flag was checked, so nothing is sampled for a request after its flag was seen.

Prompt cache: the model's (``MLXModel.prompt_cache``, shared with the serial engine). A finished
request keeps its KV (prompt + answer); a stopped one keeps what it computed — the prefill chunks
done, or the prompt plus the tokens handed out (``remove(..., return_prompt_caches=True)``,
trimmed to them) — so a Regenerate or the next turn after a Stop starts from it
(``usage.cached_tokens``). ``clear()`` (on eject) drops the generator, on the MLX thread.

Requests the batch cannot honour exactly run alone, in order, on the same thread (the serial
engine): a ``seed`` with sampling (mlx's RNG is global: a per-request seed cannot hold inside a
shared step), and requests with logits processors (``response_format``, forced tool calls,
``logit_bias``, ``repetition_penalty``). Waiting for one of those pauses admissions to the batch
until it has run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from abstract_client.stopping.token import StopToken
from abstract_client.types import GenerationRequest, StreamChunk, Usage

from .._engine import EngineThread, Failure, RequestStats
from .._shaping import held_back
from .._step import TokenStep
from .model import MLXModel

__all__ = ["BatchEngine", "Sequence", "runs_alone"]

log = logging.getLogger(__name__)


def runs_alone(request: GenerationRequest, options: dict[str, Any]) -> bool:
    """True for a request the shared batch cannot honour exactly (see the module docstring)."""
    extra = {**options, **request.extra}
    sampled = bool(request.temperature)
    return (
        (request.seed is not None and sampled)
        or request.response_format is not None
        or bool(extra.get("logit_bias"))
        or extra.get("repetition_penalty") is not None
    )


@dataclass(eq=False)
class Sequence:
    """One request in the MLX batch: its stop token, record, emitter and token step."""

    request: GenerationRequest
    token: StopToken
    stats: RequestStats
    emit: Callable[[object], None]
    end: object
    uid: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prompt: list[int] = field(default_factory=list)
    handed_out: list[int] = field(default_factory=list)  # token ids counted and passed on
    decoding: bool = False
    step: TokenStep | None = None  # set once admitted to the batch
    detok: Any = None  # its own streaming detokenizer
    eos: frozenset[int] = frozenset()

    def prompt_usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens)


class BatchEngine:
    """Continuous batching on the MLX thread (see the module docstring)."""

    def __init__(self, model: MLXModel, thread: EngineThread, *, max_batch_size: int) -> None:
        self.model = model
        self.thread = thread
        self.max_batch_size = max_batch_size
        self._lock = threading.Lock()
        self._pending: deque[Sequence] = deque()
        self._active: dict[int, Sequence] = {}
        self._running = False
        self._alone_waiting = 0
        self._generator: Any = None

    # -- any thread ---------------------------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        with self._lock:
            self._pending.append(seq)
            start = not self._running
            self._running = True
        if start:
            self.thread.submit(self._loop)

    def alone(self, job: Callable[[], None]) -> Future[None]:
        """Run ``job`` (a serial generation) on the MLX thread once the batch has drained."""
        with self._lock:
            self._alone_waiting += 1

        def run() -> None:
            try:
                job()
            finally:
                with self._lock:
                    self._alone_waiting -= 1
                    restart = bool(self._pending) and not self._running and not self._alone_waiting
                    self._running = self._running or restart
                if restart:
                    self.thread.submit(self._loop)

        return self.thread.submit(run)

    # -- on the MLX thread --------------------------------------------------------------------------

    def clear(self) -> None:
        """Drop the generator (eject, or a failed step); the MLX thread, idle."""
        if self._generator is not None:
            self._generator.close()
        self._generator = None

    def _ensure_generator(self) -> Any:
        if self._generator is None:
            from mlx_lm.generate import BatchGenerator

            model, tokenizer = self.model.ensure_loaded()
            self._generator = BatchGenerator(
                model,
                stop_tokens=[[e] for e in tokenizer.eos_token_ids],
                max_tokens=self.model.default_max_tokens,
                completion_batch_size=self.max_batch_size,
                prefill_batch_size=self.max_batch_size,
                prefill_step_size=self.model.prefill_step_size,
                max_kv_size=self.model.max_kv_size,
            )
        return self._generator

    def _loop(self) -> None:
        import mlx.core as mx

        try:
            while True:
                # the stopped first: what a stop leaves in the prompt cache must be there before
                # the next request (a Regenerate sent at once) looks its prompt up
                self._remove_stopped()
                self._admit()
                if not self._active:
                    with self._lock:
                        if not self._pending or self._alone_waiting:
                            self._running = False
                            return
                    continue
                prompt_responses, generated = self._generator.next()
                for r in prompt_responses:
                    seq = self._active.get(r.uid)
                    if seq is not None:
                        seq.stats.prefill_done, seq.stats.prefill_total = r.progress
                for r in generated:
                    self._on_token(r)
        except Exception as exc:  # a fresh record for every waiting consumer, never the exception
            log.exception("mlx batch step failed")
            failed = list(self._active.values())
            with self._lock:
                failed += list(self._pending)
                self._pending.clear()
                self._running = False
            self._active.clear()
            self.clear()
            self.model.prompt_cache.clear()  # whatever failed may have left entries half-made
            for seq in failed:
                seq.emit(Failure(type(exc).__name__, str(exc)))
                seq.emit(seq.end)
        finally:
            mx.synchronize()

    def _admit(self) -> None:
        while len(self._active) < self.max_batch_size:
            with self._lock:
                if not self._pending or self._alone_waiting:
                    return
                seq = self._pending.popleft()
            if seq.token.is_set:  # stopped while queued: nothing was computed for it
                seq.stats.stopped_in = "queue"
                seq.stats.tokens_at_stop = 0
                seq.emit(seq.end)
                continue
            try:
                self._remove_stopped()  # a stop that came meanwhile: its KV kept before this lookup
                self._insert(seq)
            except Exception as exc:
                seq.emit(Failure(type(exc).__name__, str(exc)))
                seq.emit(seq.end)

    def _insert(self, seq: Sequence) -> None:
        generator = self._ensure_generator()
        _, tokenizer = self.model.ensure_loaded()
        request = seq.request
        prompt = self.model.prompt_ids(request)
        cache, rest = self.model.prompt_cache.fetch(self.model.key, prompt)
        (uid,) = generator.insert(
            [rest],
            max_tokens=[request.max_tokens or self.model.default_max_tokens],
            caches=[cache],
            all_tokens=[prompt[: len(prompt) - len(rest)]],
            samplers=[self.model.sampler(request)],
        )
        seq.uid = uid
        seq.prompt = prompt
        seq.prompt_tokens, seq.cached_tokens = len(prompt), len(prompt) - len(rest)
        seq.stats.prompt_tokens, seq.stats.cached_tokens = seq.prompt_tokens, seq.cached_tokens
        seq.stats.prefill_total = len(rest)
        detok = seq.detok = tokenizer.detokenizer
        seq.eos = frozenset(tokenizer.eos_token_ids)
        seq.step = TokenStep(
            request,
            seq.stats,
            seq.emit,
            tokenizer=tokenizer,
            prompt_ids=prompt,
            first_usage=seq.prompt_usage(),
            max_tokens=request.max_tokens or self.model.default_max_tokens,
            flush=lambda: _finalize(detok),
            held=lambda: held_back(detok),
        )
        self._active[uid] = seq

    def _remove_stopped(self) -> None:
        stopped = [uid for uid, seq in self._active.items() if seq.token.is_set]
        # (a stopped sequence's KV is kept here, so this runs before every admission)
        if not stopped:
            return
        # only these sequences; the others go on. Their KV is kept: the work a stop leaves behind
        # is what a Regenerate or the next turn starts from
        kept = self._generator.remove(stopped, return_prompt_caches=True)
        for uid in stopped:
            seq = self._active.pop(uid)
            if uid in kept:
                self._keep(seq, kept[uid][0])
            seq.stats.stopped_in = "decode" if seq.decoding else "prefill"
            seq.stats.tokens_at_stop, seq.stats.stopped_at = seq.stats.tokens, time.perf_counter()
            seq.emit(seq.end)

    def _on_token(self, r: Any) -> None:
        seq = self._active.get(r.uid)
        if seq is None:
            return
        if seq.token.is_set:  # checked before the token is counted or handed out
            self._remove_stopped()
            return
        seq.decoding = True
        seq.handed_out.append(int(r.token))
        assert seq.step is not None
        if r.token in seq.eos:
            piece = ""
        else:
            seq.detok.add_token(r.token)
            piece = seq.detok.last_segment
        finish = seq.step.take(piece, r.finish_reason)
        if finish is None:
            return
        if r.finish_reason is None:
            # ended here (a stop string): the generator does not know it
            kept = self._generator.remove([r.uid], return_prompt_caches=True)
            if r.uid in kept:
                self._keep(seq, kept[r.uid][0])
        elif r.prompt_cache is not None:
            self._keep(seq, r.prompt_cache)
        seq.emit(
            StreamChunk(
                finish_reason=finish,
                usage=replace(seq.prompt_usage(), completion_tokens=seq.stats.tokens),
            )
        )
        seq.stats.finished = True
        del self._active[r.uid]
        seq.emit(seq.end)

    def _keep(self, seq: Sequence, cache: Any) -> None:
        if cache is not None:
            self.model.prompt_cache.keep(self.model.key, seq.prompt + seq.handed_out, cache)


def _finalize(detok: Any) -> str:
    detok.finalize()
    return str(detok.last_segment)
