"""Plain data: what goes into a generation and what comes out."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, TypedDict, TypeVar

__all__ = [
    "ContentPart",
    "EmbeddingResult",
    "GenerateResult",
    "GenerationRequest",
    "Message",
    "ResponseFormat",
    "StreamChunk",
    "Timeout",
    "Timings",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
]


_T = TypeVar("_T")


def _quick_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an ``__init__`` that writes each slot through its
    descriptor. The same object, still frozen; built in half the time (dataclasses' frozen
    ``__init__`` goes through ``object.__setattr__`` per field), which counts for a type built
    once per token on every stream."""
    params, body, namespace = [], [], {}
    for i, f in enumerate(fields(cls)):  # type: ignore[arg-type]
        if f.default is MISSING or f.default_factory is not MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: _quick_init needs a plain default")
        namespace[f"_d{i}"] = f.default
        namespace[f"_s{i}"] = getattr(cls, f.name).__set__
        params.append(f"{f.name}=_d{i}")
        body.append(f"    _s{i}(self, {f.name})")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(source, namespace)  # generated from the class's own field names
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = dict(cls.__init__.__annotations__)  # type: ignore[misc]
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


class ContentPart(TypedDict, total=False):
    """``{"type": "text", "text": ...}`` or ``{"type": "image_url", "image_url": {"url": "data:..."}}``."""

    type: Literal["text", "image_url"]
    text: str
    image_url: dict[str, str]


class Message(TypedDict, total=False):
    """A chat turn. ``role: "tool"`` answers the call ``tool_call_id``; an assistant turn may
    carry ``tool_calls`` (OpenAI shape: ``{"id", "type": "function", "function": {"name",
    "arguments": <JSON string>}}``)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None
    tool_call_id: str
    tool_calls: list[dict[str, Any]]
    name: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call: ``arguments`` is the parsed object, ``arguments_json`` the text the
    model produced. Only complete calls are ever handed out (after a stop too)."""

    id: str
    name: str
    arguments: dict[str, Any]
    arguments_json: str

    def to_message(self) -> dict[str, Any]:
        """The OpenAI wire form, as an assistant message's ``tool_calls`` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call: the ``index``-th call of the answer; ``id`` and ``name``
    arrive once (usually on the first piece), ``arguments_fragment`` is raw JSON text to append."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments_fragment: str = ""


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """What ``response_format=`` asked for, normalised: a JSON schema (``None``: any JSON
    object), its name, and the pydantic model to validate with when one was given."""

    schema: dict[str, Any] | None
    name: str = "answer"
    model: Any = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of a call: prompt, completion, and of the prompt those a cache served."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from a prompt cache, where reported

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
    tool_calls: list[ToolCall] = field(default_factory=list)
    parsed: Any = None  # the validated object (pydantic model) or dict, with response_format
    reasoning: str | None = None
    member: str | None = None  # a Fleet's answer: the member that served it


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


@_quick_init
@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One piece of a streamed answer. ``usage``/``timings`` arrive on the last chunk when known.
    ``reasoning`` is reasoning text (never part of ``delta``); ``tool_call`` a piece of a tool
    call; ``tool_calls`` the complete calls, on the chunk that carries the finish reason.

    A stream hands out every chunk the server sent, including ones that carry no text (a
    server's role-only first chunk, the finish, the usage): ``kind`` says what a chunk carries,
    so "stop after the 5th piece of text" counts ``kind == "text"`` chunks (or ``delta``), not
    chunks."""

    delta: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    model: str | None = None
    raw: Any = None
    reasoning: str = ""
    tool_call: ToolCallDelta | None = None
    tool_calls: list[ToolCall] | None = None

    @property
    def kind(self) -> ChunkKind:
        """What this chunk carries, the first that applies: ``"text"`` (``delta``),
        ``"reasoning"``, ``"tool_call"`` (a piece of a call), ``"finish"`` (``finish_reason``,
        with the complete ``tool_calls``), ``"usage"`` (usage or timings alone), or ``"empty"``
        (nothing: a role-only chunk, a keep-alive)."""
        if self.delta:
            return "text"
        if self.reasoning:
            return "reasoning"
        if self.tool_call is not None:
            return "tool_call"
        if self.finish_reason is not None:
            return "finish"
        if self.usage is not None or self.timings is not None:
            return "usage"
        return "empty"


ChunkKind = Literal["text", "reasoning", "tool_call", "finish", "usage", "empty"]
ChunkKind.__doc__ = "What a :class:`StreamChunk` carries (:attr:`StreamChunk.kind`)."


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
    plain_route: bool = False  # non-streaming over the server's plain route, not the streaming wire
    tools: list[dict[str, Any]] | None = None  # OpenAI function specs, normalised
    tool_choice: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    reasoning: bool | str | None = None  # None: the backend's default
    extra: dict[str, Any] = field(default_factory=dict)
    resumable: bool = False  # the stream outlives a dropped connection (lanes with resumable_streams)
    resume_timeout: float = 30.0  # seconds from a drop to the resumed stream


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

    def __post_init__(self) -> None:
        for name in ("connect", "first_token", "idle", "total"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise TypeError(f"timeout {name} must be a number of seconds or None, not {value!r}")
            if value <= 0:
                raise ValueError(f"timeout {name} must be > 0 seconds (or None for no limit), not {value!r}")

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
