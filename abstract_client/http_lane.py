"""A lane over wires: a server's address, the wires it serves, and its quirks.

Every HTTP lane is one of these. It declares the *families* of wires its server serves
(``"v1"``: any dialect under ``/v1``; ``"ollama"``, ``"lmstudio"``: a native route) and the one it
speaks by default; ``wire=`` picks another it serves (a lane that serves one refuses the
keyword). A call is the wire's body, the lane's ``extra_body``, then the lane's quirks
(:meth:`HttpLane.adjust`), sent on ``ctx.stream``/``ctx.request`` and read by the wire's own
decoder in the one read loop (``http.wire.read_chunks``). Adding a dialect
(``abstract_client/wires/wire.py``) touches no lane.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, ClassVar

import httpx

from .errors import ProviderProtocolError
from .http.clients import HttpClients
from .http.network import CertTypes, NetworkSettings, VerifyTypes
from .http.wire import json_body, poll_until_ready, read_chunks
from .images import url_refused
from .provider import CallContext, Completion, HttpProvider, ModelInfo
from .types import GenerationRequest, StreamChunk
from .wires.wire import WIRES, Wire

__all__ = ["HttpLane", "server_root", "v1_base"]


def server_root(base_url: str) -> str:
    """A server's root URL from what a user may pass for it: with or without ``/v1`` (the
    native routes of llama-server, Ollama and LM Studio live beside ``/v1``)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def v1_base(base_url: str) -> str:
    """Where a ``/v1`` server's routes live, from what a user may pass for it: a bare server
    root (no path) means its ``/v1``, as on every local server; a URL with a path is taken as
    written (a hosted API's ``https://host/openai/v1``)."""
    base = base_url.rstrip("/")
    try:
        bare = not httpx.URL(base).path.strip("/")
    except (httpx.InvalidURL, TypeError):  # HttpClients refuses it, with the reason
        return base_url
    return base + "/v1" if bare else base


