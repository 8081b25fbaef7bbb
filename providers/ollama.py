"""The "ollama" lane: Ollama's native ``/api/chat`` and ``/api/generate`` (NDJSON).

* ``stream`` is always sent explicitly (Ollama streams unless told not to).
* Options: ``max_tokens`` → ``num_predict``, ``temperature``, ``seed``, ``stop``, and
  ``num_ctx``/anything in ``options=`` passed through; ``keep_alive``/``format``/``think`` too.
* The final object's ``done_reason``, ``prompt_eval_count``, ``eval_count`` and nanosecond
  durations become ``finish_reason``, usage and timings (ms).
* ``raw=True`` with a plain prompt uses ``/api/generate`` with ``raw: true`` (no template).
* ``wire="chat"`` (or ``use_openai_api=True``) uses Ollama's ``/v1/chat/completions`` instead,
  ``wire="responses"`` its ``/v1/responses``, ``wire="messages"`` its ``/v1/messages``.
* Where the stop takes effect: Ollama ≥ 0.30 proxies to llama-server, so a closed connection
  stops streaming, non-streaming and prefill (at the next batch). Before 0.30 the Go runner
  finishes prompt evaluation first: the caller gets the stop at once, the server keeps computing
  until the prompt is done, then stops before the first token.
* Eject: our in-flight calls are stopped first (Ollama would otherwise wait for them), then
  ``keep_alive: 0``, then ``/api/ps`` is polled until the model is gone.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import anyio

from abstract_client.errors import ProviderProtocolError, ServerUnavailableError
from abstract_client.http.wire import raise_if_error
from abstract_client.http_lane import server_root
from abstract_client.provider import ModelInfo, UnloadReport
from abstract_client.types import GenerationRequest
from abstract_client.wires.ollama import OLLAMA
from abstract_client.wires.wire import Wire

from .openai_compatible import OpenAICompatibleProvider


class OllamaProvider(OpenAICompatibleProvider):
    """The ``ollama`` lane: Ollama's native NDJSON routes (see the module docstring)."""

    name = "ollama"
    families = frozenset({"v1", "ollama"})
    default_wire = "ollama"
    call_options = MappingProxyType(
        {
            "options": "Ollama's native options object (merged under the sampling fields)",
            "num_ctx": "the context length for this call (native route)",
            "repeat_penalty": "Ollama's repetition penalty (native route)",
            "keep_alive": "how long the server keeps the model loaded after the call",
            "truncate": "whether the server may truncate a too-long input",
            "suffix": "text after the insertion point (raw completions)",
            "template": "a prompt template replacing the model's",
        }
    )
    default_base_url = "http://127.0.0.1:11434"
    api_base = staticmethod(server_root)  # the native /api routes live beside /v1
    v1 = "/v1"
    ready_path = "/"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        wire: str | Wire | None = None,
        use_openai_api: bool = False,
        unload_poll_timeout: float = 30.0,
        **kw: Any,
    ) -> None:
        super().__init__(base_url=base_url, wire=wire or ("chat" if use_openai_api else None), **kw)
        self.unload_poll_timeout = unload_poll_timeout

    def wire_for(self, request: GenerationRequest) -> Wire:
        return OLLAMA if request.raw else self.wire  # a raw prompt: /api/generate (no template)

    async def native_tools(self, request: GenerationRequest) -> bool:
        """Ollama parses calls itself but cannot force one (no ``tool_choice``): a forced call is
        carried as ``format`` (schema-constrained output)."""
        if request.raw:
            return False
        return request.tool_choice in (None, "auto", "none")

    # -- models ------------------------------------------------------------------------------------

    async def _model_list(self, path: str) -> list[dict[str, Any]]:
        """The ``models`` list of ``/api/tags`` or ``/api/ps``; any other shape is a protocol error."""
        body = await self.get_json(path)
        models = body.get("models") if isinstance(body, dict) else None
        if not isinstance(models, list):
            raise ProviderProtocolError(f"unexpected {path} body: {str(body)[:200]}")
        return [m for m in models if isinstance(m, dict)]

    async def list_models(self) -> list[ModelInfo]:
        tags, ps = await self._model_list("/api/tags"), await self._model_list("/api/ps")
        loaded = {m.get("name") for m in ps}
        return [ModelInfo(id=str(m.get("name")), loaded=m.get("name") in loaded, raw=m) for m in tags]

    async def loaded_models(self) -> list[str]:
        return [str(m.get("name")) for m in await self._model_list("/api/ps")]

    async def show(self) -> Any:
        return await self.post_json("/api/show", {"model": self.model})

    async def version(self) -> str:
        return str((await self.get_json("/api/version")).get("version"))

    async def load_model(self) -> None:
        obj = await self.post_json("/api/chat", {"model": self.model, "messages": [], "stream": False})
        raise_if_error(obj)

    async def unload_model(self, *, drain_timeout: float = 30.0) -> UnloadReport:
        obj = await self.post_json("/api/chat", {"model": self.model, "messages": [], "keep_alive": 0, "stream": False})
        raise_if_error(obj)
        with anyio.move_on_after(self.unload_poll_timeout):
            while self.model in await self.loaded_models():
                await anyio.sleep(0.1)
            return UnloadReport(server_unloaded=True, detail=f"ollama unloaded {self.model}")
        raise ServerUnavailableError(
            f"{self.model} still listed by /api/ps {self.unload_poll_timeout}s after keep_alive: 0 "
            "(another client may still be using it)",
            provider=self.name,
            model=self.model,
        )
