"""What a provider is: wire mapping plus the engine's own place to stop, nothing else.

A provider never decides what the caller sees on a stop, never retries, never raises
``GenerationCancelledError``: the contract (``contract/``) runs it and does all of that. An HTTP
provider only issues its requests with ``ctx.stream()`` / ``ctx.request()``: the contract has
arranged a private connection whose socket the stop shuts down (``Step.TELL``/``Step.SEVER``). An in-process
engine reads ``ctx.token.is_set`` on its own thread where it can stop — before every token and
between prefill chunks — and counts what it computed (the evidence a stop is judged by).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

import httpx

from .errors import NotSupportedError
from .http.clients import HttpClients
from .stopping.token import StopToken
from .types import GenerationRequest, StreamChunk, Timings, ToolCallDelta, Usage

__all__ = [
    "CallContext",
    "Completion",
    "EmbeddingBatch",
    "EngineRecord",
    "HttpProvider",
    "InProcessProvider",
    "ModelInfo",
    "Provider",
    "RoutingProvider",
    "UnloadReport",
    "engine_record",
    "http_clients",
    "served_by",
]


class EngineRecord(Protocol):
    """An in-process engine's own record of one request: the evidence a stop is judged by
    (``providers/_engine.py: RequestStats`` is one)."""

    tokens: int  # tokens the engine sampled and counted for the request
    tokens_at_stop: int | None  # the counter when the engine saw the stop flag
    stopped_at: float | None  # perf_counter when it saw the flag

    def when_settled(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (on the engine's thread, or now) once the engine is done with the
        request."""

    def text_at_stop(self) -> str:
        """The text of every token the engine counted (including text a consumer had not read
        yet, or its detokenizer still held)."""

    def usage_at_stop(self) -> Usage | None:
        """The engine's own usage (prompt tokens, tokens it sampled), or None when the prompt
        was never tokenised."""


@dataclass(slots=True)
class Completion:
    """A provider's non-streaming answer; the contract turns it into a ``GenerateResult``."""

    content: str
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    model: str | None = None
    raw: Any = None
    reasoning: str | None = None
    # whole calls, each as one piece (index, id, name, the full arguments text): the contract
    # checks them exactly as it checks streamed ones
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    @classmethod
    def from_chunk(cls, chunk: StreamChunk, raw: Any = None) -> Completion:
        """A whole answer that a wire mapping decoded as one final chunk."""
        return cls(
            content=chunk.delta,
            finish_reason=chunk.finish_reason,
            usage=chunk.usage,
            timings=chunk.timings,
            model=chunk.model,
            raw=raw,
            reasoning=chunk.reasoning or None,
            tool_calls=[chunk.tool_call] if chunk.tool_call is not None else [],
        )


@dataclass(slots=True)
class EmbeddingBatch:
    """A provider's answer to one batch of embedding inputs. A batch may come back short only
    when the stop was requested (in-process engines stop between inputs)."""

    vectors: list[list[float]]
    usage: Usage | None = None
    model: str | None = None


