"""One SDK request's stop: its token, the guard that severs its socket, what it received, and the
one error a stop raises.

The flavour adapters (``sdk/transports.py``) turn an ``httpx2``/``httpx`` request into a plain
``httpx.Request`` and hand it to :meth:`Exchange.send`, which runs it on the library's own
:class:`~abstract_client.http.transport.GuardedTransport`: the same connections, proxy and TLS
code, and the same severing stop, as every generation the library makes itself.

What the caller sees of a stop is :meth:`Exchange.stop_error`: the contract's
``GenerationCancelledError`` with its reason, the time from the stop to the raise, the bytes
received and, for a stream in a dialect it recognises, the text so far. It must pass through the
SDK unchanged and unretried: openai-python lets any exception it does not know pass; the
anthropic SDK wraps and retries every exception that is not an ``anthropic.AnthropicError``, so
once that SDK is loaded the error also derives from that class (``stop_error_class``).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable

import anyio
import httpx

from ..errors import GenerationCancelledError
from ..http.chunk_decoder import ChunkDecoder
from ..http.guard import SocketGuard, current_guard
from ..http.transport import GuardedTransport
from ..stopping.abort import AbortSignal
from ..stopping.event_hook import on_set
from ..stopping.loop import loop_caller
from ..stopping.token import Step, StopToken, reason_from_signal
from ..wires.ollama import OLLAMA
from ..wires.wire import WIRES, Wire
from .binding import Binding, latches_named

__all__ = ["Exchange", "cancel", "stop_error_class"]

_ids = itertools.count(1)
_by_id: dict[str, set[StopToken]] = {}
_by_id_lock = threading.Lock()
# A stream's raw bytes are decoded into text only if it is stopped; past this much they are
# decoded now, so a long stream never holds its whole body.
_HOLD_BYTES = 1 << 20
_WHOLE_BYTES = 4 << 20  # a non-streamed answer up to this size is read in the request's own trip


def cancel(request_id: str) -> int:
    """Stop every request in flight that was sent under ``stop_on(request_id)`` (in that block or
    one nested in it), from any thread, and every request such a block sends afterwards (a
    retry); how many in flight were stopped."""
    for latch in latches_named(request_id):
        latch.set("user")
    with _by_id_lock:
        tokens = list(_by_id.get(request_id, ()))
    return sum(token.stop("user") for token in tokens)


_classes: dict[tuple[type, ...], type[GenerationCancelledError]] = {}


def stop_error_class() -> type[GenerationCancelledError]:
    """``GenerationCancelledError``, made to derive from ``anthropic.AnthropicError`` too once the
    anthropic SDK is imported (else that SDK wraps it as a connection error and retries it)."""
    bases: tuple[type, ...] = (GenerationCancelledError,)
    anthropic = sys.modules.get("anthropic")
    own = getattr(anthropic, "AnthropicError", None)
    if isinstance(own, type) and issubclass(own, Exception):
        bases += (own,)
    if len(bases) == 1:
        return GenerationCancelledError
    cls = _classes.get(bases)
    if cls is None:
        cls = _classes[bases] = type(
            "GenerationCancelledError",
            bases,
            {"__module__": __name__, "__doc__": GenerationCancelledError.__doc__},
        )
    return cls


class Exchange:
    """One request sent by an SDK: bound to the sources of the ``stop_on`` around it."""

    def __init__(self, binding: Binding) -> None:
        self.request_id = binding.request_id or f"sdk-{next(_ids)}"
        self.token = StopToken(self.request_id)
        self.guard = SocketGuard()
        self.guard.register(self.token)
        self.received = 0  # body bytes received
        self._held = bytearray()
        self._decoder: ChunkDecoder | None = None  # the answer's wire's, for the text a stop keeps
        self._text: list[str] = []
        self._unbinds: list[Callable[[], None]] = []
        self._ids = binding.request_ids
        with _by_id_lock:
            for request_id in self._ids:
                _by_id.setdefault(request_id, set()).add(self.token)
        for latch in binding.latches:  # a stop in its block already: stopped here, nothing is sent
            if latch.stop is not None:
                reason, signal_reason = latch.stop
                self.token.stop(reason, signal_reason=signal_reason)  # type: ignore[arg-type]
                break
        latches = self._latches = binding.latches

        def remember() -> None:  # the caller's stop (not a consumer leaving): the block's too
            if self.token.stopped_by_caller:
                for each in latches:
                    each.set(self.token.reason or "user", self.token.signal_reason)

        # before the caller wakes (the first WAKE hook): its retry finds the block stopped
        self._unbinds.append(self.token.add_hook(remember, step=Step.WAKE))
        for event in binding.events:  # (one already set stops the token here: nothing is sent)
            self._unbinds.append(on_set(event, lambda: self.token.stop("user")))
        for signal in binding.signals:
            self._bind_signal(signal)

    def _bind_signal(self, signal: AbortSignal) -> None:
        def on_abort(sig: AbortSignal) -> None:
            self.token.stop(reason_from_signal(sig.reason), signal_reason=sig.reason, at=sig.aborted_at)

        signal.add_listener(on_abort)
        self._unbinds.append(lambda: signal.remove_listener(on_abort))
        if signal.aborted:
            on_abort(signal)

    def release(self) -> None:
        """The request is over: its sources no longer reach it (idempotent)."""
        unbinds, self._unbinds = self._unbinds, []
        for unbind in unbinds:
            unbind()
        ids, self._ids = self._ids, ()
        with _by_id_lock:
            for request_id in ids:
                tokens = _by_id.get(request_id)
                if tokens is not None:
                    tokens.discard(self.token)
                    if not tokens:
                        del _by_id[request_id]

    # -- the request -------------------------------------------------------------------------

    async def send(self, transport: GuardedTransport, request: httpx.Request) -> httpx.Response:
        """Send ``request``; its head, the body left to read. A stop before the socket exists
        (connecting, a proxy's tunnel) cancels the wait; after, it severs the socket."""
        if self.token.is_set:
            raise self.stop_error()
        call_soon = loop_caller()
        with anyio.CancelScope() as scope:
            remove = self.token.add_hook(lambda: call_soon(scope.cancel))
            reset = current_guard.set(self.guard)
            try:
                response = await transport.handle_async_request(request)
            except Exception:
                if self.token.is_set:
                    raise self.stop_error() from None
                raise
            finally:
                current_guard.reset(reset)
                remove()
            self._watch(request.url.path, response.headers.get("content-type", ""))
            return response
        raise self.stop_error()  # the scope took its own cancel: the stop's

    def _watch(self, path: str, content_type: str) -> None:
        """A stream in a dialect the library speaks is decoded by that wire's own decoder (Ollama's
        NDJSON on either of its routes), only when a stop wants its text."""
        wire: Wire | None = None
        if content_type.startswith("text/event-stream"):
            wire = next((w for w in WIRES.values() if path.endswith(w.path)), None)
        elif content_type.startswith(("application/x-ndjson", "application/jsonl")):
            wire = OLLAMA
        self._decoder = None if wire is None else wire.decoder()

    async def body(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The response's raw body, piece by piece; a stop raises :meth:`stop_error`."""
        try:
            async for piece in response.aiter_raw():
                self.received += len(piece)
                if self._decoder is not None:
                    self._held += piece
                    if len(self._held) > _HOLD_BYTES:
                        self._decode()
                yield piece
        except Exception:
            if self.token.is_set:
                raise self.stop_error() from None
            raise
        if self.token.is_set and self.token.stopped_by_caller:
            raise self.stop_error()  # the sever's EOF ended a body that runs to the close

    async def whole(self, response: httpx.Response) -> bytes | None:
        """The body, read now and its connection let go, when it is a small one of known length
        that is not a stream (a non-streamed answer): a sync caller then needs no more trips to
        the loop. None for any other body, left to :meth:`body`."""
        length = response.headers.get("content-length", "")
        if self._decoder is not None or not length.isdigit() or int(length) > _WHOLE_BYTES:
            return None
        return b"".join([piece async for piece in self.body(response)])  # its end lets the connection go

    # -- what a stop hands the caller ---------------------------------------------------------

    def stop_error(self) -> GenerationCancelledError:
        token = self.token
        stopped_at = token.stopped_at or time.perf_counter()
        self._decode()
        err = stop_error_class()(
            "generation cancelled",
            reason=token.reason or "user",
            signal_reason=token.signal_reason,
            cancel_to_stop_ms=(time.perf_counter() - stopped_at) * 1000,
            partial_text="".join(self._text),
            request_id=self.request_id,
        )
        err.received_bytes = self.received  # type: ignore[attr-defined]
        for latch in self._latches:  # what the block's edge raises, whatever wraps this one
            latch.raised(err)
        return err

    def _decode(self) -> None:
        """The text the held bytes carry; bad bytes end it (a partial text is a courtesy)."""
        held, self._held = bytes(self._held), bytearray()
        decoder = self._decoder
        if decoder is None or not held:
            return
        try:
            self._text.extend(chunk.delta for chunk in decoder.feed(held))
        except Exception:  # a stream that breaks its wire (or an error frame) gives no more
            self._decoder = None
