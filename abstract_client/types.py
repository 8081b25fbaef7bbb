"""Plain data: what goes into a generation and what comes out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict


class Message(TypedDict, total=False):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def total_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    """Client-measured ``ttft_ms``/``total_ms``; the rest as reported by the server when known."""

    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt_ms: float | None = None
    predicted_ms: float | None = None
    prompt_tokens_per_s: float | None = None
    tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """A complete answer. ``completed_at`` (``time.perf_counter()``) is the instant the answer
    was judged complete: a stop requested before it would have won (the contract's rule 7)."""

    content: str
    finish_reason: str | None
    usage: Usage | None
    timings: Timings
    model: str | None
    provider: str
    request_id: str
    raw: Any = None
    completed_at: float | None = None


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    """One vector per input, in input order. ``usage.prompt_tokens`` counts the inputs' tokens
    where the backend reports them."""

    vectors: list[list[float]]
    model: str | None
    usage: Usage | None
    provider: str
    request_id: str
    total_ms: float | None = None


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One piece of a streamed answer. ``usage``/``timings`` arrive on the last chunk when known."""

    delta: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    model: str | None = None
    raw: Any = None


@dataclass(slots=True)
class GenerationRequest:
    """A normalised request, as providers receive it."""

    messages: list[Message]
    model: str | None
    prompt: str | None = None
    raw: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    plain_wire: bool = False  # non-streaming over the server's plain route, not the streaming wire
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Timeout:
    """Deadlines for one call, in seconds; ``None`` means no limit.

    ``connect``: TCP (and TLS) connect. ``first_token``: from the start of the call to the first
    streamed chunk, or to the whole body of a non-streaming call. ``idle``: between two streamed
    chunks. ``total``: the whole call, retries and backoff included.
    """

    connect: float | None = 10.0
    first_token: float | None = None
    idle: float | None = None
    total: float | None = None

    @classmethod
    def coerce(cls, value: Timeout | float | None, default: Timeout | None = None) -> Timeout:
        if value is None:
            return default or cls()
        if isinstance(value, Timeout):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            base = default or cls()
            return cls(connect=base.connect, first_token=base.first_token, idle=base.idle, total=float(value))
        raise TypeError(f"timeout must be a number of seconds or a Timeout, not {type(value).__name__}")