@dataclass(slots=True)
class CallContext:
    """What a provider gets for one call: its stop ``token`` (an in-process engine reads
    ``token.is_set``), its ``request_id``, and, for an HTTP lane, the requests it may make
    (:meth:`stream`, :meth:`request`): each on a private connection whose socket the stop shuts
    down. A provider never builds its own client: a request made any other way cannot be
    stopped."""

    token: StopToken
    request_id: str
    clients: HttpClients | None = None
    connect_timeout: float | None = 10.0
    on_chunk: Callable[[StreamChunk], object] | None = None
    # the call's observers' own data (``Call.extensions``, as httpx's ``request.extensions``):
    # telemetry's ``trace_headers`` (W3C trace context for the upstream) and ``span_event`` (an
    # event on the call's span), read here, written there
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @property
    def trace_headers(self) -> dict[str, str] | None:
        headers: dict[str, str] | None = self.extensions.get("trace_headers")
        return headers

    @property
    def span_event(self) -> Callable[[str, dict[str, Any]], object] | None:
        event: Callable[[str, dict[str, Any]], object] | None = self.extensions.get("span_event")
        return event

    def report(self, chunk: StreamChunk) -> None:
        """For ``complete()`` of engines that produce text piecewise: record progress so that a
        stop of a non-streaming call still keeps the partial text and token count."""
        if self.on_chunk is not None:
            self.on_chunk(chunk)

    def _timeout(self) -> dict[str, float | None]:
        # Only connect is enforced by the transport; first-token/idle/total are the contract's deadlines.
        return {"connect": self.connect_timeout, "read": None, "write": None, "pool": None}

    def stream(self, method: str, url: str, **kwargs: Any) -> AbstractAsyncContextManager[httpx.Response]:
        """``async with ctx.stream("POST", "/v1/chat/completions", json=body) as resp:`` — the
        response with its body unread, to iterate (``resp.aiter_bytes()``). ``url`` is relative
        to the lane's base URL; ``kwargs`` are httpx's (``json``, ``content``, ``headers``,
        ``params``). Only the connect timeout is set here: the other deadlines are the
        contract's. Leaving the block early closes the connection (never pooled unfinished)."""
        return self._clients().open(method, url, timeout=self._timeout(), **self._traced(kwargs))

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """A whole request and response (the body read): the plain route, model management,
        embeddings. The same private connection, stop and timeouts as :meth:`stream`."""
        return await self._clients().fetch(method, url, timeout=self._timeout(), **self._traced(kwargs))

    def _clients(self) -> HttpClients:
        if self.clients is None:
            raise RuntimeError("this provider has no HTTP clients")
        return self.clients

    def _traced(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        trace = self.trace_headers
        if trace:
            kwargs["headers"] = {**(kwargs.get("headers") or {}), **trace}
        return kwargs


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A model the backend knows: its id, whether it is loaded (None: the server does not
    say), and the server's own record."""

    id: str
    loaded: bool | None = None
    raw: Any = None


@dataclass(slots=True)
class UnloadReport:
    """What ``unload_model`` did. Memory figures are in bytes, for in-process lanes."""

    stopped_requests: int = 0
    server_unloaded: bool = False
    detail: str = ""
    memory_before: int | None = None
    memory_after: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Provider(abc.ABC):
    """What every lane provides: the wire mapping (or the engine call) and the engine's own
    place to stop. Implement :meth:`stream` (and :meth:`complete` where the server has a plain
    route); everything else has a default that says the lane cannot. A lane is one of three kinds,
    each adding what only it has: :class:`HttpProvider` (a server over HTTP: its clients, whose
    sockets the stop severs), :class:`InProcessProvider` (an engine in this process: its own record
    of a stop) and :class:`RoutingProvider` (a lane over lanes: the fleet).
    docs/writing-a-lane.md says what to implement, which contract suite to add the lane to, and
    which mutants to add."""

    name: ClassVar[str]
    # True: a non-streaming call is carried over the streaming wire and assembled by the contract
    # (the server then sees a stop at its next token write, instead of at its next connection
    # poll); ``generate(..., plain_route=True)`` opts out per call.
    complete_over_stream: ClassVar[bool] = False
    # False: the backend has no plain route (an in-process engine): every non-streaming call is
    # assembled from the stream, ``plain_route=True`` included.
    plain_route: ClassVar[bool] = True
    # True: the lane's stream outlives a dropped connection and is read on from where it dropped
    # (``resumable=True``; a stop calls the server's own cancel route as well). A lane whose
    # resumability depends on its wire says so in :meth:`resumable_refused`.
    resumable_streams: ClassVar[bool] = False
    default_embed_batch_size: int = 32  # inputs per embeddings request (client-side batching)
    # The per-call keywords this lane takes beyond ``GenerateOptions`` (name -> what it does).
    # Any other keyword is a TypeError before anything is sent: a typo never travels to the
    # server (a field for the body goes in ``extra_body={...}``).
    call_options: Mapping[str, str] = MappingProxyType({})

    def __init__(self, *, model: str | None) -> None:
        self.model = model
        # Every non-streaming call on the plain route: the user's ``complete_over_stream=False``,
        # or a server seen to answer ``stream: true`` with one JSON body (contract/run.py). A
        # setting of this instance, not a capability: the class declares those.
        self.plain_by_default = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} model={self.model!r}>"

    @abc.abstractmethod
    def stream(self, request: GenerationRequest, ctx: CallContext) -> AsyncGenerator[StreamChunk, None]:
        """Yield the answer as chunks; the last one carries finish_reason/usage when known."""

    async def complete(self, request: GenerationRequest, ctx: CallContext) -> Completion:
        """The non-streaming call over the server's plain route (``stream: false``); only
        called when ``plain_route`` is True."""
        raise NotSupportedError(f"{self.name} has no plain (non-streaming) route", provider=self.name)

    def resumable_refused(self) -> str | None:
        """Why ``resumable=True`` calls are refused on this lane (checked before anything is
        sent), or None when they are served (see ``resumable_streams``)."""
        if self.resumable_streams:
            return None
        return (
            f"the {self.name} lane has no resumable streams (llamacpp and vllm have; "
            "an openai-compatible server with create_llm(..., wire='responses') may)"
        )

    def on_cancel(self, request_id: str) -> None:  # noqa: B027 - a hook: nothing to do by default
        """Called by ``LLM.cancel(request_id)`` after the call's own stop ran (its socket is
        severed): a lane whose server has its own cancel route tells it here, never blocking."""

    async def embed(
        self, texts: list[str], ctx: CallContext, *, model: str | None, dimensions: int | None = None
    ) -> EmbeddingBatch:
        """Embed one batch (the contract does the batching, the stop between batches, retries)."""
        raise NotSupportedError(f"{self.name} has no embeddings route", provider=self.name)

    async def native_tools(self, request: GenerationRequest) -> bool:
        """True when the backend itself does tool calling for ``request.tool_choice`` (the server
        parses the model's calls, or guides them). False: the contract carries a forced call as
        schema-constrained output (``response_format``) and refuses ``"auto"``."""
        return True

    async def images_refused(self, request: GenerationRequest) -> str | None:
        """Why this backend (or its model, or this route) cannot take ``request``'s image parts,
        or None when it may: the contract refuses the call before anything is sent. Servers that
        cannot tell answer None (their own error is then typed)."""
        return None

    async def count_tokens(self, request: GenerationRequest) -> int:
        """Tokens of ``request.prompt`` (as given) or of ``request.messages`` with the chat
        template applied."""
        raise NotSupportedError(f"{self.name} has no tokenize route", provider=self.name)

    async def list_models(self) -> list[ModelInfo]:
        """The models the backend serves."""
        raise NotSupportedError(f"{self.name} cannot list models", provider=self.name)

    async def load_model(self) -> None:
        """Load the lane's model now (a server's load route; an engine's weights)."""
        raise NotSupportedError(f"{self.name} cannot load models", provider=self.name)

    async def unload_model(self, *, drain_timeout: float = 30.0) -> UnloadReport:
        """Server-side (or in-process) unload, called after in-flight calls were drained."""
        return UnloadReport(detail=f"{self.name}: no server-side unload; in-flight calls stopped")

    async def wait_ready(self, timeout: float) -> None:
        """Return once the backend answers and its model is ready, within ``timeout`` seconds."""
        raise NotSupportedError(f"{self.name} has no readiness probe", provider=self.name)

    async def aclose(self) -> None:  # noqa: B027 - a hook: nothing held by default
        """Release what the lane holds (its connections on this loop; an engine's thread)."""


