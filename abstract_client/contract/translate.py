"""Rules 4, 5 and 8: what the caller sees when something comes out of a backend.

* Rule 4: any failure while the stop is set IS the stop: one ``GenerationCancelledError``,
  translated once, never a stop wrapped in a stop. Its ``__cause__`` is that failure (the read
  the sever ended) when one surfaced; a stop that ended the wait before anything failed (a sync
  caller woken by the stop itself, a pre-set stop, a cancelled scope) has no cause.
* Rule 5: a framework cancellation (or KeyboardInterrupt/SystemExit) severs and passes unchanged.
* Rule 8: every error carries the partial text, token count, usage, provider, model, request id.
"""

from __future__ import annotations

import time

import anyio
import httpx

from ..errors import AbstractClientError, GenerationCancelledError, ProviderProtocolError
from ..http.mapping import map_transport_error
from ..provider import engine_record, served_by
from .call import Call
from .lifecycle import Event

__all__ = [
    "SyncStop",
    "as_typed",
    "attach",
    "cancelled",
    "classify",
    "judge_complete",
    "raise_translated",
    "stop_error",
    "translate",
]


def translate(call: Call, exc: BaseException) -> BaseException:
    """The exception to raise for ``exc``; ``exc`` itself when it passes unchanged."""
    if isinstance(exc, StopAsyncIteration):
        return exc
    if isinstance(exc, anyio.get_cancelled_exc_class()) or not isinstance(exc, Exception):
        # Rule 5: a cancellation that escaped our scope belongs to an outer one (or it is a
        # KeyboardInterrupt/SystemExit): sever the connection now and let it through unchanged.
        call.token.stop("user", internal=True)
        return exc
    if isinstance(exc, (GenerationCancelledError, SyncStop)):
        return exc  # already the stop: translated once, where it happened
    if call.token.stopped_by_caller:
        return cancelled(call)  # rule 4
    err = classify(call, exc)
    if call.guard is not None:
        call.guard.sever()
    return attach(call, err)


def classify(call: Call, exc: Exception) -> AbstractClientError:
    """The typed error for a failure that is not a stop."""
    return as_typed(exc, call.provider.name)


def as_typed(exc: Exception, source: str) -> AbstractClientError:
    """``exc`` as this library's error: itself, a transport failure mapped, or a protocol error
    naming ``source`` (a provider, a fleet member)."""
    if isinstance(exc, AbstractClientError):
        return exc
    if isinstance(exc, httpx.HTTPError):
        return map_transport_error(exc)
    return ProviderProtocolError(f"{source} failed on unexpected input: {type(exc).__name__}: {exc}")


def raise_translated(call: Call, exc: BaseException) -> None:
    """Raise what ``exc`` becomes, chained to it (``from exc``) when it is a new error."""
    mapped = translate(call, exc)
    if mapped is exc:
        raise exc
    raise mapped from exc


def attach(call: Call, err: AbstractClientError) -> AbstractClientError:
    """Rule 8: fill ``err`` with what the call produced (partial text, tokens, usage, reasoning, tool
    calls, vectors) and where (provider, model, request id, member)."""
    progress = call.progress
    call.error_type = type(err).__name__  # the call's outcome, for its span
    err.partial_text = err.partial_text or progress.text
    err.generated_tokens = err.generated_tokens or call.generated_tokens
    err.usage = err.usage or progress.usage
    err.provider = err.provider or call.provider.name
    err.model = err.model or progress.model or call.sent_request.model
    err.request_id = err.request_id or call.request_id
    err.member = err.member or served_by(call.provider, call.request_id)
    err.partial_reasoning = err.partial_reasoning or progress.reasoning
    if progress.tools or progress.fallback is not None:
        err.tool_calls = err.tool_calls or progress.complete_tool_calls()
        err.partial_tool_call = err.partial_tool_call or progress.partial_tool_call()
    if progress.vectors is not None and err.partial_embeddings is None:
        err.partial_embeddings = list(progress.vectors)
    return err


class SyncStop(Exception):
    """What the loop raises for the stop of a SYNC call: its caller builds the one
    ``GenerationCancelledError`` itself (:func:`stop_error`), in its own thread, at once
    (``_sync.Portal``), so the loop never builds a second one nobody reads, and never raises
    an error object that another thread is already handling."""

    __slots__ = ()


def cancelled(call: Call) -> GenerationCancelledError | SyncStop:
    """What the contract raises for the stop (on the loop): the error itself (async callers),
    or :class:`SyncStop` (sync callers build theirs)."""
    return SyncStop() if call.sync else stop_error(call)


def stop_error(call: Call) -> GenerationCancelledError:
    """The stop, as the caller sees it (rule 8 attached)."""
    token = call.token
    elapsed = None if token.stopped_at is None else (time.perf_counter() - token.stopped_at) * 1000
    plain = call.progress.plain_route and not call.progress.text
    err = GenerationCancelledError(
        f"generation stopped ({token.reason})"
        + ("; the call took the server's plain route, so no partial text was received" if plain else ""),
        reason=token.reason or "user",
        cancel_to_stop_ms=elapsed,
        signal_reason=token.signal_reason,
    )
    attach(call, err)
    record = engine_record(call.provider, call.request_id)
    if record is None:  # a server's evidence is its own (a log line, /metrics), not ours
        return err
    usage = record.usage_at_stop()
    if usage is not None:  # an in-process engine counts what it sampled, text it still held back too
        err.usage, err.generated_tokens = usage, usage.completion_tokens or 0
    progress = call.progress
    if progress.fallback is None and not progress.tools:  # plain text (a tool call is not re-read)
        text = record.text_at_stop()
        if len(text) > len(err.partial_text) and text.startswith(err.partial_text):
            err.partial_text = text
    return err


def judge_complete(call: Call) -> bool:
    """Rule 7, the final decision: stamp the instant, then ask the stop sources themselves. True
    means the answer is complete; False means a stop was requested first (and it wins)."""
    call.progress.completed_at = time.perf_counter()
    if call.token.requested():
        return False
    call.handle(Event.ANSWER)
    return True
