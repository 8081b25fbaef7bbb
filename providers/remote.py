"""The "remote" lane: an ``abstract-client serve`` gateway (the openai-compatible wire, plus the
gateway's extras).

* Every request carries ``X-Request-Id`` = this call's request id, so the gateway's flight, its
  logs and its metrics use the same id as the caller.
* ``cancel(request_id)`` severs our connection like any stop (the gateway sees the disconnect)
  and also calls ``POST /v1/requests/{id}/cancel``, so the stop reaches the model even through a
  proxy that does not pass a client's disconnect on.
* ``load_model``/``unload_model`` call the gateway's admin routes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from abstract_client.http.wire import expect_stream
from abstract_client.provider import CallContext, UnloadReport
from abstract_client.types import GenerationRequest, StreamChunk

from .openai_compatible import OpenAICompatibleProvider, openai_sse_chunks

log = logging.getLogger(__name__)


class RemoteProvider(OpenAICompatibleProvider):
    name = "remote"
    complete_over_stream = True
    default_base_url = "http://127.0.0.1:8000/v1"

    def __init__(self, *, base_url: str | None = None, **kw: Any) -> None:
        base = (base_url or self.default_base_url).rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        super().__init__(base_url=base, **kw)

    async def _stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        body = self.chat_body(request, stream=True)
        if request.raw:
            body = {k: v for k, v in body.items() if k != "messages"} | {"prompt": request.prompt or ""}
        path = "/completions" if request.raw else self.chat_path
        async with ctx.stream("POST", path, json=body, headers={"X-Request-Id": ctx.request_id}) as resp:
            await expect_stream(resp)
            async for chunk in openai_sse_chunks(resp, _text_chunk if request.raw else None):
                yield chunk

    def stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        return self._stream(request, ctx)

    def on_cancel(self, request_id: str) -> None:
        """Called by ``LLM.cancel`` after our side was severed: tell the gateway too, from a
        daemon thread (the stopping thread never waits on the network)."""
        assert self.clients is not None
        url = f"{self.clients.base_url}/requests/{request_id}/cancel"
        headers = dict(self.clients._headers)  # the API key, if any

        def post() -> None:
            try:
                httpx.post(url, headers=headers, timeout=5.0)
            except httpx.HTTPError:
                log.debug("cancel endpoint unreachable for %s", request_id, exc_info=True)

        threading.Thread(target=post, name="abstract-client-remote-cancel", daemon=True).start()

    async def load_model(self) -> None:
        await self.post_json("/models/load", {"model": self.model})

    async def unload_model(self, *, drain_timeout: float = 30.0) -> UnloadReport:
        body = await self.post_json("/models/unload", {"model": self.model})
        return UnloadReport(
            server_unloaded=bool(body.get("unloaded")) if isinstance(body, dict) else False,
            detail=str(body.get("detail", "")) if isinstance(body, dict) else "",
            memory_before=body.get("memory_before") if isinstance(body, dict) else None,
            memory_after=body.get("memory_after") if isinstance(body, dict) else None,
        )


def _text_chunk(obj: Any) -> StreamChunk:
    from .vllm import _text_chunk as text_chunk

    return text_chunk(obj)
