"""What one call is: its spec (fixed when it is built) and its progress (what it has produced).

Building a :class:`Call` holds nothing: no stop source is listened to, no connection exists, no
registry knows it. All of that happens at admission (``admission.py``) and is undone by release,
so a stream that is built and dropped without being iterated leaves nothing behind.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..http.retry import RetryPolicy
from ..provider import CallContext, Provider
from ..stop import InflightRegistry, StopToken
from ..types import GenerationRequest, StreamChunk, Timeout, Timings, Usage

if TYPE_CHECKING:
    from ..abort import AbortSignal
    from ..http.guard import SocketGuard


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
    completed_at: float | None = None  # perf_counter when the answer was judged complete (rule 7)
    vectors: list[list[float]] | None = None  # embedding calls: the vectors finished so far

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def restart(self) -> None:
        """A retried attempt starts from nothing (a retry never mixes two answers)."""
        self.parts.clear()
        self.chunks = 0
        self.usage = self.server_timings = self.model = self.finish_reason = None
        self.first_chunk_at = None

    def record(self, chunk: StreamChunk) -> None:
        if chunk.delta:
            self.parts.append(chunk.delta)
            self.chunks += 1
            if self.first_chunk_at is None:
                self.first_chunk_at = time.perf_counter()
        self.last_chunk_at = time.perf_counter()
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.timings is not None:
            self.server_timings = chunk.timings
        if chunk.model:
            self.model = chunk.model


class Call:
    """One generation: spec + stop token + progress, plus the admission state."""

    __slots__ = ("admitted", "ctx", "gate", "guard", "progress", "registry", "released", "spec", "t0", "token")

    def __init__(
        self,
        spec: CallSpec,
        token: StopToken,
        registry: InflightRegistry,
        gate: threading.Event | None = None,
    ) -> None:
        self.spec = spec
        self.token = token
        self.registry = registry
        self.gate = gate  # set while the LLM ejects its model: new calls wait
        self.progress = Progress()
        self.guard: SocketGuard | None = None  # made at admission for HTTP lanes
        self.t0 = 0.0  # perf_counter at admission
        self.admitted = False
        self.released = False
        self.ctx = CallContext(
            token=token,
            request_id=token.request_id,
            private=True,
            clients=spec.provider.clients,
            connect_timeout=spec.timeout.connect,
            on_chunk=self.progress.record,
        )

    def __repr__(self) -> str:
        return f"<Call {self.request_id} {self.spec.provider.name}>"

    @property
    def provider(self) -> Provider:
        return self.spec.provider

    @property
    def request(self) -> GenerationRequest:
        return self.spec.request

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