class HttpProvider(Provider):
    """A lane whose engine is a server over HTTP. It adds its :class:`HttpClients`: every request
    goes through ``ctx.stream``/``ctx.request`` on a private connection whose socket the stop
    shuts down (``Step.TELL``/``Step.SEVER``) — which is what makes a server stop decoding. Its
    evidence of a stop is the server's own (a log line, ``/metrics``), never a record here."""

    def __init__(self, *, model: str | None, clients: HttpClients) -> None:
        super().__init__(model=model)
        self.clients = clients

    def __repr__(self) -> str:
        return f"<{type(self).__name__} model={self.model!r} {self.clients.base_url}>"

    def call_headers(self, ctx: CallContext) -> dict[str, str] | None:
        """Extra HTTP headers for one call (the "remote" lane sends its request id)."""
        return None

    async def aclose(self) -> None:
        await self.clients.aclose_current_loop()


class InProcessProvider(Provider):
    """A lane whose engine runs in this process (one gateway worker only). It adds the engine's
    own record of each recent request — the evidence a stop is judged by, and where a stopped
    call's text and usage come from (every token the engine counted, read or not)."""

    complete_over_stream = True  # non-streaming calls are assembled by the contract, chunk by chunk
    plain_route = False  # ... always: an engine has no other route

    @abc.abstractmethod
    def engine_record(self, request_id: str) -> EngineRecord | None:
        """The engine's own record of a recent request, or None (unknown, or long gone)."""


class RoutingProvider(Provider):
    """A lane over lanes (the fleet): each call goes to one of its members. It adds which member
    served a call and that member's engine record, when the member is in-process."""

    @abc.abstractmethod
    def served_by(self, request_id: str) -> str | None:
        """Which member served (or last tried) the call."""

    @abc.abstractmethod
    def engine_record(self, request_id: str) -> EngineRecord | None:
        """The serving member's engine record, when that member runs in this process."""


def http_clients(provider: Provider) -> HttpClients | None:
    """An HTTP lane's clients (whose sockets the stop severs); None for the other kinds."""
    return provider.clients if isinstance(provider, HttpProvider) else None


def engine_record(provider: Provider, request_id: str) -> EngineRecord | None:
    """The engine's own record of a call, from the lanes that keep one (in-process engines, and
    a fleet for its in-process members); None for a server over HTTP."""
    if isinstance(provider, InProcessProvider | RoutingProvider):
        return provider.engine_record(request_id)
    return None


def served_by(provider: Provider, request_id: str) -> str | None:
    """The member that served (or last tried) a call, for a lane over lanes; None elsewhere."""
    return provider.served_by(request_id) if isinstance(provider, RoutingProvider) else None
