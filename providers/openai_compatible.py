"""The "openai-compatible" lane: POST {base_url}/chat/completions, shared by every /v1 server.

The chat wire itself is ``abstract_client/wires/chat.py``; this module is the lane: the server's
quirks, the URL, the routes, the resumable background stream. llama-server, vLLM, LM Studio and
Ollama subclass it (adding their fields and native routes).
``wire="responses"`` carries the same calls over the OpenAI Responses API instead
(``POST {base_url}/responses``, the wire ``abstract_client/wires/responses.py``), and makes ``resumable=True``
calls possible: a ``background`` response read on after a drop (``starting_after``) and
stopped by ``POST /responses/{id}/cancel`` as well as the sever.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager, aclosing
from typing import Any, Literal

import anyio
import httpx

from abstract_client.errors import NotSupportedError, ProviderProtocolError, TransportError
from abstract_client.http.clients import HttpClients
from abstract_client.http.network import CertTypes, NetworkSettings, VerifyTypes
from abstract_client.http.resume import resumed_items
from abstract_client.http.wire import json_body, poll_until_ready
from abstract_client.provider import CallContext, Completion, EmbeddingBatch, HttpProvider, ModelInfo
from abstract_client.types import (
    GenerationRequest,
    StreamChunk,
)
from abstract_client.wires.chat import (
    completion_from,
    embeddings_from,
    openai_sse_chunks,
    response_format_field,
    sampling_fields,
    wire_messages,
)
from abstract_client.wires.messages import completion_from_message, messages_body, messages_sse_chunks
from abstract_client.wires.responses import (
    ResponseEvents,
    completion_from_response,
    response_events,
    responses_body,
    responses_sse_chunks,
)

from ._server_cancel import ServerCancels

log = logging.getLogger(__name__)

Wire = Literal["chat", "responses", "messages"]
WIRES: tuple[str, ...] = ("chat", "responses", "messages")
STOP_REACH_S = 30.0  # how long a stop of a stream that outlives its connection keeps trying its server


def server_root(base_url: str) -> str:
    """A server's root URL from what a user may pass for it: with or without ``/v1`` (the
    native routes of llama-server, Ollama and LM Studio live beside ``/v1``)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def v1_base(base_url: str) -> str:
    """Where a ``/v1`` server's routes live, from what a user may pass for it: a bare server
    root (no path) means its ``/v1``, as on every local server; a URL with a path is taken as
    written (a hosted API's ``https://host/openai/v1``)."""
    base = base_url.rstrip("/")
    try:
        bare = not httpx.URL(base).path.strip("/")
    except (httpx.InvalidURL, TypeError):  # HttpClients refuses it, with the reason
        return base_url
    return base + "/v1" if bare else base


