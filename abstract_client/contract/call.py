"""What one call is: its spec (fixed when it is built) and its progress (what it has produced).

Building a :class:`Call` holds nothing: no stop source is listened to, no connection exists, no
registry knows it. All of that happens at admission (``admission.py``) and is undone by release,
so a stream that is built and dropped without being iterated leaves nothing behind.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..output.tool_calls import ToolCallAssembler
from ..provider import CallContext, Provider, http_clients
from ..stopping.token import InflightRegistry, StopToken
from ..types import GenerationRequest, StreamChunk, Timeout, Timings, ToolCall, ToolCallDelta, Usage
from .lifecycle import ACTIONS, TRANSITIONS, Event, LifecycleError, Phase, notify
from .retry import RetryPolicy

__all__ = ["Call", "CallSpec", "Progress"]

if TYPE_CHECKING:
    from ..http.guard import SocketGuard
    from ..output.fallback import ToolFallback
    from ..stopping.abort import AbortSignal


@dataclass(eq=False, slots=True)
class CallSpec:
    """Everything the caller asked for; never changes once built."""

    provider: Provider
    request: GenerationRequest
    timeout: Timeout
    retry: RetryPolicy
    cancel_event: threading.Event | None = None
    signal: AbortSignal | None = None


@dataclass(eq=False, slots=True)
class Progress:
    """What the call has produced so far: the partial text every error keeps (rule 8)."""

    parts: list[str] = field(default_factory=list)
    chunks: int = 0
    usage: Usage | None = None
    server_timings: Timings | None = None
    model: str | None = None
    finish_reason: str | None = None
    first_chunk_at: float | None = None  # perf_counter
    last_chunk_at: float | None = None  # perf_counter
    completed_at: float | None = None  # perf_counter of rule 7's judgement (the outcome is the call's phase)
    vectors: list[list[float]] | None = None  # embedding calls: the vectors finished so far
    reasoning_parts: list[str] = field(default_factory=list)
    tools: ToolCallAssembler = field(default_factory=ToolCallAssembler)
    fallback: ToolFallback | None = None  # a forced tool call carried as constrained output
    tool_calls: list[ToolCall] = field(default_factory=list)  # set once the answer is judged complete
    parsed: Any = None  # likewise: the validated structured output
    # a non-streaming attempt on the server's plain route: no text until its whole answer, which
    # is recorded as one chunk (False: recorded chunk by chunk from the streaming wire)
    plain_route: bool = False
    response_id: str | None = None  # the server's id for the answer (an OpenAI frame's "id"), for tracing

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_parts)

    def complete_tool_calls(self) -> list[ToolCall]:
        """The calls complete so far (after a stop: never the one still being written)."""
        return self.tools.complete(finished=False)

    def partial_tool_call(self) -> ToolCallDelta | None:
        if self.fallback is not None and self.fallback.wrapped:
            return self.fallback.partial()
        return self.tools.incomplete()

    def restart(self) -> None:
        """A retried attempt starts from nothing (a retry never mixes two answers)."""
        self.parts.clear()
        self.reasoning_parts.clear()
        self.tools.clear()
        if self.fallback is not None:
            self.fallback.reset()
        self.chunks = 0
        self.usage = self.server_timings = self.model = self.finish_reason = None
        self.first_chunk_at = self.response_id = None

    def record(self, chunk: StreamChunk) -> StreamChunk:
        """Take one chunk into the answer; returns the chunk as the caller sees it (a forced
        tool call's constrained text becomes tool-call pieces; the finishing chunk carries the
        complete calls)."""
        if self.fallback is not None:
            chunk = self.fallback.map(chunk, self.tools)
        now = time.perf_counter()
        if self.response_id is None and type(chunk.raw) is dict:
            rid = chunk.raw.get("id")
            if isinstance(rid, str):
                self.response_id = rid
        if chunk.delta or chunk.reasoning or chunk.tool_call is not None:
            if chunk.delta:
                self.parts.append(chunk.delta)
            if chunk.reasoning:
                self.reasoning_parts.append(chunk.reasoning)
            if chunk.tool_call is not None:
                self.tools.feed(chunk.tool_call)
            self.chunks += 1
            if self.first_chunk_at is None:
                self.first_chunk_at = now
        self.last_chunk_at = now
        if chunk.finish_reason is not None:
            if self.tools and not self.tools.unparsed():
                calls = self.tools.complete(finished=True)
                if chunk.finish_reason == "stop":
                    chunk = replace(chunk, finish_reason="tool_calls")
                if chunk.tool_calls is None:
                    chunk = replace(chunk, tool_calls=calls)
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.timings is not None:
            self.server_timings = chunk.timings
        if chunk.model:
            self.model = chunk.model
        return chunk


class Call:
    """One generation: spec + stop token + progress, and its phase (``lifecycle.py``: one table
    of the moves). Only the contract writes a call; observers keep their own per-call data in
    ``extensions`` (as httpx's ``request.extensions``)."""

    __slots__ = (
        "_phase",
        "ctx",
        "error_type",
        "extensions",
        "gate",
        "guard",
        "kind",
        "moving",
        "progress",
        "registry",
        "sent_request",
        "spec",
        "streaming",
        "sync",
        "t0",
        "token",
    )

    def __init__(
        self,
        spec: CallSpec,
        token: StopToken,
        registry: InflightRegistry,
        gate: threading.Event | None = None,
        *,
        kind: str | None = None,
        sync: bool = False,
    ) -> None:
        self.spec = spec
        self.token = token
        self.registry = registry
        self.gate = gate  # set while the LLM ejects its model: new calls wait
        self.progress = Progress()
        self.guard: SocketGuard | None = None  # made at admission for HTTP lanes
        self.t0 = 0.0  # perf_counter at admission
        self._phase = Phase.BUILT
        self.moving = threading.RLock()  # one move at a time: a sync caller hands over from its thread
        # What the provider is sent: the spec's request (what the caller asked), or its rewrite
        # by ``output.prepare`` (a forced tool call on a backend without native tool calling).
        self.sent_request: GenerationRequest = spec.request
        self.sync = sync  # a sync caller waits on it: that caller builds the stop's error (_sync)
        # the GenAI operation ("chat", "text_completion", "embeddings"; None: model management),
        # whether the caller streams, the error it ended with (a name: no cycle through a traceback)
        self.kind = kind
        self.streaming = False
        self.error_type: str | None = None
        self.extensions: dict[str, Any] = {}  # an observer's own data (telemetry: the span)
        self.ctx = CallContext(
            token=token,
            request_id=token.request_id,
            clients=http_clients(spec.provider),
            connect_timeout=spec.timeout.connect,
            on_chunk=self.progress.record,
            extensions=self.extensions,  # what observers add to the call's requests (trace context)
        )

    def __repr__(self) -> str:
        return f"<Call {self.request_id} {self.spec.provider.name}>"

    @property
    def provider(self) -> Provider:
        return self.spec.provider

    @property
    def phase(self) -> Phase:
        return self._phase

    def handle(self, event: Event, **info: Any) -> None:
        """Drive the call by the lifecycle table: the move's action (which may refuse it by
        raising: the phase is then unchanged), the move, then the observers (told the phase
        entered, or the event's name for a move that stays: ``"retry"``)."""
        with self.moving:
            left = self._phase
            to = TRANSITIONS.get((left, event))
            if to is None:
                raise LifecycleError(f"{self.request_id}: {event.value} in {left.value} is not a move of a call")
            action = ACTIONS.get((left, event))
            if action is not None:
                action(self, info)
            self._phase = to
            notify(self, event.value if to is left else to.value, **{"from": left, **info})  # a retry stays

    @property
    def request_id(self) -> str:
        return self.token.request_id

    @property
    def text(self) -> str:
        return self.progress.text

    @property
    def generated_tokens(self) -> int:
        usage = self.progress.usage
        if usage is not None and usage.completion_tokens is not None:
            return usage.completion_tokens
        return self.progress.chunks

    @property
    def severable(self) -> bool:
        """True once the call's private connection is up: a stop wakes any read on it by
        itself (the socket is shut down), so no cancel scope is needed to reach the server."""
        return self.guard is not None and self.guard.connected
