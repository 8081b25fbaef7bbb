"""The "lmstudio" lane: LM Studio's ``/v1/chat/completions`` by default; its native
``/api/v1/chat`` (named SSE events ending with ``chat.end``, no ``[DONE]``) when the caller asks
for native features (``native=True``, or ``reasoning=...``); ``wire="responses"`` its
``/v1/responses``.

* Errors: LM Studio answers unknown routes with HTTP 200 and an ``error`` body, uses both string
  and object ``error`` shapes, and says "No models loaded" when nothing is loaded; all are typed.
* Where the stop takes effect: LM Studio aborts the prediction when the socket closes, but
  **finishes prompt processing first**: a stop during prefill returns to the caller at once, the
  server keeps computing until the prompt is done, then stops.
* Eject: our in-flight calls are stopped first, then every loaded instance of the model is
  unloaded via ``/api/v1/models/unload``. A "Model unloaded" error that races our own eject is
  reported as the stop (reason ``model_eject``): the contract reports any failure while a stop is
  set as the stop, never retried, never a reload.
* Load: ``/api/v1/models`` is listed first, because loading a loaded model makes a second instance.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import MappingProxyType
from typing import Any

import httpx

from abstract_client.errors import ProviderProtocolError
from abstract_client.http.mapping import decode_json_body, error_from_response
from abstract_client.http.wire import expect_stream, json_body, load_frame, poll_until_ready, sse_events
from abstract_client.images import url_refused
from abstract_client.provider import CallContext, Completion, ModelInfo, UnloadReport
from abstract_client.types import GenerationRequest, StreamChunk
from abstract_client.wires.lmstudio import chunk_from_result, native_input

from .openai_compatible import OpenAICompatibleProvider, server_root


class LMStudioProvider(OpenAICompatibleProvider):
    """The ``lmstudio`` lane: LM Studio's ``/v1`` and native ``/api/v1`` routes (see the module
    docstring)."""

    name = "lmstudio"
    complete_over_stream = True  # a stop reaches the server at its next token write
    call_options = MappingProxyType({"native": "True: LM Studio's native /api/v1/chat route (one input, reasoning)"})
    default_base_url = "http://127.0.0.1:1234"
    chat_path = "/v1/chat/completions"
    models_path = "/v1/models"
    ready_path = "/v1/models"
    embeddings_path = "/v1/embeddings"
    api_base = staticmethod(server_root)  # the native /api/v1 routes live beside /v1

    def wants_native(self, request: GenerationRequest) -> bool:
        """The native route for ``native=True``, and for ``reasoning=`` on a plain chat (it has
        no tools and no structured output: those stay on ``/v1``) unless the lane speaks the
        Responses wire (which carries reasoning itself)."""
        if request.extra.get("native"):
            return True
        if self.wire != "chat":  # the Responses and Messages wires carry reasoning themselves
            return False
        return request.reasoning is not None and not request.tools and request.response_format is None

    async def images_refused(self, request: GenerationRequest) -> str | None:
        return url_refused(request.messages, self.name) if self.wants_native(request) else None

    async def native_tools(self, request: GenerationRequest) -> bool:
        """``/v1`` takes ``tool_choice`` none/auto/required; a named choice is carried as a
        schema-constrained output of that call."""
        return not isinstance(request.tool_choice, dict)

    def native_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        extra = dict(request.extra)
        extra.pop("native", None)
        system = "\n".join(str(m.get("content", "")) for m in request.messages if m.get("role") == "system")
        turns = [m for m in request.messages if m.get("role") != "system"]
        if len(turns) > 1:
            raise ValueError("LM Studio's native chat takes one input; use the /v1 route for multi-turn messages")
        body: dict[str, Any] = {
            "model": request.model,
            "input": native_input(turns[-1].get("content") or "") if turns else "",
            "stream": stream,
        }
        if system:
            body["system_prompt"] = system
        if request.max_tokens is not None:
            body["max_output_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.reasoning is not None:
            level = request.reasoning
            body["reasoning"] = level if isinstance(level, str) else ("on" if level else "off")
        body.update(self.extra_body)
        body.update(extra)
        return body

    def stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        return self._stream_native(request, ctx) if self.wants_native(request) else super().stream(request, ctx)

    async def _stream_native(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        async with ctx.stream("POST", "/api/v1/chat", json=self.native_body(request, stream=True)) as resp:
            await expect_stream(resp)
            async for event in sse_events(resp):
                data = load_frame(event.data)
                if event.event == "error":
                    raise error_from_response(200, data if isinstance(data, dict) else {"error": str(data)})
                if event.event == "message.delta":
                    yield StreamChunk(delta=str(data.get("content", "")), raw=data)
                elif event.event == "reasoning.delta":
                    yield StreamChunk(reasoning=str(data.get("content", "")), raw=data)
                elif event.event == "chat.end":
                    yield chunk_from_result(data.get("result") if isinstance(data, dict) else None, delta="")
                    return
        raise ProviderProtocolError("the LM Studio stream ended before chat.end")

    async def complete(self, request: GenerationRequest, ctx: CallContext) -> Completion:
        if not self.wants_native(request):
            return await super().complete(request, ctx)
        body = json_body(await ctx.request("POST", "/api/v1/chat", json=self.native_body(request, stream=False)))
        chunk = chunk_from_result(body, delta=None)
        return Completion.from_chunk(chunk, raw=body)

    # -- models ------------------------------------------------------------------------------------

    async def _native_models(self) -> list[dict[str, Any]]:
        body = await self.get_json("/api/v1/models")
        models = body.get("models") if isinstance(body, dict) else None
        if not isinstance(models, list):
            raise ProviderProtocolError(f"unexpected /api/v1/models body: {str(body)[:200]}")
        return [m for m in models if isinstance(m, dict)]

    async def instances(self) -> list[str]:
        """Ids of the loaded instances of this LLM's model."""
        for m in await self._native_models():
            if m.get("key") == self.model:
                return [str(i.get("id")) for i in m.get("loaded_instances") or [] if isinstance(i, dict)]
        return []

    async def list_models(self) -> list[ModelInfo]:
        return [
            ModelInfo(id=str(m.get("key")), loaded=bool(m.get("loaded_instances")), raw=m)
            for m in await self._native_models()
        ]

    async def load_model(self) -> None:
        if await self.instances():
            return  # already loaded: a second load would make a second instance
        await self.post_json("/api/v1/models/load", {"model": self.model})

    async def unload_model(self, *, drain_timeout: float = 30.0) -> UnloadReport:
        ids = await self.instances()
        for instance_id in ids:
            await self.post_json("/api/v1/models/unload", {"instance_id": instance_id})
        return UnloadReport(
            server_unloaded=bool(ids), detail=f"lmstudio unloaded {len(ids)} instance(s)", extra={"instances": ids}
        )

    async def wait_ready(self, timeout: float) -> None:
        # No health endpoint, and unknown paths answer 200: /v1/models must have its real shape.
        assert self.clients is not None

        def models_listed(resp: httpx.Response) -> bool:
            body = decode_json_body(resp.content)
            return isinstance(body, dict) and isinstance(body.get("data"), list)

        await poll_until_ready(self.clients.get(), "/v1/models", timeout, provider=self.name, ready=models_listed)