class OpenAICompatibleProvider(HttpProvider):
    """The ``openai-compatible`` lane: any ``/v1/chat/completions`` server (see the module docstring)."""

    name = "openai-compatible"
    default_base_url = "http://127.0.0.1:8080/v1"
    chat_path = "/chat/completions"
    models_path = "/models"
    ready_path = "/models"
    embeddings_path = "/embeddings"
    # Every /v1 server streams: a non-streaming call rides the stream, so a stop keeps the partial
    # text and the server hears it at its next token write. One that answers ``stream: true`` with
    # a JSON body is moved to the plain route at its first call (contract/run.py).
    complete_over_stream = True
    # True: the server takes a response's id from the request (vLLM's ``request_id``), so a stop
    # that comes before its first event still knows what to cancel
    names_responses: bool = False
    # The URL the lane's routes are relative to, from the user's ``base_url`` (every HTTP lane
    # takes the server's root or its ``/v1``: docs/index.md's table)
    api_base = staticmethod(v1_base)

    def __init__(
        self,
        *,
        model: str | None = None,
        wire: Wire = "chat",
        base_url: str | None = None,
        api_key: str | None = None,
        connect_timeout: float | None = 10.0,
        headers: dict[str, str] | None = None,
        complete_over_stream: bool | None = None,
        extra_body: dict[str, Any] | None = None,
        proxy: str | httpx.URL | httpx.Proxy | None = None,
        trust_env: bool = True,
        verify: VerifyTypes = True,
        cert: CertTypes | None = None,
    ) -> None:
        all_headers = dict(headers or {})
        if api_key:
            all_headers["Authorization"] = f"Bearer {api_key}"
        network = NetworkSettings(proxy=proxy, trust_env=trust_env, verify=verify, cert=cert)
        super().__init__(
            model=model,
            clients=HttpClients(
                self.api_base(base_url or self.default_base_url),
                headers=all_headers,
                connect_timeout=connect_timeout,
                network=network,
            ),
        )
        if wire not in WIRES:
            raise ValueError(f"wire must be one of {', '.join(map(repr, WIRES))}, not {wire!r}")
        self.wire = wire
        self._cancels = ServerCancels(self.clients)  # the server's own cancel, for a stop
        self.extra_body = dict(extra_body or {})  # fields sent in every request body (create_llm(extra_body=))
        # the user's choice for this instance (False: every generate() on the plain route)
        self.plain_by_default = complete_over_stream is False

    def resumes(self) -> bool:
        # a Responses server keeps a background response past a disconnect, whatever the lane
        return self.resumable_streams or self.wire == "responses"

    def chat_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model or "default",
            "messages": wire_messages(request.messages),
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        body.update(sampling_fields(request))
        body.update(self.feature_fields(request))
        body.update(self.extra_body)
        body.update(request.extra)
        return body

    def feature_fields(self, request: GenerationRequest) -> dict[str, Any]:
        """``tools``/``tool_choice``, ``response_format`` and the reasoning switch."""
        fields: dict[str, Any] = {}
        if request.tools:
            fields["tools"] = request.tools
            if request.tool_choice is not None:
                fields["tool_choice"] = request.tool_choice
        if request.response_format is not None:
            fields["response_format"] = response_format_field(request.response_format)
        if request.reasoning is not None:
            fields.update(self.reasoning_fields(request.reasoning))
        return fields

    def reasoning_fields(self, reasoning: bool | str) -> dict[str, Any]:
        """The chat template's ``enable_thinking`` switch (Qwen3-style templates on llama-server
        and vLLM), and ``reasoning_effort`` for a level."""
        fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": reasoning is not False}}
        if isinstance(reasoning, str):
            fields["reasoning_effort"] = reasoning
        return fields

    @property
    def responses_path(self) -> str:
        """``/v1/responses`` beside the lane's chat route."""
        return self.chat_path.replace("/chat/completions", "/responses")

    @property
    def messages_path(self) -> str:
        """``/v1/messages`` (Anthropic's Messages wire) beside the lane's chat route."""
        return self.chat_path.replace("/chat/completions", "/messages")

    def messages_request_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        body = messages_body(request, stream=stream)  # the request's extra fields included
        body.update({k: v for k, v in self.extra_body.items() if k not in request.extra})
        return body

    def responses_request_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        body = responses_body(request, stream=stream)
        body.update(self.extra_body)
        body.update(request.extra)
        return body

    def stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        if request.resumable:
            return self._stream_background(request, ctx)
        if self.wire == "responses":
            body = self.responses_request_body(request, stream=True)
            return responses_sse_chunks(
                ctx.stream("POST", self.responses_path, json=body, headers=self.call_headers(ctx))
            )
        if self.wire == "messages":
            body = self.messages_request_body(request, stream=True)
            return messages_sse_chunks(
                ctx.stream("POST", self.messages_path, json=body, headers=self.call_headers(ctx))
            )
        body = self.chat_body(request, stream=True)
        return openai_sse_chunks(ctx.stream("POST", self.chat_path, json=body, headers=self.call_headers(ctx)))

    async def complete(self, request: GenerationRequest, ctx: CallContext) -> Completion:
        if self.wire == "responses":
            body = self.responses_request_body(request, stream=False)
            resp = await ctx.request("POST", self.responses_path, json=body, headers=self.call_headers(ctx))
            return completion_from_response(json_body(resp))
        if self.wire == "messages":
            body = self.messages_request_body(request, stream=False)
            resp = await ctx.request("POST", self.messages_path, json=body, headers=self.call_headers(ctx))
            return completion_from_message(json_body(resp))
        body = self.chat_body(request, stream=False)
        resp = await ctx.request("POST", self.chat_path, json=body, headers=self.call_headers(ctx))
        return completion_from(json_body(resp))

    async def _stream_background(
        self, request: GenerationRequest, ctx: CallContext
    ) -> AsyncGenerator[StreamChunk, None]:
        """A Responses ``background`` stream: the server generates on past a disconnect and keeps
        the events, so a drop is read on after the last event handed out (``GET
        {responses}/{id}?stream=true&starting_after=N``), and a stop must tell the server itself:
        ``POST {responses}/{id}/cancel`` from the stopping thread (again if the stream ends early
        any other way: a deadline, an error, a ``break``), the sever following as on every call."""
        if request.raw:
            raise NotSupportedError("resumable streams are chat calls (not raw=True)", provider=self.name)
        body = self.responses_request_body(request, stream=True)
        body.update(background=True, store=True)  # a background response must be stored
        events = ResponseEvents()
        if self.names_responses:
            events.response_id = body["request_id"] = f"resp_abstract-client-{ctx.request_id}-{uuid.uuid4().hex[:8]}"

        def cancel() -> None:
            if events.response_id is None:  # nothing named it yet: the sever is all there is
                log.warning("%s: stopped before the server named the background response", self.name)
                return
            # 404: the server may not have registered the response yet (the stop came first)
            path = f"{self.responses_path}/{events.response_id}/cancel"
            self._cancels.send("POST", path, retry_for=STOP_REACH_S, retry_statuses=(404,))

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
            return ctx.stream("GET", f"{self.responses_path}/{events.response_id}?{httpx.QueryParams(params)}")

        with self._cancels.unless_finished(ctx.token, cancel) as finished:
            items = resumed_items(
                lambda: ctx.stream("POST", self.responses_path, json=body, headers=self.call_headers(ctx)),
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
        body: dict[str, Any] = {"model": model or "default", "input": texts, "encoding_format": "float"}
        if dimensions is not None:
            body["dimensions"] = dimensions
        resp = await ctx.request("POST", self.embeddings_path, json=body, headers=self.call_headers(ctx))
        return embeddings_from(json_body(resp))

    async def get_json(self, path: str) -> Any:
        """``GET`` on the pooled client (model management and probes are not generations)."""
        assert self.clients is not None
        return json_body(await self.clients.get().get(path))

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        assert self.clients is not None
        return json_body(await self.clients.get().post(path, json=body))

    async def list_models(self) -> list[ModelInfo]:
        body = await self.get_json(self.models_path)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ProviderProtocolError(f"unexpected /models body: {str(body)[:200]}")
        return [ModelInfo(id=str(m.get("id")), raw=m) for m in data if isinstance(m, dict)]

    async def wait_ready(self, timeout: float) -> None:
        assert self.clients is not None
        await poll_until_ready(self.clients.get(), self.ready_path, timeout, provider=self.name)


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
