"""Rules 6 and 7 for non-streaming calls, and the same contract for model management.

The attempts and the backoff sleeps between them run inside ONE scope (``step``): a stop during
a backoff ends the sleep at once, is translated once, and is never retried (rule 6). A stop
requested before the result is handed over wins over the result (rule 7).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

import anyio

from ..errors import ProviderProtocolError
from ..http.wire import StreamRefusedError
from ..provider import Completion, served_by
from ..stopping.token import InflightRegistry, StopToken
from ..types import GenerateResult, GenerationRequest, StreamChunk, Timeout, Timings
from .admission import admit, release
from .answer import finish_output, prepare
from .call import Call, CallSpec
from .lifecycle import Event
from .retry import RetryPolicy
from .scope import step
from .translate import cancelled, classify, judge_complete

__all__ = ["complete", "first_answer", "operation_spec", "result_of", "run_generation", "run_operation", "with_retries"]

log = logging.getLogger(__name__)
T = TypeVar("T")


async def with_retries(call: Call, attempt_once: Callable[[], Awaitable[T]]) -> T:
    """``attempt_once()`` again while the failure is retryable by type and the stop is not set;
    the backoff sleeps in the caller's scope. Failures leave raw (the scope translates them once)."""
    policy: RetryPolicy = call.spec.retry
    attempt = 0
    while True:
        try:
            return await attempt_once()
        except Exception as exc:
            if call.token.is_set:
                raise
            typed = classify(call, exc)
            if not policy.should_retry(typed, attempt):
                raise
            delay = policy.delay(typed, attempt)
            log.warning(
                "%s: retrying %s in %.2fs after %s",
                call.provider.name,
                call.request_id,
                delay,
                typed,
                extra={"request_id": call.request_id},  # also from threads outside the call
            )
            call.handle(Event.RETRY, error=typed, attempt=attempt, delay=delay)
            await anyio.sleep(delay)
            attempt += 1


async def run_generation(call: Call) -> GenerateResult:
    """A non-streaming generation under the contract: admission, the answer in one stoppable step
    (retries inside), rule 7, the output parsed, release on every path."""
    await admit(call)
    clean = False
    try:
        completion: Completion = await step(call, lambda: first_answer(call), "first")
        if not judge_complete(call):
            raise cancelled(call)  # rule 7
        clean = True
        finish_output(call)  # only a complete answer is parsed and validated
        return result_of(call, raw=completion.raw)
    finally:
        release(call, clean=clean)


async def first_answer(call: Call) -> Completion:
    """The answer of the first attempt that succeeds (retried only while retryable and not stopped),
    recorded into the call's progress."""
    await prepare(call)
    completion = await with_retries(call, lambda: complete(call))
    progress = call.progress
    if progress.plain_route:  # a plain route's whole answer, recorded as one final chunk
        progress.restart()
        for piece in completion.tool_calls:
            progress.tools.feed(piece)
        progress.record(
            StreamChunk(
                delta=completion.content,
                reasoning=completion.reasoning or "",
                finish_reason=completion.finish_reason,
                usage=completion.usage,
                timings=completion.timings,
                model=completion.model or call.sent_request.model,
                raw=completion.raw,
            )
        )
    return completion


async def complete(call: Call) -> Completion:
    """One non-streaming attempt: the provider's plain route, or its streaming wire assembled
    here, into the same ``Completion`` (content, usage, timings, finish_reason, model)."""
    provider, request = call.provider, call.sent_request
    over_stream = provider.complete_over_stream and not provider.plain_by_default
    if provider.plain_route and not request.resumable and (not over_stream or request.plain_route):
        return await _complete_plain(call)
    try:
        return await _complete_over_stream(call)
    except StreamRefusedError:
        if not provider.plain_route or request.resumable or call.progress.text:
            raise
    # A server that answers ``stream: true`` with one JSON body: this lane's calls take its plain
    # route from now on (a stop then cannot keep the partial text: stop_error says so).
    log.warning("%s: the server does not stream; generate() uses its plain route", provider.name)
    provider.plain_by_default = True
    return await _complete_plain(call)


async def _complete_plain(call: Call) -> Completion:
    call.progress.plain_route = True
    return await call.provider.complete(call.sent_request, call.ctx)


async def _complete_over_stream(call: Call) -> Completion:
    provider, request = call.provider, call.sent_request
    progress = call.progress
    progress.restart()
    progress.plain_route = False
    last: StreamChunk | None = None
    source = provider.stream(request, call.ctx)
    async with aclosing(source):
        async for chunk in source:
            progress.record(chunk)  # a stop keeps the partial text, as for a stream
            last = chunk
    if last is None or progress.finish_reason is None:
        raise ProviderProtocolError(f"{provider.name}: the answer ended without a finish reason")
    return Completion(
        content=progress.text,
        finish_reason=progress.finish_reason,
        usage=progress.usage,
        timings=progress.server_timings,
        model=progress.model,
        raw=last.raw,
    )


def result_of(call: Call, raw: Any = None) -> GenerateResult:
    """The call's ``GenerateResult``, built from its progress (text, usage, timings, tool calls, parsed
    output)."""
    p = call.progress
    now = p.completed_at or time.perf_counter()
    st = p.server_timings or Timings()
    ttft = None if p.first_chunk_at is None else (p.first_chunk_at - call.t0) * 1000
    return GenerateResult(
        content=p.text,
        finish_reason=p.finish_reason,
        usage=p.usage,
        timings=Timings(
            ttft_ms=ttft if ttft is not None else st.ttft_ms,
            total_ms=(now - call.t0) * 1000,
            prompt_ms=st.prompt_ms,
            predicted_ms=st.predicted_ms,
            prompt_tokens_per_s=st.prompt_tokens_per_s,
            tokens_per_s=st.tokens_per_s,
        ),
        model=p.model or call.sent_request.model,
        provider=call.provider.name,
        request_id=call.request_id,
        raw=raw,
        completed_at=p.completed_at,
        tool_calls=list(p.tool_calls),
        parsed=p.parsed,
        reasoning=p.reasoning or None,
        member=served_by(call.provider, call.request_id),
    )


async def run_operation(
    spec: CallSpec,
    operation: Callable[[], Awaitable[T]],
    *,
    registry: InflightRegistry,
    request_id: str,
) -> T:
    """Model management (list, load, unload, readiness) under the same rules: stoppable by the
    caller's sources and by ``close()``, bounded by ``spec.timeout.total``, and raising only this
    library's errors (or the framework's cancellation)."""
    call = Call(spec, StopToken(request_id), registry)
    await admit(call)
    try:
        return await step(call, operation, "first")
    finally:
        release(call, clean=True)


def operation_spec(provider: Any, timeout: float | None, **sources: Any) -> CallSpec:
    """The spec of a model-management call (list, load, unload, readiness): the caller's stop sources,
    a total deadline, no retries."""
    return CallSpec(
        provider=provider,
        request=GenerationRequest(messages=[], model=provider.model),
        timeout=Timeout(total=timeout),
        retry=RetryPolicy(max_retries=0),
        **sources,
    )
