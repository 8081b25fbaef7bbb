"""One SDK request's stop: its token, the guard that severs its socket, what it received, and the
one error a stop raises.

The flavour adapters (``sdk/transports.py``) turn an ``httpx2``/``httpx`` request into a plain
``httpx.Request`` and hand it to :meth:`Exchange.send`, which runs it on the library's own
:class:`~abstract_client.http.transport.GuardedTransport`: the same connections, proxy and TLS
code, and the same severing stop, as every generation the library makes itself.

What the caller sees of a stop is :meth:`Exchange.stop_error`: the contract's
``GenerationCancelledError`` with its reason, the time from the stop to the raise, the bytes
received and, for a stream in a dialect it recognises, the text so far. It must pass through the
SDK unchanged and unretried: openai-python from 3.14.1 lets any exception it does not know pass;
the anthropic SDK and older openai-pythons wrap and retry every exception that is not their own
(``anthropic.AnthropicError``, ``openai.OpenAIError``), so once such an SDK is loaded the error
also derives from its class (``stop_error_class``).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import AsyncIterator, Callable

import anyio
import httpx

from ..errors import GenerationCancelledError
from ..http.chunk_decoder import ChunkDecoder
from ..http.guard import SocketGuard, current_guard
from ..http.sse import SSEDecoder
from ..http.transport import GuardedTransport
from ..stopping.loop import loop_caller
from ..stopping.token import Step, StopToken
from ..wires.folds import Fold
from ..wires.ollama import OLLAMA
from ..wires.wire import WIRES, Wire
from .binding import Binding, latches_named

__all__ = ["Exchange", "cancel", "stop_error_class"]

_ids = itertools.count(1)
# A stream's raw bytes are decoded into text only if it is stopped; past this much they are
# decoded now, so a long stream never holds its whole body.
_HOLD_BYTES = 1 << 20
_WHOLE_BYTES = 4 << 20  # a non-streamed answer up to this size is read in the request's own trip
_BODY_HEADERS = (b"content-type", b"content-length", b"transfer-encoding", b"content-encoding")


def _wire_at(path: str) -> Wire | None:
    """The dialect whose route ``path`` is (by its end: any server root, any ``/v1``)."""
    return next((w for w in WIRES.values() if path.endswith(w.path)), None)


def cancel(request_id: str) -> int:
    """Stop every request in flight that was sent under ``stop_on(request_id)`` (in that block or
    one nested in it), from any thread, and every request such a block sends afterwards (a
    retry); how many in flight were stopped."""
    return sum(latch.set("user") for latch in latches_named(request_id))


_classes: dict[tuple[type, ...], type[GenerationCancelledError]] = {}


# The SDKs that wrap and retry what is not their own error: (module, its error class) — the
# anthropic SDK (every version), openai-python before 3.14.1 (later ones let a foreign error pass)
_OWN_ERRORS = (("anthropic", "AnthropicError"), ("openai", "OpenAIError"))


def stop_error_class() -> type[GenerationCancelledError]:
    """``GenerationCancelledError``, made to derive from ``anthropic.AnthropicError`` and
    ``openai.OpenAIError`` too once those SDKs are imported (else the anthropic SDK and an
    openai-python before 3.14.1 wrap it as a connection error and retry it)."""
    bases: tuple[type, ...] = (GenerationCancelledError,)
    for module_name, class_name in _OWN_ERRORS:
        own = getattr(sys.modules.get(module_name), class_name, None)
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
        self._fold: Fold | None = None  # a plain call carried over its stream (``carried``)
        self._text: list[str] = []
        self._unbinds: list[Callable[[], None]] = []
        self._binding = binding
        latches = self._latches = binding.latches

        def remember() -> None:  # the caller's stop (not a consumer leaving): the blocks' error
            if self.token.stopped_by_caller:
                for each in latches:
                    each.stopped_request(self.stop_error)

        self._unbinds.append(self.token.add_hook(remember, step=Step.WAKE))
        # every source of its blocks, and their latches (set by a block's own source, cancel(id)):
        # one that already stopped stops it here, and nothing is sent
        self._unbinds.append(binding.watch(lambda reason, why, at: self.token.stop(reason, signal_reason=why, at=at)))

    def release(self) -> None:
        """The request is over: its sources no longer reach it (idempotent)."""
        unbinds, self._unbinds = self._unbinds, []
        for unbind in unbinds:
            unbind()

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
            except BaseException:
                self._caught_up()
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
            wire = _wire_at(path)
        elif content_type.startswith(("application/x-ndjson", "application/jsonl")):
            wire = OLLAMA
        self._decoder = None if wire is None else wire.decoder()

    def carried(self, request: httpx.Request) -> httpx.Request:
        """The request as it is sent: a plain call in a dialect that can carry it (``Wire.carry``)
        rides the dialect's stream, folded back into the plain body by :meth:`whole` — so a stop
        ends it at the server's next token and keeps its text. Any other request as it is."""
        wire = _wire_at(request.url.path) if request.method == "POST" else None
        if wire is None or wire.carry is None:
            return request
        try:
            body = json.loads(request.content)
        except ValueError:
            return request
        streamed = wire.carry.streamed(body) if isinstance(body, dict) else None
        if streamed is None:
            return request
        self._fold = wire.carry.fold()
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
        content = json.dumps(streamed, ensure_ascii=False).encode()
        return httpx.Request("POST", request.url, headers=headers, content=content, extensions=request.extensions)

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
        except BaseException:
            self._caught_up()
            raise
        if self.token.is_set and self.token.stopped_by_caller:
            raise self.stop_error()  # the sever's EOF ended a body that runs to the close

    async def whole(self, response: httpx.Response) -> tuple[httpx.Response, bytes] | None:
        """The answer's head and body, read now and its connection let go, for a plain call: a
        small body of known length that is not a stream, or a carried call's stream folded back
        (:meth:`carried`). A sync caller then needs no more trips to the loop. None for any other
        body, left to :meth:`body`."""
        if self._fold is not None:
            return await self._folded(response)
        length = response.headers.get("content-length", "")
        if self._decoder is not None or not length.isdigit() or int(length) > _WHOLE_BYTES:
            return None
        return response, b"".join([piece async for piece in self.body(response)])  # its end lets the connection go

    async def _folded(self, response: httpx.Response) -> tuple[httpx.Response, bytes]:
        fold = self._fold
        assert fold is not None
        try:
            body = b"".join([piece async for piece in self.body(response)])
        except BaseException:  # a cancelled task, a failure mid-answer: the server is told now
            self.guard.sever()
            with anyio.CancelScope(shield=True):
                await response.aclose()
            raise
        if response.status_code != 200 or self._decoder is None:  # an error answered plainly: as it is
            return response, body
        events = SSEDecoder()
        for event in [*events.feed(body), *events.close()]:
            try:
                fold.add(event.event, event.data if event.data == "[DONE]" else json.loads(event.data))
            except ValueError:
                raise httpx.RemoteProtocolError(
                    f"a carried stream sent a frame that is not JSON: {event.data[:80]!r}"
                ) from None
        if not fold.complete:
            raise httpx.RemoteProtocolError("the server ended a carried stream before its end")
        status, answer = fold.result()
        folded = json.dumps(answer, ensure_ascii=False).encode()
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _BODY_HEADERS]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(folded)).encode())]
        return httpx.Response(status, headers=headers, extensions=response.extensions), folded

    # -- what a stop hands the caller ---------------------------------------------------------

    def _caught_up(self) -> None:
        """The request cancelled (a ``BaseException``): if a source of its blocks has stopped,
        the cancel is that stop's — an async block's scope, cancelled on the loop before the
        stop's own thread reached this request — so the request is stopped here and now, and
        the block's edge raises its error with the text so far, not one made without it."""
        stop = None if self.token.is_set else self._binding.stopped()
        if stop is not None:
            self.token.stop(stop[0], signal_reason=stop[1])

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
