"""The "lmstudio" lane: LM Studio's ``/v1/chat/completions`` by default; its native
``/api/v1/chat`` (the ``lmstudio`` wire: named SSE events ending with ``chat.end``, no
``[DONE]``) when the caller asks for native features (``native=True``, or ``reasoning=...``), or
always with ``wire="lmstudio"``; ``wire="responses"`` its ``/v1/responses``.

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

from types import MappingProxyType
from typing import Any, ClassVar

import httpx

from abstract_client.errors import ProviderProtocolError
from abstract_client.http.mapping import decode_json_body
from abstract_client.http.wire import poll_until_ready
from abstract_client.http_lane import server_root
from abstract_client.provider import ModelInfo, UnloadReport
from abstract_client.types import GenerationRequest
from abstract_client.wires.chat import CHAT
from abstract_client.wires.lmstudio import LMSTUDIO
from abstract_client.wires.wire import Wire

from .openai_compatible import OpenAICompatibleProvider


class LMStudioProvider(OpenAICompatibleProvider):
    """The ``lmstudio`` lane: LM Studio's ``/v1`` and native ``/api/v1`` routes (see the module
    docstring)."""

    name = "lmstudio"
    families = frozenset({"v1", "lmstudio"})
    call_options = MappingProxyType({"native": "True: LM Studio's native /api/v1/chat route (one input, reasoning)"})
    default_base_url = "http://127.0.0.1:1234"
    api_base = staticmethod(server_root)  # the native /api/v1 routes live beside /v1
    v1 = "/v1"
    # LM Studio's quirk: its /v1 chat route takes no reasoning switch (the native route does)
    no_reasoning: ClassVar[tuple[Wire, ...]] = (CHAT,)

    def wire_for(self, request: GenerationRequest) -> Wire:
        """The native route for ``native=True``, and for ``reasoning=`` on a plain chat (it has
        no tools and no structured output: those stay on ``/v1``) unless the lane speaks another
        wire (the Responses and Messages wires carry reasoning themselves)."""
        plain = request.reasoning is not None and not request.tools and request.response_format is None
        return LMSTUDIO if request.extra.get("native") or (self.wire in self.no_reasoning and plain) else self.wire

    async def native_tools(self, request: GenerationRequest) -> bool:
        """``/v1`` takes ``tool_choice`` none/auto/required; a named choice is carried as a
        schema-constrained output of that call."""
        return not isinstance(request.tool_choice, dict)

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
