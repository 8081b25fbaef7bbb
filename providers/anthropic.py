"""The "anthropic" lane: Anthropic's Messages API (``POST /v1/messages``), on Anthropic's own
servers or any server that speaks it.

The wire is ``abstract_client/wires/messages.py`` (every HTTP lane can speak it too, with
``wire="messages"``); this lane adds Anthropic's quirks: the key goes in ``x-api-key`` (never
``Authorization``), every request names ``anthropic-version``, the model does tool calling
itself, and ``count_tokens`` is ``/v1/messages/count_tokens``. A stop severs the connection, as on
every lane: Anthropic (and vLLM, llama-server) stop generating when it closes.
"""

from __future__ import annotations

from typing import Any

from abstract_client.errors import ProviderProtocolError
from abstract_client.types import GenerationRequest
from abstract_client.wires.messages import count_tokens_body

from .openai_compatible import OpenAICompatibleProvider, server_root

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicProvider(OpenAICompatibleProvider):
    """The ``anthropic`` lane (see the module docstring)."""

    name = "anthropic"
    default_base_url = "https://api.anthropic.com"
    chat_path = "/v1/chat/completions"  # the Messages route is beside it: /v1/messages
    models_path = "/v1/models"
    ready_path = "/v1/models"
    embeddings_path = "/v1/embeddings"  # Anthropic has none: a typed error from the server
    api_base = staticmethod(server_root)  # /v1/messages and /v1/models live under the root's /v1

    def __init__(
        self,
        *,
        api_key: str | None = None,
        headers: dict[str, str] | None = None,
        anthropic_version: str = ANTHROPIC_VERSION,
        **kw: Any,
    ) -> None:
        given = {"anthropic-version": anthropic_version, **(headers or {})}
        if api_key:
            given["x-api-key"] = api_key
        if "wire" in kw:  # the lane speaks one wire: a wire= it cannot honour is refused, never dropped
            raise TypeError(
                f"create_llm('anthropic'): wire= is not taken (the lane speaks Anthropic's Messages wire), "
                f"not {kw['wire']!r}"
            )
        super().__init__(wire="messages", headers=given, **kw)

    async def native_tools(self, request: GenerationRequest) -> bool:
        return True  # the model does tool calling itself, every choice included

    async def count_tokens(self, request: GenerationRequest) -> int:
        """``/v1/messages/count_tokens`` (the system prompt and every turn, as a call sends them)."""
        body = await self.post_json(f"{self.messages_path}/count_tokens", count_tokens_body(request))
        count = body.get("input_tokens") if isinstance(body, dict) else None
        if not isinstance(count, int):
            raise ProviderProtocolError(f"unexpected /v1/messages/count_tokens body: {str(body)[:200]}")
        return count
