"""The stop contract: the ONE place every generation passes through.

Sync and async, streaming and non-streaming, retries and structured output all run through
:func:`run_generation` or :class:`GenerationStream` (the sync API drives these same coroutines on
a loop thread). The rules, in order:

1. A stop already requested → ``GenerationCancelledError`` before a byte is sent.
2. The call is registered in flight, so ``cancel(id)``, ``cancel_all()`` and eject can reach it.
3. Every await on the backend runs in a cancel scope that the stop token cancels from any thread;
   for private connections the token also severs the socket (``http/guard.py``).
4. Any failure while the stop is requested is reported as the stop (the failure chained).
5. A framework cancellation from outside (``Task.cancel()``, an enclosing cancel scope) severs the
   connection and is re-raised unchanged.
6. Never retry a stop or a timeout; a backoff sleep ends at once on stop.
7. A stop requested before the result is handed over wins over the result: a cancelled
   generation is never returned as complete.
8. Every error carries the partial text, token count, usage, provider, model and request id.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import httpx

from ._loop import loop_caller
from .errors import (
    AbstractClientError,
    GenerationCancelledError,
    GenerationTimeoutError,
    ProviderProtocolError,
    TimeoutKind,
)
from .http.guard import SocketGuard, current_guard
from .http.mapping import map_transport_error
from .http.retry import RetryPolicy
from .provider import CallContext, Completion, Provider
from .stop import InflightRegistry, StopToken
from .types import GenerateResult, GenerationRequest, StreamChunk, Timeout, Timings, Usage

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(eq=False)
class Call:
    """One generation in flight: its stop token, limits and what it has produced so far."""

    provider: Provider
    request: GenerationRequest
    token: StopToken
    registry: InflightRegistry
    timeout: Timeout
    retry: RetryPolicy
    private: bool
    gate: threading.Event | None = None  # set while the LLM ejects its model: new calls wait
    ctx: CallContext = field(init=False)
    guard: SocketGuard | None = field(init=False, default=None)
    parts: list[str] = field(default_factory=list)
    chunks: int = 0
    usage: Usage | None = None
    server_timings: Timings | None = None
    model: str | None = None
    finish_reason: str | None = None
    t0: float = 0.0  # perf_counter at admission
    t0_loop: float = 0.0  # the loop's clock at admission (for cancel-scope deadlines)
    first_chunk_at: float | None = None
    last_chunk_loop: float | None = None
    admitted: bool = False
    released: bool = False

    def __post_init__(self) -> None:
        if self.private and self.provider.clients is not None:
            self.guard = SocketGuard(self.token)
        self.ctx = CallContext(
            token=self.token,
            request_id=self.token.request_id,
            private=self.private,
            clients=self.provider.clients,
            connect_timeout=self.timeout.connect,
            on_chunk=lambda chunk: _record(self, chunk),
        )
        self.provider.bind_stop(self.token)

    @property
    def request_id(self) -> str:
        return self.token.request_id

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def generated_tokens(self) -> int:
        if self.usage is not None and self.usage.completion_tokens is not None:
            return self.usage.completion_tokens
        return self.chunks


# -- admission and release ------------------------------------------------------------------


async def _enter(call: Call) -> None:
    # A call made during an eject waits for it to finish (ejects are short and rare; polled so
    # that no per-loop state is needed), unless its own stop comes first.
    while call.gate is not None and call.gate.is_set() and not call.token.is_set:
        await anyio.sleep(0.005)
    if call.provider.clients is not None:
        await call.provider.clients.prepare()
    _admit(call)


def _admit(call: Call) -> None:
    if call.token.is_set:  # rule 1: nothing is sent
        _release(call)
        raise _cancelled(call)
    call.registry.add(call.token)
    call.admitted = True
    call.t0 = time.perf_counter()
    call.t0_loop = anyio.current_time()


def _release(call: Call) -> None:
    """Idempotent and synchronous (a stream's ``__del__`` calls it)."""
    if call.released:
        return
    call.released = True
    if call.guard is not None:
        call.guard.sever()  # a no-op when the connection was already closed normally
    call.registry.remove(call.token)
    call.token.release()


# -- one awaited step on the backend ----------------------------------------------------------


def _deadline(call: Call, phase: str) -> tuple[float, TimeoutKind]:
    limits: list[tuple[float, TimeoutKind]] = []
    t = call.timeout
    if t.total is not None:
        limits.append((call.t0_loop + t.total, "total"))
    if phase == "first" and t.first_token is not None:
        limits.append((call.t0_loop + t.first_token, "first_token"))
    if phase == "idle" and t.idle is not None and call.last_chunk_loop is not None:
        limits.append((call.last_chunk_loop + t.idle, "idle"))
    return min(limits) if limits else (math.inf, "total")


async def _step(call: Call, fn: Callable[[], Awaitable[T]], phase: str) -> T:
    """Await ``fn()`` inside a cancel scope that the stop token (any thread) and the phase's
    deadline can cancel; translate whatever comes out (rules 3-5)."""
    deadline, kind = _deadline(call, phase)
    call_soon = loop_caller()
    scope = anyio.CancelScope(deadline=deadline)
    remove_hook = call.token.add_hook(lambda: call_soon(scope.cancel))
    guard_reset = current_guard.set(call.guard)
    try:
        with scope:
            return await fn()
    except BaseException as exc:
        mapped = _translate(call, exc)
        if mapped is exc:
            raise
        raise mapped from exc
    finally:
        remove_hook()
        current_guard.reset(guard_reset)
    # Only reached when the scope swallowed its own cancellation: our stop, or the deadline.
    if call.token.is_set:
        raise _cancelled(call)
    if call.guard is not None:
        call.guard.sever()
    raise _attach(call, GenerationTimeoutError(f"{kind} timeout exceeded", kind=kind))


def _translate(call: Call, exc: BaseException) -> BaseException:
    if isinstance(exc, StopAsyncIteration):
        return exc
    if isinstance(exc, anyio.get_cancelled_exc_class()) or not isinstance(exc, Exception):
        # Rule 5: a cancellation that escaped our scope belongs to an outer one (or it is a
        # KeyboardInterrupt/SystemExit): sever the connection now and let it through unchanged.
        call.token.stop("user", internal=True)
        return exc
    if call.token.is_set and not call.token.internal:
        return _cancelled(call)  # rule 4
    if isinstance(exc, AbstractClientError):
        err = exc
    elif isinstance(exc, httpx.HTTPError):
        err = map_transport_error(exc)
    else:
        err = ProviderProtocolError(f"{call.provider.name} failed on unexpected input: {type(exc).__name__}: {exc}")
    if call.guard is not None:
        call.guard.sever()
    return _attach(call, err)


def _attach(call: Call, err: AbstractClientError) -> AbstractClientError:
    err.partial_text = err.partial_text or call.text
    err.generated_tokens = err.generated_tokens or call.generated_tokens
    err.usage = err.usage or call.usage
    err.provider = err.provider or call.provider.name
    err.model = err.model or call.model or call.request.model
    err.request_id = err.request_id or call.request_id
    return err


def stopped_error(call: Call) -> GenerationCancelledError:
    """The error a waiting sync caller raises the moment its stop is requested (rule 8 applies)."""
    return _cancelled(call)


def _cancelled(call: Call) -> GenerationCancelledError:
    token = call.token
    elapsed = None if token.stopped_at is None else (time.perf_counter() - token.stopped_at) * 1000
    err = GenerationCancelledError(
        f"generation stopped ({token.reason})",
        reason=token.reason or "user",
        cancel_to_stop_ms=elapsed,
        signal_reason=token.signal_reason,
    )
    return _attach(call, err)  # type: ignore[return-value]


async def _retry_or_raise(call: Call, err: BaseException, attempt: int) -> None:
    typed = err if isinstance(err, AbstractClientError) else _translate(call, err)
    if call.token.is_set or not call.retry.should_retry(typed, attempt):
        if typed is err:
            raise err
        raise typed from err
    delay = call.retry.delay(typed, attempt)
    log.warning("%s: retrying %s in %.2fs after %s", call.provider.name, call.request_id, delay, typed)
    await anyio.sleep(delay)


# -- non-streaming --------------------------------------------------------------------------


async def run_generation(call: Call) -> GenerateResult:
    await _enter(call)
    try:
        attempt = 0
        while True:
            try:
                completion: Completion = await _step(
                    call, lambda: call.provider.complete(call.request, call.ctx), "first"
                )
                break
            except AbstractClientError as err:
                await _step(call, lambda e=err, a=attempt: _retry_or_raise(call, e, a), "first")  # type: ignore[misc]
                attempt += 1
        call.parts = [completion.content]
        call.usage, call.model = completion.usage, completion.model or call.request.model
        call.finish_reason, call.server_timings = completion.finish_reason, completion.timings
        if call.token.is_set and not call.token.internal:
            raise _cancelled(call)  # rule 7
        return _result(call, raw=completion.raw)
    finally:
        _release(call)


def _result(call: Call, raw: Any = None) -> GenerateResult:
    now = time.perf_counter()
    st = call.server_timings or Timings()
    ttft = None if call.first_chunk_at is None else (call.first_chunk_at - call.t0) * 1000
    return GenerateResult(
        content=call.text,
        finish_reason=call.finish_reason,
        usage=call.usage,
        timings=Timings(
            ttft_ms=ttft if ttft is not None else st.ttft_ms,
            total_ms=(now - call.t0) * 1000,
            prompt_ms=st.prompt_ms,
            predicted_ms=st.predicted_ms,
            prompt_tokens_per_s=st.prompt_tokens_per_s,
            tokens_per_s=st.tokens_per_s,
        ),
        model=call.model or call.request.model,
        provider=call.provider.name,
        request_id=call.request_id,
        raw=raw,
    )


# -- streaming ------------------------------------------------------------------------------


async def _attempts(call: Call) -> AsyncGenerator[StreamChunk, None]:
    """The provider's stream, retried only before its first chunk. A module-level function on
    purpose: a bound method would tie the stream object into a reference cycle and delay its
    ``__del__`` (and so the socket sever on ``break``) to a GC pass."""
    attempt = 0
    while True:
        source = call.provider.stream(call.request, call.ctx)
        try:
            first = await source.__anext__()
        except StopAsyncIteration:
            return
        except Exception as err:
            await source.aclose()
            await _retry_or_raise(call, err, attempt)
            attempt += 1
            continue
        break
    async with aclosing(source):
        yield first
        async for chunk in source:
            yield chunk


class GenerationStream:
    """An async iterator of :class:`StreamChunk` that is also an async context manager.

    Nothing is sent until the first ``__anext__``. Leaving early — ``aclose()``, the ``async
    with`` block ending, or a ``break`` out of ``async for llm.astream(...)`` dropping the last
    reference — severs the connection at once; the server sees EOF without waiting for GC.
    After the end, :meth:`result` gives the whole answer as a ``GenerateResult``.
    """

    def __init__(self, call: Call) -> None:
        self._call = call
        self._source: AsyncGenerator[StreamChunk, None] | None = None
        self._state = "new"

    def __repr__(self) -> str:
        return f"<GenerationStream {self._call.request_id} {self._state}>"

    @property
    def request_id(self) -> str:
        return self._call.request_id

    @property
    def text(self) -> str:
        """Everything received so far."""
        return self._call.text

    @property
    def call(self) -> Call:
        return self._call

    def cancel(self, reason: Any = "user") -> None:
        """Stop this stream from any thread; the consumer gets ``GenerationCancelledError``."""
        self._call.token.stop(reason)

    def result(self) -> GenerateResult:
        if self._state != "done" or (self._call.finish_reason is None and not self._call.parts):
            raise RuntimeError("the stream has not finished")
        return _result(self._call)

    def __aiter__(self) -> GenerationStream:
        return self

    async def __aenter__(self) -> GenerationStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def __anext__(self) -> StreamChunk:
        call = self._call
        if self._state == "done":
            raise StopAsyncIteration
        if self._state == "new":
            self._state = "done"
            await _enter(call)
            self._state = "open"
            self._source = _attempts(call)
        source = self._source
        assert source is not None
        try:
            chunk = await _step(call, source.__anext__, "first" if call.first_chunk_at is None else "idle")
        except StopAsyncIteration:
            await self._finish()
            if call.token.is_set and not call.token.internal:
                raise _cancelled(call) from None
            raise
        except BaseException:
            await self._finish()
            raise
        _record(call, chunk)
        if call.token.is_set and not call.token.internal:
            await self._finish()
            raise _cancelled(call)  # rule 7: a stop wins over a chunk that raced it
        return chunk

    async def aclose(self) -> None:
        if self._state == "open":
            self._call.token.stop("user", internal=True)  # sever first: the server sees EOF now
            await self._finish()
        self._state = "done"

    async def _finish(self) -> None:
        self._state = "done"
        source, self._source = self._source, None
        try:
            if source is not None:
                with anyio.CancelScope(shield=True):
                    await source.aclose()
        except Exception:  # the connection is gone either way; the caller gets the real error
            log.debug("closing %s", self._call.request_id, exc_info=True)
        finally:
            _release(self._call)

    def __del__(self) -> None:
        # ``break`` out of ``async for``: no await possible here, but severing and releasing are
        # synchronous. The provider's generator is finalised later by the loop's asyncgen hooks.
        if getattr(self, "_state", "done") == "open":
            self._call.token.stop("user", internal=True)
            _release(self._call)


def _record(call: Call, chunk: StreamChunk) -> None:
    if chunk.delta:
        call.parts.append(chunk.delta)
        call.chunks += 1
        if call.first_chunk_at is None:
            call.first_chunk_at = time.perf_counter()
    call.last_chunk_loop = anyio.current_time()
    if chunk.finish_reason is not None:
        call.finish_reason = chunk.finish_reason
    if chunk.usage is not None:
        call.usage = chunk.usage
    if chunk.timings is not None:
        call.server_timings = chunk.timings
    if chunk.model:
        call.model = chunk.model
