"""Embeddings under the same contract: client-side batches, each one a stoppable step.

Between batches the stop is checked against its sources (rule 7's instant): a stop there raises
``GenerationCancelledError`` whose ``partial_embeddings`` holds every vector finished so far, in
input order. A stop inside a batch severs that request like any other; an in-process engine may
hand back the inputs it finished before it saw the flag, and those are kept too. Any other
error keeps the finished vectors as well (rule 8).
"""

from __future__ import annotations

import time

from ..errors import ProviderProtocolError
from ..types import EmbeddingResult, Usage
from .admission import admit, release
from .call import Call
from .run import with_retries
from .scope import step
from .translate import attach, cancelled, judge_complete

__all__ = ["run_embedding"]


async def run_embedding(call: Call, texts: list[str], *, batch_size: int, dimensions: int | None) -> EmbeddingResult:
    """An embedding call under the contract: one step per batch, the stop checked between batches; a
    stop keeps the finished vectors (``partial_embeddings``)."""
    progress = call.progress
    vectors: list[list[float]] = []
    progress.vectors = vectors  # before admission: a pre-set stop reports [] finished, not None
    await admit(call)
    clean = False
    prompt_tokens: int | None = None
    try:
        for start in range(0, len(texts), batch_size):
            if start and call.token.requested():
                raise cancelled(call)  # between batches: nothing more is sent
            batch = texts[start : start + batch_size]
            answer = await step(
                call,
                lambda b=batch: with_retries(
                    call, lambda: call.provider.embed(b, call.ctx, model=call.sent_request.model, dimensions=dimensions)
                ),  # type: ignore[misc]
                "first",
            )
            if len(answer.vectors) > len(batch) or (len(answer.vectors) < len(batch) and not call.token.is_set):
                raise attach(
                    call,
                    ProviderProtocolError(f"{len(batch)} inputs, {len(answer.vectors)} vectors in the answer"),
                )
            vectors.extend(answer.vectors)
            progress.model = answer.model or progress.model
            if answer.usage is not None and answer.usage.prompt_tokens is not None:
                prompt_tokens = (prompt_tokens or 0) + answer.usage.prompt_tokens
            progress.usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=0)
        if not judge_complete(call):
            raise cancelled(call)
        clean = True
        return EmbeddingResult(
            vectors=vectors,
            model=progress.model or call.sent_request.model,
            usage=progress.usage,
            provider=call.provider.name,
            request_id=call.request_id,
            total_ms=(time.perf_counter() - call.t0) * 1000,
        )
    finally:
        release(call, clean=clean)
