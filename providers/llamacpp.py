"""The "llamacpp" lane: llama.cpp's ``llama-server``.

* Chat: ``POST /v1/chat/completions`` (the openai-compatible wire code), with llama-server's
  ``timings`` mapped to ``GenerateResult.timings``.
* Raw text completion: ``generate(prompt, raw=True)`` uses the native ``POST /completion``
  (SSE frames without ``[DONE]``; the last frame has ``"stop": true``), no chat template applied.
* Stop: llama-server polls each connection about once a second and cancels the task at the next
  ``n_batch`` boundary when it sees the connection closed (log ``srv stop: cancel task``), so a
  severed private connection is all it needs. ``X-Conversation-Id`` is sent only for
  ``resumable=True`` (docs/resumable.md): with it the server keeps generating after a disconnect,
  so that call's stop also sends ``DELETE /v1/stream``; a user's own header is refused.
* ``wire="responses"``: llama-server's ``/v1/responses`` (foreground only: it has no background
  mode, so ``resumable=True`` is a chat stream with ``X-Conversation-Id``, refused on a lane made
  with another ``wire=``). It ignores
  ``text.format``; structured output is sent in its chat field as well.
* Models: single-model servers cannot unload (``NotSupportedError``, after our in-flight calls
  were stopped); router-mode servers (started without ``-m``) load/unload via ``/models/load``
  and ``/models/unload``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Any, ClassVar

import anyio
import httpx

from abstract_client.errors import NotSupportedError, ProviderProtocolError
from abstract_client.http.chunk_decoder import SSEChunks
from abstract_client.http.resume import resumed_bytes
from abstract_client.http.sse import SSEEvent
from abstract_client.http.wire import load_frame, read_chunks
from abstract_client.http_lane import server_root
from abstract_client.provider import CallContext, Completion, ModelInfo, UnloadReport
from abstract_client.types import GenerationRequest, StreamChunk, Usage
from abstract_client.wires.chat import CHAT, ChatChunks, reasoning_fields, response_format_field, sampling_fields
from abstract_client.wires.responses import RESPONSES
from abstract_client.wires.timings import timings_from
from abstract_client.wires.wire import Wire

from .openai_compatible import STOP_REACH_S, OpenAICompatibleProvider

_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}
_FORBIDDEN_HEADERS = {"x-conversation-id"}


class LlamaCppProvider(OpenAICompatibleProvider):
    """The ``llamacpp`` lane: llama-server over HTTP (see the module docstring)."""

    name = "llamacpp"
    resumable_streams = True  # X-Conversation-Id, GET and DELETE /v1/stream
    resuming_wire = CHAT  # (its /v1/responses has no background mode)
    # llama-server's quirks by wire: the streams it times on every chunk when asked
    # (``timings_per_token``), and the routes that convert the body to chat and drop the
    # dialect's own structured-output and reasoning fields (its chat fields are sent too)
    timed_streams: ClassVar[tuple[Wire, ...]] = (CHAT,)
    converted_to_chat: ClassVar[tuple[Wire, ...]] = (RESPONSES,)
    complete_over_stream = True  # a stop reaches the server at its next token write
    default_base_url = "http://127.0.0.1:8080"
    api_base = staticmethod(server_root)  # native routes (/slots, /tokenize) live beside /v1
    v1 = "/v1"
    ready_path = "/health"

    def __init__(self, *, base_url: str | None = None, headers: dict[str, str] | None = None, **kw: Any) -> None:
        if headers and _FORBIDDEN_HEADERS & {h.lower() for h in headers}:
            raise ValueError(
                "X-Conversation-Id makes llama-server keep generating after a stop; it is refused "
                "(resumable=True sends its own, and stops it with DELETE /v1/stream)"
            )
        super().__init__(base_url=base_url, headers=headers, **kw)
        self._router: bool | None = None
        self._tool_calls: bool | None = None
        self._vision: bool | None = None

    def call_headers(self, ctx: CallContext) -> dict[str, str] | None:
        # llama-server closes the connection right after a streamed answer (its Keep-Alive
        # header notwithstanding): a pooled connection reused before that FIN arrives fails
        # with "Server disconnected without sending a response". So every call says it will
        # close; the next one connects afresh (a loopback connect: ~0.1 ms).
        return {"Connection": "close"}

    async def images_refused(self, request: GenerationRequest) -> str | None:
        """``/props`` ``modalities.vision``: without a projector (``--mmproj``) llama-server
        answers an image with a 500, which would look like a server failure."""
        if self._vision is None:
            props = await self.get_json("/props")
            modalities = props.get("modalities") if isinstance(props, dict) else None
            self._vision = bool(modalities.get("vision")) if isinstance(modalities, dict) else False
        if self._vision:
            return None
        return "this llama-server takes no images (its /props modalities.vision is false: start it with --mmproj)"

    async def native_tools(self, request: GenerationRequest) -> bool:
        """The model's chat template supports tool calls (``/props`` ``chat_template_caps``,
        which needs ``--jinja``); the server silently ignores ``tools`` otherwise."""
        if request.raw:
            return False
        if self._tool_calls is None:
            props = await self.get_json("/props")
            caps = props.get("chat_template_caps") if isinstance(props, dict) else None
            self._tool_calls = bool(caps.get("supports_tool_calls")) if isinstance(caps, dict) else False
        return self._tool_calls

    def wire_for(self, request: GenerationRequest) -> Wire:
        return COMPLETION if request.raw else self.wire

    def adjust(self, wire: Wire, body: dict[str, Any], request: GenerationRequest) -> None:
        """llama-server's ``/v1/responses`` converts the body to a chat request and drops
        ``text.format``: structured output goes in its chat field (passed through, honoured),
        and the reasoning switch as on chat. A chat stream asks for ``timings`` on every chunk:
        the server's own count so far (prompt, cache, decoded), so a stopped answer knows what
        the engine did up to the stop (a gateway bills it)."""
        if wire in self.timed_streams and body.get("stream"):
            body.setdefault("timings_per_token", True)
        if wire not in self.converted_to_chat:
            return
        if request.response_format is not None:
            body.setdefault("response_format", response_format_field(request.response_format))
        if request.reasoning is not None:
            body.setdefault("chat_template_kwargs", reasoning_fields(request.reasoning)["chat_template_kwargs"])

    async def stream_resumable(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        """A chat stream that outlives its connection: ``X-Conversation-Id`` makes llama-server
        keep its bytes (and keep decoding) past a disconnect; a drop is resumed from the byte we
        had (``GET /v1/stream?conv_id=…&from=N``). So a stop must tell the server itself:
        ``DELETE /v1/stream?conv_id=…`` (its "explicit user Stop") from the stopping thread, and
        again if the stream ends early any other way (a deadline, an error, a ``break``); the
        sever follows as on every call."""
        if request.raw:
            raise NotSupportedError(
                "resumable streams are chat streams on llama-server (not raw=True)", provider=self.name
            )
        conv_id = f"abstract-client-{ctx.request_id}-{uuid.uuid4().hex[:8]}"
        path, body = self.route(self.resuming_wire, request), self.body(self.resuming_wire, request, stream=True)
        headers = {**(self.call_headers(ctx) or {}), "X-Conversation-Id": conv_id}

        def cancel() -> None:
            self._cancels.send("DELETE", "/v1/stream", params={"conv_id": conv_id}, retry_for=STOP_REACH_S)

        with self._cancels.unless_finished(ctx.token, cancel) as finished:
            parts = resumed_bytes(
                lambda: ctx.stream("POST", path, json=body, headers=headers),
                lambda offset: ctx.stream(
                    "GET", f"/v1/stream?{httpx.QueryParams(conv_id=conv_id, **{'from': offset})}"
                ),
                resume_timeout=request.resume_timeout,
                token=ctx.token,
                provider=self.name,
            )
            async for chunk in read_chunks(parts, ChatChunks()):
                yield chunk
            finished()

    # -- tokens ------------------------------------------------------------------------------------

    async def count_tokens(self, request: GenerationRequest) -> int:
        """``/apply-template`` (the model's own chat template) then ``/tokenize``; a raw prompt
        is tokenized as ``/completion`` does (special tokens added where the model wants them)."""
        if request.raw:
            prompt, add_special = request.prompt or "", True
        else:
            templated = await self.post_json("/apply-template", {"messages": request.messages})
            if not isinstance(templated, dict) or not isinstance(templated.get("prompt"), str):
                raise ProviderProtocolError(f"unexpected /apply-template body: {str(templated)[:200]}")
            prompt, add_special = templated["prompt"], False
        body = await self.post_json("/tokenize", {"content": prompt, "add_special": add_special})
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list):
            raise ProviderProtocolError(f"unexpected /tokenize body: {str(body)[:200]}")
        return len(tokens)

    # -- models ------------------------------------------------------------------------------------

    async def _models_body(self) -> Any:
        return await self.get_json("/models")

    async def is_router(self) -> bool:
        """Router mode (started without ``-m``) lists models with a ``status``."""
        if self._router is None:
            body = await self._models_body()
            data = body.get("data") if isinstance(body, dict) else None
            entries = data if isinstance(data, list) else []
            self._router = bool(entries) and all(
                isinstance(m, dict) and isinstance(m.get("status"), dict) for m in entries
            )
        return self._router

    async def list_models(self) -> list[ModelInfo]:
        body = await self._models_body()
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ProviderProtocolError(f"unexpected /models body: {str(body)[:200]}")
        out = []
        for m in data:
            if isinstance(m, dict):
                status = m.get("status")
                loaded = status.get("value") == "loaded" if isinstance(status, dict) else True
                out.append(ModelInfo(id=str(m.get("id")), loaded=loaded, raw=m))
        return out

    async def load_model(self) -> None:
        if not await self.is_router():
            return  # single-model mode: the model is loaded for the server's lifetime
        await self.post_json("/models/load", {"model": self.model})
        await self._wait_status("loaded", timeout=300)

    async def unload_model(self, *, drain_timeout: float = 30.0) -> UnloadReport:
        if not await self.is_router():
            raise NotSupportedError(
                "a single-model llama-server cannot unload its model (our in-flight calls were stopped); "
                "start llama-server in router mode (without -m) to load and unload models",
                provider=self.name,
                model=self.model,
            )
        await self.post_json("/models/unload", {"model": self.model})
        await self._wait_status("unloaded", timeout=60)
        return UnloadReport(server_unloaded=True, detail=f"llama-server router unloaded {self.model}")

    async def _wait_status(self, value: str, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            while True:
                for m in await self.list_models():
                    status = m.raw.get("status") if isinstance(m.raw, dict) else None
                    if m.id == self.model and isinstance(status, dict) and status.get("value") == value:
                        return
                await anyio.sleep(0.25)
        raise NotSupportedError(f"model {self.model!r} did not become {value} within {timeout}s", provider=self.name)


def _native_chunk(frame: dict[str, Any]) -> StreamChunk:
    content = frame.get("content", "")
    if not isinstance(content, str):
        raise ProviderProtocolError(f"malformed /completion content: {str(content)[:200]}")
    final = frame.get("stop") is True
    usage = None
    if final:
        prompt, predicted = frame.get("tokens_evaluated"), frame.get("tokens_predicted")
        usage = Usage(
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            completion_tokens=predicted if isinstance(predicted, int) else None,
        )
    stop_type = frame.get("stop_type")
    return StreamChunk(
        delta=content,
        finish_reason=_FINISH.get(str(stop_type), "stop") if final else None,
        usage=usage,
        timings=timings_from(frame.get("timings")) if final else None,
        model=frame.get("model") if isinstance(frame.get("model"), str) else None,
        raw=frame,
    )


class _CompletionChunks(SSEChunks):
    """``/completion``'s frames, without ``[DONE]``: the last one has ``"stop": true``."""

    cut = "the /completion stream ended before its final frame (stop: true)"

    def event(self, event: SSEEvent) -> list[StreamChunk]:
        frame = load_frame(event.data)
        if not isinstance(frame, dict):
            raise ProviderProtocolError(f"unexpected /completion frame: {event.data[:200]!r}")
        self.finished = self.done = frame.get("stop") is True
        return [_native_chunk(frame)]


def _completion_body(request: GenerationRequest, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": request.prompt or "", "stream": stream, "cache_prompt": True}
    body.update(sampling_fields(request, max_tokens_key="n_predict"))
    if request.response_format is not None:  # the native field: a grammar built from the schema
        body["json_schema"] = request.response_format.schema or {"type": "object"}
    body.update(request.extra)
    return body


def _whole_completion(body: Any) -> Completion:
    if not isinstance(body, dict) or not isinstance(body.get("content"), str):
        raise ProviderProtocolError(f"unexpected /completion body: {str(body)[:200]}")
    return Completion.from_chunk(_native_chunk(body), raw=body)


# llama-server's raw route (``raw=True`` takes it: no chat template); no family: it is the
# lane's own, under the server's root, never a ``wire=`` a lane is asked for
COMPLETION = Wire(
    "llamacpp-completion", "/completion", _completion_body, _CompletionChunks, _whole_completion, frozenset()
)
