"""The "remote" lane: an ``abstract-client serve`` gateway. Its wire is vLLM's flavour of the
OpenAI API (chat, raw ``/v1/completions``, embeddings), plus the gateway's extras:

* Every request carries ``X-Request-Id`` = this call's request id, so the gateway's flight, its
  logs and its metrics use the caller's id.
* ``cancel(request_id)`` severs our connection like any stop (the gateway sees the disconnect)
  and also calls ``POST /v1/requests/{id}/cancel``, so the stop reaches the model even through a
  proxy that does not pass a client's disconnect on.
* ``wire="responses"`` speaks the gateway's ``/v1/responses``; then ``resumable=True`` is a
  background response the gateway keeps past a dropped connection (read on with
  ``starting_after``, stopped with ``POST /v1/responses/{id}/cancel``).
* ``load_model``/``unload_model`` call the gateway's admin routes. Tools are the gateway's
  business (its backend does native calls or the constrained fallback).
"""

from __future__ import annotations

import logging

from abstract_client.provider import CallContext, UnloadReport

from .vllm import VLLMFlavour

log = logging.getLogger(__name__)


class RemoteProvider(VLLMFlavour):
    """The ``remote`` lane: another abstract-client gateway (vLLM's flavour of the OpenAI API),
    whose cancel route is called on a stop and whose admin routes load and unload."""

    name = "remote"
    default_base_url = "http://127.0.0.1:8000/v1"

    def call_headers(self, ctx: CallContext) -> dict[str, str] | None:
        return {"X-Request-Id": ctx.request_id}

    def on_cancel(self, request_id: str) -> None:
        """Called by ``LLM.cancel`` after our side was severed: tell the gateway too. The stopping
        thread never waits on the network: the POST runs on this lane's own loop thread, through
        the lane's HTTP client (its proxy and TLS settings, and a connection kept warm from one
        cancel to the next)."""
        self._cancels.send("POST", f"/requests/{request_id}/cancel")

    async def load_model(self) -> None:
        await self.post_json("/models/load", {"model": self.model})

    async def unload_model(self, *, drain_timeout: float = 30.0) -> UnloadReport:
        body = await self.post_json("/models/unload", {"model": self.model})
        body = body if isinstance(body, dict) else {}
        return UnloadReport(
            server_unloaded=bool(body.get("unloaded")),
            detail=str(body.get("detail", "")),
            memory_before=body.get("memory_before"),
            memory_after=body.get("memory_after"),
        )
