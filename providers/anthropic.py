"""The "anthropic" lane: Anthropic's Messages API (``POST /v1/messages``), on Anthropic's own
servers or any server that speaks it.

The wire is ``abstract_client/wires/messages.py`` (every HTTP lane can speak it too, with
``wire="messages"``); this lane adds Anthropic's quirks: the key goes in ``x-api-key`` (never
``Authorization``), every request names ``anthropic-version``, the model does tool calling
itself, and ``count_tokens`` is the wire's ``/v1/messages/count_tokens``. A stop severs the connection, as on
every lane: Anthropic (and vLLM, llama-server) stop generating when it closes.
"""

from __future__ import annotations

from typing import Any

from abstract_client.http_lane import HttpLane

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicProvider(HttpLane):
    """The ``anthropic`` lane: the Messages wire and Anthropic's headers (see the module docstring)."""

    name = "anthropic"
    families = frozenset({"anthropic"})  # one wire: ``wire=`` is refused
    default_wire = "messages"
    default_base_url = "https://api.anthropic.com"

    def __init__(
        self, *, headers: dict[str, str] | None = None, anthropic_version: str = ANTHROPIC_VERSION, **kw: Any
    ) -> None:
        super().__init__(headers={"anthropic-version": anthropic_version, **(headers or {})}, **kw)

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key}  # never Authorization
