"""The "vllm" lane: vLLM's OpenAI-compatible server (``/v1/chat/completions``, ``/v1/completions``).

* vLLM's sampling and structured-output extras go into the request body as given:
  ``top_k``, ``min_p``, ``repetition_penalty``, ``structured_outputs``, ``response_format``,
  ``chat_template_kwargs`` (and ``json_schema=`` as a shortcut for a JSON-schema
  ``response_format``); usage comes from ``stream_options.include_usage``.
* ``raw=True`` with a plain prompt uses ``/v1/completions`` (no chat template).
* Errors: both the object and the older flat error shape; the ``[DONE]`` that follows an error
  frame is never reached (the error frame raises); unknown model → ``ModelNotFoundError``;
  "maximum context length" → ``ContextOverflowError``.
* Stop: vLLM aborts the request when the connection closes — streaming, non-streaming and during
  (chunked) prefill, at the next engine step.
* ``wire="responses"``: ``/v1/responses`` instead of chat. ``resumable=True`` (any wire) is a
  Responses ``background`` response named by our ``request_id``: read on after a drop with
  ``starting_after``, stopped with ``POST /v1/responses/{id}/cancel`` (a background response
  ignores the disconnect); the server needs ``VLLM_ENABLE_RESPONSES_API_STORE=1``.
* Readiness: connection refused while loading, then ``/health`` 200. One model per process, so
  ``unload_model`` stops our in-flight calls and raises ``NotSupportedError``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import MappingProxyType
from typing import Any

from abstract_client.errors import NotSupportedError, ProviderProtocolError
from abstract_client.http.wire import json_body, poll_until_ready
from abstract_client.provider import CallContext, Completion, UnloadReport
from abstract_client.types import GenerationRequest, StreamChunk
from abstract_client.wires.chat import openai_sse_chunks, sampling_fields, usage_from

from .openai_compatible import OpenAICompatibleProvider, server_root


class VLLMProvider(OpenAICompatibleProvider):
    """The ``vllm`` lane: vLLM's OpenAI server (see the module docstring)."""

    name = "vllm"
    complete_over_stream = True  # a stop reaches the server at its next token write
    # resumable=True: a Responses API background response (whatever the lane's wire; the
    # server needs VLLM_ENABLE_RESPONSES_API_STORE=1), named by our request_id
    resumable_streams = True
    names_responses = True
    api_base = staticmethod(lambda base_url: server_root(base_url) + "/v1")  # /tokenize, /health beside /v1
    call_options = MappingProxyType({"json_schema": "a JSON schema for the answer (vLLM's guided decoding)"})
    default_base_url = "http://127.0.0.1:8000/v1"

    def __init__(self, *, base_url: str | None = None, **kw: Any) -> None:
        super().__init__(base_url=base_url, **kw)
        self.root = server_root(self.clients.base_url if self.clients else "")

    def _extra(self, request: GenerationRequest) -> dict[str, Any]:
        extra = dict(request.extra)
        schema = extra.pop("json_schema", None)
        if schema is not None:
            extra["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        return extra

    def chat_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        body = super().chat_body(request, stream=stream)
        body.pop("json_schema", None)
        body.update(self._extra(request))
        return body

    def responses_request_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        body = super().responses_request_body(request, stream=stream)
        schema = body.pop("json_schema", None)
        if schema is not None:
            body["text"] = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
        return body

    def completions_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": request.model, "prompt": request.prompt or "", "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        body.update(sampling_fields(request))
        if request.response_format is not None:
            body["structured_outputs"] = {"json": request.response_format.schema or {"type": "object"}}
        body.update(self.extra_body)
        body.update(self._extra(request))
        return body

    async def native_tools(self, request: GenerationRequest) -> bool:
        """Chat: vLLM parses calls itself, and guides ``"required"`` and named choices for any
        model (``"auto"`` needs ``--enable-auto-tool-choice``: a typed ``NotSupportedError``).
        A raw completion has no template, so a forced call is carried as structured output."""
        return not request.raw

    def stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        if request.resumable or not request.raw:
            return super().stream(request, ctx)
        body = self.completions_body(request, stream=True)
        return openai_sse_chunks(
            ctx.stream("POST", "/completions", json=body, headers=self.call_headers(ctx)), _text_chunk
        )

    async def complete(self, request: GenerationRequest, ctx: CallContext) -> Completion:
        if not request.raw:
            return await super().complete(request, ctx)
        body = json_body(
            await ctx.request(
                "POST",
                "/completions",
                json=self.completions_body(request, stream=False),
                headers=self.call_headers(ctx),
            )
        )
        chunk = _text_chunk(body)
        return Completion.from_chunk(chunk, raw=body)

    async def count_tokens(self, request: GenerationRequest) -> int:
        """vLLM's ``/tokenize`` (chat template applied to messages, with the generation prompt)."""
        body: dict[str, Any] = {"model": request.model or self.model or "default"}
        if request.raw:
            body["prompt"] = request.prompt or ""
        else:
            body.update(messages=request.messages, add_generation_prompt=True)
        answer = await self.post_json(f"{self.root}/tokenize", body)
        count = answer.get("count") if isinstance(answer, dict) else None
        if not isinstance(count, int):
            raise ProviderProtocolError(f"unexpected /tokenize body: {str(answer)[:200]}")
        return count

    async def unload_model(self, *, drain_timeout: float = 30.0) -> UnloadReport:
        raise NotSupportedError(
            "vLLM serves one model per process and has no unload endpoint (our in-flight calls were "
            "stopped); stop the server process to free the model",
            provider=self.name,
            model=self.model,
        )

    async def wait_ready(self, timeout: float) -> None:
        assert self.clients is not None
        await poll_until_ready(self.clients.get(), f"{self.root}/health", timeout, provider=self.name)


def _text_chunk(obj: Any) -> StreamChunk:
    if not isinstance(obj, dict):
        raise ProviderProtocolError(f"unexpected /v1/completions frame: {str(obj)[:200]}")
    choices = obj.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    text = choice.get("text", "")
    if not isinstance(text, str):
        raise ProviderProtocolError(f"malformed completion text: {str(text)[:200]}")
    finish = choice.get("finish_reason")
    return StreamChunk(
        delta=text,
        finish_reason=finish if isinstance(finish, str) else None,
        usage=usage_from(obj.get("usage")),
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
        raw=obj,
    )
