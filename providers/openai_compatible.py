"""The "openai-compatible" lane: any ``/v1`` server, ``POST {base_url}/chat/completions`` by default.

The lane serves the ``"v1"`` family of wires (``abstract_client/wires/``: chat, Responses,
Messages, and any registered later) and adds what a ``/v1`` server has beside them: embeddings,
and the resumable background stream. llama-server, vLLM, LM Studio and Ollama are ``/v1``
servers too, and build on it (their quirks, their native routes).
``wire="responses"`` carries the same calls over the OpenAI Responses API
(``POST {base_url}/responses``), and makes ``resumable=True`` calls possible: a ``background``
response read on after a drop (``starting_after``) and stopped by
``POST /responses/{id}/cancel`` as well as the sever.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager, aclosing
from typing import Any, ClassVar

import anyio
import httpx

from abstract_client.errors import NotSupportedError, ProviderProtocolError, TransportError
from abstract_client.http.resume import resumed_items
from abstract_client.http.wire import json_body
from abstract_client.http_lane import HttpLane, v1_base
from abstract_client.provider import CallContext, EmbeddingBatch
from abstract_client.types import GenerationRequest, StreamChunk
from abstract_client.wires.chat import embeddings_from
from abstract_client.wires.responses import ResponseEvents, response_events
from abstract_client.wires.wire import Wire

from ._server_cancel import ServerCancels

__all__ = ["STOP_REACH_S", "OpenAICompatibleProvider"]

log = logging.getLogger(__name__)

STOP_REACH_S = 30.0  # how long a stop of a stream that outlives its connection keeps trying its server


class OpenAICompatibleProvider(HttpLane):
    """The ``openai-compatible`` lane: any ``/v1`` server (see the module docstring)."""

    name = "openai-compatible"
    families = frozenset({"v1"})
    default_wire = "chat"
    default_base_url = "http://127.0.0.1:8080/v1"
    api_base = staticmethod(v1_base)
    v1 = ""  # the base URL is the server's /v1
    # True: the server takes a response's id from the request (vLLM's ``request_id``), so a stop
    # that comes before its first event still knows what to cancel
    names_responses: bool = False

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._cancels = ServerCancels(self.clients)  # the server's own cancel, for a stop

    # the wire the lane's own resumable stream speaks (llama-server: chat, vLLM: Responses); None:
    # the lane's wire, if the dialect resumes (``Wire.resumes``: a Responses background response)
    resuming_wire: ClassVar[Wire | None] = None

    def resumable_refused(self) -> str | None:
        """Served on the wire the lane was asked for, never another in silence: a lane made on
        its default wire resumes on its own resuming wire (vLLM's chat lane: over Responses, the
        same chunks); a ``wire=`` the lane does not resume on is refused, with the one it does."""
        resuming = self.resuming_wire
        if resuming is None:
            return None if self.wire.resumes else super().resumable_refused()
        if self.wire is resuming or not self.wire_chosen:
            return None
        return (
            f"resumable=True on the {self.name} lane resumes a {resuming.name!r} stream, and this lane was made "
            f"with wire={self.wire.name!r}: make it with wire={resuming.name!r} (or without wire=) for resumable calls"
        )

    def stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        return self.stream_resumable(request, ctx) if request.resumable else super().stream(request, ctx)

    async def stream_resumable(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        """A Responses ``background`` stream: the server generates on past a disconnect and keeps
        the events, so a drop is read on after the last event handed out (``GET
        {responses}/{id}?stream=true&starting_after=N``), and a stop must tell the server itself:
        ``POST {responses}/{id}/cancel`` from the stopping thread (again if the stream ends early
        any other way: a deadline, an error, a ``break``), the sever following as on every call."""
        if request.raw:
            raise NotSupportedError("resumable streams are chat calls (not raw=True)", provider=self.name)
        wire = self.resuming_wire or self.wire  # a Responses wire (``resumable_refused``)
        path = self.route(wire, request)
        body = self.body(wire, request, stream=True)
        body.update(background=True, store=True)  # a background response must be stored
        events = ResponseEvents()
        if self.names_responses:
            events.response_id = body["request_id"] = f"resp_abstract-client-{ctx.request_id}-{uuid.uuid4().hex[:8]}"

        def cancel() -> None:
            if events.response_id is None:  # nothing named it yet: the sever is all there is
                log.warning("%s: stopped before the server named the background response", self.name)
                return
            # 404: the server may not have registered the response yet (the stop came first)
            self._cancels.send(
                "POST", f"{path}/{events.response_id}/cancel", retry_for=STOP_REACH_S, retry_statuses=(404,)
            )

        def reopen(after: Position) -> AbstractAsyncContextManager[httpx.Response]:
            if events.response_id is None:
                raise TransportError(
                    "the connection dropped before the server named the response: it cannot be resumed",
                    provider=self.name,
                )
            if isinstance(after, _Unnumbered):  # resuming would replay: a typed error instead
                raise TransportError(
                    "the stream dropped and cannot be resumed: the server's events carry no sequence_number",
                    provider=self.name,
                )
            params = {"stream": "true"} if after is None else {"stream": "true", "starting_after": str(after)}
            return ctx.stream("GET", f"{path}/{events.response_id}?{httpx.QueryParams(params)}")

        with self._cancels.unless_finished(ctx.token, cancel) as finished:
            items = resumed_items(
                lambda: ctx.stream("POST", path, json=body, headers=self.call_headers(ctx)),
                reopen,
                read=response_events,
                advance=_sequence_after,
                seen=_already_handed_out,
                start=None,
                where=lambda after: (
                    "the first event"
                    if after is None
                    else f"event {after}"
                    if isinstance(after, int)
                    else "an unnumbered event"
                ),
                resume_timeout=request.resume_timeout,
                token=ctx.token,
                provider=self.name,
            )
            async with aclosing(items):
                async for event in items:
                    for chunk in events.chunks(event):
                        yield chunk
            if not events.finished:
                raise ProviderProtocolError("the responses stream ended before its final event (response.completed)")
            finished()

    async def aclose(self) -> None:
        # a stop of a stream that outlives its connection must reach its server: its cancel gets
        # a few seconds to land
        await anyio.to_thread.run_sync(lambda: self._cancels.close(wait=5.0))
        await super().aclose()

    async def embed(
        self, texts: list[str], ctx: CallContext, *, model: str | None, dimensions: int | None = None
    ) -> EmbeddingBatch:
        """The lane's wire's own embeddings route if it has one (Ollama's ``/api/embed``), else
        the server's ``/v1/embeddings``."""
        route = self.wire.embeddings
        if route is not None:
            native = route.encode(texts, model, dimensions, self.extra_body)
            answer = await ctx.request("POST", route.path, json=native, headers=self.call_headers(ctx))
            return route.batch(json_body(answer))
        body: dict[str, Any] = {"model": model or "default", "input": texts, "encoding_format": "float"}
        if dimensions is not None:
            body["dimensions"] = dimensions
        # (llama-server must run with --embeddings and a --pooling)
        resp = await ctx.request("POST", f"{self.v1}/embeddings", json=body, headers=self.call_headers(ctx))
        return embeddings_from(json_body(resp))


class _Unnumbered:
    """The position after an event with no ``sequence_number``: no resume can start there."""


UNNUMBERED = _Unnumbered()
Position = int | None | _Unnumbered


def _number(event: Any) -> int | None:
    sequence = event.get("sequence_number") if isinstance(event, dict) else None
    return sequence if isinstance(sequence, int) and not isinstance(sequence, bool) else None


def _sequence_after(last: Position, event: Any) -> Position:
    """The position a resume starts after: the ``sequence_number`` of the last event handed out
    (once an event came without one, no resume can say where it stands)."""
    number = _number(event)
    return UNNUMBERED if number is None or last is UNNUMBERED else number


def _already_handed_out(last: Position, event: Any) -> bool:
    """An event numbered at or below the last one handed out: a replay, dropped."""
    number = _number(event)
    return isinstance(last, int) and number is not None and number <= last
