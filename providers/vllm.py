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
* ``wire="responses"``: ``/v1/responses`` instead of chat. ``resumable=True`` (a lane made
  without ``wire=``, or with ``wire="responses"``; another ``wire=`` refuses it) is a Responses
  ``background`` response named by our ``request_id``: read on after a drop with
  ``starting_after``, stopped with ``POST /v1/responses/{id}/cancel`` (a background response
  ignores the disconnect); the server needs ``VLLM_ENABLE_RESPONSES_API_STORE=1``.
* Readiness: connection refused while loading, then ``/health`` 200. One model per process, so
  ``unload_model`` stops our in-flight calls and raises ``NotSupportedError``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar

from abstract_client.errors import NotSupportedError, ProviderProtocolError
from abstract_client.http.wire import poll_until_ready
from abstract_client.http_lane import server_root
from abstract_client.provider import UnloadReport
from abstract_client.types import GenerationRequest
from abstract_client.wires.chat import CHAT
from abstract_client.wires.completions import COMPLETIONS
from abstract_client.wires.responses import RESPONSES
from abstract_client.wires.wire import Wire

from .openai_compatible import OpenAICompatibleProvider


class VLLMFlavour(OpenAICompatibleProvider):
    """vLLM's flavour of the OpenAI API (served by vLLM and by an abstract-client gateway): the
    routes under ``{root}/v1`` with ``/health`` beside them, ``raw=True`` on ``/v1/completions``,
    and ``json_schema=`` as a shortcut for a JSON-schema answer on every wire."""

    api_base = staticmethod(lambda base_url: server_root(base_url) + "/v1")  # /tokenize, /health beside /v1
    call_options = MappingProxyType({"json_schema": "a JSON schema for the answer (vLLM's guided decoding)"})

    def __init__(self, *, base_url: str | None = None, **kw: Any) -> None:
        super().__init__(base_url=base_url, **kw)
        self.root = server_root(self.clients.base_url)

    def wire_for(self, request: GenerationRequest) -> Wire:
        return COMPLETIONS if request.raw else self.wire

    def adjust(self, wire: Wire, body: dict[str, Any], request: GenerationRequest) -> None:
        schema = body.pop("json_schema", None)
        if schema is not None:
            wire.schema_field(body, schema)

    async def wait_ready(self, timeout: float) -> None:
        await poll_until_ready(self.clients.get(), f"{self.root}/health", timeout, provider=self.name)


class VLLMProvider(VLLMFlavour):
    """The ``vllm`` lane: vLLM's OpenAI server (see the module docstring)."""

    name = "vllm"
    # resumable=True: a Responses API background response (whatever the lane's wire; the
    # server needs VLLM_ENABLE_RESPONSES_API_STORE=1), named by our request_id
    resumable_streams = True
    names_responses = True
    default_base_url = "http://127.0.0.1:8000/v1"
    # the streams vLLM counts on every chunk when asked (``continuous_usage_stats``): its chat's
    counted_streams: ClassVar[tuple[Wire, ...]] = (CHAT,)
    resuming_wire = RESPONSES  # its only stream that outlives a drop: a background response

    def adjust(self, wire: Wire, body: dict[str, Any], request: GenerationRequest) -> None:
        """And a chat stream asks for usage on every chunk (``continuous_usage_stats``): vLLM's
        own count so far, so a stopped answer knows what the engine did up to the stop."""
        super().adjust(wire, body, request)
        options = body.get("stream_options")
        if wire in self.counted_streams and isinstance(options, dict):
            options.setdefault("continuous_usage_stats", True)

    async def native_tools(self, request: GenerationRequest) -> bool:
        """Chat: vLLM parses calls itself, and guides ``"required"`` and named choices for any
        model (``"auto"`` needs ``--enable-auto-tool-choice``: a typed ``NotSupportedError``).
        A raw completion has no template, so a forced call is carried as structured output."""
        return not request.raw

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