class HttpLane(HttpProvider):
    """An HTTP lane over wires (see the module docstring)."""

    families: ClassVar[frozenset[str]]  # the wire families its server serves
    default_wire: ClassVar[str]
    default_base_url: ClassVar[str]
    # The URL the lane's routes are relative to, from the user's ``base_url`` (every HTTP lane
    # takes the server's root or its ``/v1``: docs/index.md's table), and where ``/v1`` is under it
    api_base = staticmethod(server_root)
    v1 = "/v1"
    # Every server streams: a non-streaming call rides the stream, so a stop keeps the partial
    # text and the server hears it at its next token write. One that answers ``stream: true`` with
    # a JSON body is moved to the plain route at its first call (contract/run.py).
    complete_over_stream = True

    def __init__(
        self,
        *,
        model: str | None = None,
        wire: str | Wire | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        connect_timeout: float | None = 10.0,
        headers: dict[str, str] | None = None,
        complete_over_stream: bool | None = None,
        extra_body: dict[str, Any] | None = None,
        proxy: str | httpx.URL | httpx.Proxy | None = None,
        trust_env: bool = True,
        verify: VerifyTypes = True,
        cert: CertTypes | None = None,
    ) -> None:
        served = self.wires_served()
        if wire is not None and len(served) == 1:  # a keyword the lane cannot honour is refused, never dropped
            raise TypeError(
                f"create_llm({self.name!r}): wire= is not taken (the lane speaks {served[0].name!r}), not {wire!r}"
            )
        self.wire = self.served_wire(wire or self.default_wire)
        self.wire_chosen = wire is not None  # the caller named it (not the lane's default)
        all_headers = {**(headers or {}), **(self.auth_headers(api_key) if api_key else {})}
        network = NetworkSettings(proxy=proxy, trust_env=trust_env, verify=verify, cert=cert)
        super().__init__(
            model=model,
            clients=HttpClients(
                self.api_base(base_url or self.default_base_url),
                headers=all_headers,
                connect_timeout=connect_timeout,
                network=network,
            ),
        )
        self.extra_body = dict(extra_body or {})  # fields sent in every request body (create_llm(extra_body=))
        # the user's choice for this instance (False: every generate() on the plain route)
        self.plain_by_default = complete_over_stream is False

    @property
    def models_path(self) -> str:
        return f"{self.v1}/models"

    @property
    def ready_path(self) -> str:
        return self.models_path  # a class may name its own (llama-server's /health)

    @classmethod
    def wires_served(cls) -> list[Wire]:
        return [w for w in WIRES.values() if w.families & cls.families]

    def served_wire(self, name: str | Wire) -> Wire:
        """The wire named (a registered one), or a :class:`Wire` given as it is (one a caller
        or a test wrote, no registry touched) if the lane's server serves its family."""
        if isinstance(name, Wire):
            if name.families & self.families:
                return name
            families = ", ".join(sorted(self.families))
            raise ValueError(f"the {name.name!r} wire is not one {self.name} serves (its servers: {families})")
        for wire in self.wires_served():
            if wire.name == name:
                return wire
        names = ", ".join(repr(w.name) for w in self.wires_served())
        raise ValueError(f"wire must be one of {names} (the wires {self.name} serves), not {name!r}")

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}

    # -- one call: which wire, where, what body ----------------------------------------------------

    def wire_for(self, request: GenerationRequest) -> Wire:
        """The wire one call goes on: the lane's, unless the server has another route for it."""
        return self.wire

    async def images_refused(self, request: GenerationRequest) -> str | None:
        """A wire that takes images as data only refuses an image URL (``Wire.image_urls``)."""
        return None if self.wire_for(request).image_urls else url_refused(request.messages, self.name)

    def route(self, wire: Wire, request: GenerationRequest) -> str:
        return (self.v1 if "v1" in wire.families else "") + wire.path_for(request)

    def body(self, wire: Wire, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        body = wire.encode(request, stream)
        body.update({k: v for k, v in self.extra_body.items() if k not in request.extra})
        self.adjust(wire, body, request)
        return body

    def adjust(self, wire: Wire, body: dict[str, Any], request: GenerationRequest) -> None:
        """The server's quirks: change ``body`` (already the wire's, with ``extra_body``) in place."""

    def stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        wire = self.wire_for(request)
        body = self.body(wire, request, stream=True)
        opening = ctx.stream("POST", self.route(wire, request), json=body, headers=self.call_headers(ctx))
        return read_chunks(opening, wire.decoder())

    async def complete(self, request: GenerationRequest, ctx: CallContext) -> Completion:
        wire = self.wire_for(request)
        body = self.body(wire, request, stream=False)
        resp = await ctx.request("POST", self.route(wire, request), json=body, headers=self.call_headers(ctx))
        return wire.completion(json_body(resp))

    async def count_tokens(self, request: GenerationRequest) -> int:
        """The wire's own count route (Messages' ``/v1/messages/count_tokens``: the system prompt and
        every turn, as a call sends them), where it has one."""
        if self.wire.count_tokens is None:
            return await super().count_tokens(request)
        path = self.route(self.wire, request) + "/count_tokens"
        body = await self.post_json(path, self.wire.count_tokens(request))
        count = body.get("input_tokens") if isinstance(body, dict) else None
        if not isinstance(count, int):
            raise ProviderProtocolError(f"unexpected {path} body: {str(body)[:200]}")
        return count

    # -- the server ---------------------------------------------------------------------------------

    async def get_json(self, path: str) -> Any:
        """``GET`` on the pooled client (model management and probes are not generations)."""
        return json_body(await self.clients.get().get(path))

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        return json_body(await self.clients.get().post(path, json=body))

    async def list_models(self) -> list[ModelInfo]:
        body = await self.get_json(self.models_path)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ProviderProtocolError(f"unexpected /models body: {str(body)[:200]}")
        return [ModelInfo(id=str(m.get("id")), raw=m) for m in data if isinstance(m, dict)]

    async def wait_ready(self, timeout: float) -> None:
        await poll_until_ready(self.clients.get(), self.ready_path, timeout, provider=self.name)
