"""The OpenAI wire, from the gateway's side: requests into ``generate`` arguments, results and
chunks into ``chat.completion`` / ``text_completion`` objects, errors into error bodies with the
right status. Pure functions."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from .._validate import check_generation
from ..errors import (
    AbstractClientError,
    ConnectionFailedError,
    ContextOverflowError,
    GenerationCancelledError,
    GenerationTimeoutError,
    InvalidRequestError,
    ModelNotFoundError,
    NotSupportedError,
    OutputValidationError,
    RateLimitError,
    ServerUnavailableError,
)
from ..types import GenerateResult, StreamChunk, ToolCallDelta

__all__ = [
    "BadRequest",
    "ChatFrames",
    "Shape",
    "as_written",
    "chat_completion",
    "FrameEncoder",
    "chunk_frames",
    "embeddings_body",
    "error_body",
    "error_headers",
    "generation_args",
    "model_field",
    "openai_error",
    "shaped_error",
    "text_completion",
    "sse",
    "usage_frame",
]

# sampling fields passed to the backend as they are (each lane maps the ones it knows)
_PASSTHROUGH = (
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "ignore_eos",
    "min_tokens",
)
_EFFORT = {"low", "medium", "high"}


class BadRequest(Exception):
    """The request is not one the gateway can serve (HTTP 400, OpenAI error body)."""


def generation_args(body: Any, *, chat: bool) -> tuple[dict[str, Any], bool, bool]:
    """``(kwargs for agenerate/astream, stream?, include usage in the stream?)``."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    kwargs: dict[str, Any] = {}
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        if len(messages) > MAX_MESSAGES:
            raise BadRequest(f"a request holds at most {MAX_MESSAGES} messages, not {len(messages)}")
        kwargs["messages"] = messages
        for key in ("tools", "tool_choice", "response_format"):
            if body.get(key) is not None:
                kwargs[key] = body[key]
        _check_sizes(kwargs.get("tools"), kwargs.get("response_format"))
        effort = body.get("reasoning_effort")
        if effort is not None and effort not in (*_EFFORT, "none", "minimal"):
            raise BadRequest(f"reasoning_effort must be none, minimal, low, medium or high, not {str(effort)[:40]!r}")
        thinking = _object(body, "chat_template_kwargs").get("enable_thinking")
        if effort in _EFFORT:
            kwargs["reasoning"] = effort
        elif effort in ("none", "minimal") or thinking is False:
            kwargs["reasoning"] = False
        elif thinking is True:
            kwargs["reasoning"] = True
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string (one prompt per request)")
        kwargs.update(prompt=prompt, raw=True)
    model_field(body)
    if body.get("n") not in (None, 1):
        raise BadRequest("n > 1 is not supported")
    for key in ("max_completion_tokens", "max_tokens"):  # both are checked; the newer name wins
        value = body.get(key)
        try:
            check_generation({"max_tokens": int(value) if isinstance(value, float) and value.is_integer() else value})
        except (TypeError, ValueError) as exc:
            raise BadRequest(str(exc).replace("max_tokens", key)) from None
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:  # absent or null: the older name speaks
        max_tokens = body.get("max_tokens")
    for key, value in (
        ("max_tokens", max_tokens),
        ("temperature", body.get("temperature")),
        ("seed", body.get("seed")),
        ("stop", body.get("stop")),
    ):
        if value is not None:
            kwargs[key] = value
    for key in _PASSTHROUGH:
        if body.get(key) is not None:
            kwargs[key] = body[key]
    for key in _INTEGERS:  # JSON Schema's integer (the spec this gateway serves) takes 5.0 as 5
        value = kwargs.get(key)
        if isinstance(value, float) and value.is_integer():
            kwargs[key] = int(value)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be true or false, not {stream!r}")
    include_usage = _object(body, "stream_options").get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadRequest("stream_options.include_usage must be true or false")
    return kwargs, stream, include_usage


_INTEGERS = ("max_tokens", "seed", "top_k", "min_tokens")


# Bounds that keep one request's checks short on the event loop (#48: 100k tools, each checked
# as a JSON schema, held a worker's loop for minutes; 1M messages for 7 s). OpenAI's own API
# takes 128 tools; a long agent conversation is hundreds of messages.
MAX_MESSAGES = 10_000
MAX_TOOLS = 256
MAX_SCHEMA_BYTES = 1024 * 1024  # all tools' definitions, and a response_format's schema


def _check_sizes(tools: Any, response_format: Any) -> None:
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise BadRequest(f"a request holds at most {MAX_TOOLS} tools, not {len(tools)}")
    for what, value in (("tools", tools), ("response_format", response_format)):
        if value is not None and len(json.dumps(value, default=str)) > MAX_SCHEMA_BYTES:
            raise BadRequest(f"{what} is larger than {MAX_SCHEMA_BYTES} bytes of JSON")


def model_field(body: dict[str, Any]) -> str | None:
    """The body's ``model``: a string, or absent/null (a one-backend gateway's own)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"model must be a string, not {type(model).__name__}")
    return model


def _object(body: dict[str, Any], key: str) -> dict[str, Any]:
    """``body[key]`` when it is an object, {} when absent or null; anything else is a 400."""
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{key} must be an object, not {type(value).__name__}")
    return value


def _usage(result_usage: Any) -> dict[str, Any] | None:
    if result_usage is None or result_usage.prompt_tokens is None or result_usage.completion_tokens is None:
        return None
    usage: dict[str, Any] = {
        "prompt_tokens": result_usage.prompt_tokens,
        "completion_tokens": result_usage.completion_tokens,
        "total_tokens": result_usage.prompt_tokens + result_usage.completion_tokens,
    }
    if result_usage.cached_tokens is not None:  # OpenAI's field for prompt-cache hits
        usage["prompt_tokens_details"] = {"cached_tokens": result_usage.cached_tokens}
    return usage


def chat_completion(result: GenerateResult, request_id: str, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.content or (None if result.tool_calls else "")}
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [c.to_message() for c in result.tool_calls]
    out: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": result.finish_reason}],
    }
    usage = _usage(result.usage)
    if usage:
        out["usage"] = usage
    return out


def embeddings_body(batch: Any, model: str) -> dict[str, Any]:
    """An embedding batch (``EmbeddingBatch``) as ``/v1/embeddings`` answers it."""
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(batch.vectors)]
    n = batch.usage.prompt_tokens if batch.usage and batch.usage.prompt_tokens else 0
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": n, "total_tokens": n}}


def text_completion(result: GenerateResult, request_id: str, model: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": result.content, "finish_reason": result.finish_reason}],
    }
    usage = _usage(result.usage)
    if usage:
        out["usage"] = usage
    return out


def _tool_delta(delta: ToolCallDelta) -> dict[str, Any]:
    out: dict[str, Any] = {"index": delta.index, "function": {"arguments": delta.arguments_fragment}}
    if delta.id:
        out.update(id=delta.id, type="function")
    if delta.name:
        out["function"]["name"] = delta.name
    return out


def chunk_frames(chunk: StreamChunk, request_id: str, model: str, created: int, *, chat: bool) -> list[dict[str, Any]]:
    """The frames for one chunk (none for a chunk that carries nothing the wire shows)."""
    base = {"id": request_id, "created": created, "model": model}
    if not chat:
        if not chunk.delta and chunk.finish_reason is None:
            return []
        choice = {"index": 0, "text": chunk.delta, "finish_reason": chunk.finish_reason}
        return [{**base, "object": "text_completion", "choices": [choice]}]
    delta: dict[str, Any] = {}
    if chunk.delta:
        delta["content"] = chunk.delta
    if chunk.reasoning:
        delta["reasoning_content"] = chunk.reasoning
    if chunk.tool_call is not None:
        delta["tool_calls"] = [_tool_delta(chunk.tool_call)]
    if not delta and chunk.finish_reason is None:
        return []
    choice = {"index": 0, "delta": delta, "finish_reason": chunk.finish_reason}
    return [{**base, "object": "chat.completion.chunk", "choices": [choice]}]


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class FrameEncoder:
    """The SSE bytes of one stream's chunks. A plain content chunk — nearly every chunk — is
    its text's JSON between two pre-encoded halves (one ``json.dumps`` of a string instead of a
    whole frame); anything else goes through :func:`chunk_frames`."""

    def __init__(self, request_id: str, model: str, created: int, *, chat: bool) -> None:
        self.request_id, self.model, self.created, self.chat = request_id, model, created, chat
        base = json.dumps({"id": request_id, "created": created, "model": model}, separators=(",", ":"))[:-1]
        if chat:
            self._head = f'data: {base},"object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":'
            self._tail = b'},"finish_reason":null}]}\n\n'
        else:
            self._head = f'data: {base},"object":"text_completion","choices":[{{"index":0,"text":'
            self._tail = b',"finish_reason":null}]}\n\n'
        self._head_bytes = self._head.encode()

    def encode(self, chunk: StreamChunk) -> bytes:
        """The frames for ``chunk`` (empty: it carries nothing the wire shows)."""
        if chunk.delta and chunk.finish_reason is None and not chunk.reasoning and chunk.tool_call is None:
            return self._head_bytes + json.dumps(chunk.delta).encode() + self._tail
        frames = chunk_frames(chunk, self.request_id, self.model, self.created, chat=self.chat)
        return b"".join(sse(frame) for frame in frames)


def usage_frame(result: GenerateResult, request_id: str, model: str, created: int, *, chat: bool) -> dict[str, Any]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [],
        "usage": _usage(result.usage),
    }


# shape(status, body): an error body (OpenAI's, as the gateway writes them) in a route's own wire
Shape = Callable[[int, Any], Any]


def as_written(status: int, body: Any) -> Any:
    """The OpenAI routes' shape: the body as the gateway wrote it."""
    return body


def shaped_error(err: BaseException, shape: Shape) -> tuple[int, Any]:
    """``(status, body)`` for an error, in a route's shape."""
    status, body = error_body(err)
    return status, shape(status, body)


def error_body(err: BaseException) -> tuple[int, dict[str, Any]]:
    """``(status, OpenAI error body)`` for an error; a stopped call's partial text is kept."""
    status, kind = 500, "server_error"
    code: str | None = None
    if isinstance(err, BadRequest):
        status, kind = 400, "invalid_request_error"
    elif isinstance(err, GenerationCancelledError):
        # the reason the stop was given (the gateway's: cancel_endpoint, shutdown, ...), as its
        # stop record says; a stop without one says who stopped it (user, timeout, ...)
        given = err.signal_reason
        status, kind, code = 499, "cancelled", given if isinstance(given, str) and given else err.reason
    elif isinstance(err, GenerationTimeoutError):
        status, kind, code = 504, "timeout", err.kind
    elif isinstance(err, OutputValidationError):
        status, kind = 422, "output_validation_error"
    elif isinstance(err, ModelNotFoundError):
        status, kind, code = 404, "invalid_request_error", "model_not_found"
    elif isinstance(err, ContextOverflowError):
        status, kind, code = 400, "invalid_request_error", "context_length_exceeded"
    elif isinstance(err, NotSupportedError):
        status, kind = 400, "not_supported_error"
    elif isinstance(err, InvalidRequestError):
        status, kind = 400, "invalid_request_error"
    elif isinstance(err, RateLimitError):
        status, kind = 429, "rate_limit_error"
    elif isinstance(err, ConnectionFailedError):
        # nothing listens there, or nothing answered the connect: not an overload (a 503 or 529
        # tells a client to come back soon), a bad gateway, said at once (error_headers)
        status, kind, code = 502, "api_error", "upstream_unreachable"
    elif isinstance(err, ServerUnavailableError):
        status, kind = 503, "unavailable_error"
    elif isinstance(err, (ValueError, TypeError)):
        status, kind = 400, "invalid_request_error"
    elif isinstance(err, AbstractClientError):
        status = 502  # the backend failed or broke its protocol: a bad gateway
    message = err.message if isinstance(err, AbstractClientError) else str(err)
    body = openai_error(message or type(err).__name__, kind, code)
    if isinstance(err, AbstractClientError) and err.partial_text:
        body["error"]["partial_text"] = err.partial_text
    return status, body


def error_headers(err: BaseException) -> list[tuple[bytes, bytes]]:
    """Headers of an error answer: an unreachable upstream says ``x-should-retry: false``, which
    openai-python and the anthropic SDK obey. Their retries within a second or two would meet
    the same closed port, and keep the caller waiting for the error it will get anyway; the
    gateway's ``/ready`` tells the load balancer, which sends the next request elsewhere."""
    if isinstance(err, ConnectionFailedError):
        return [(b"x-should-retry", b"false")]
    return []


def openai_error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": kind, "code": code}}


class ChatFrames:
    """OpenAI's chat (or completions) stream frames of one answer, ``[DONE]`` at its end (the
    gateway's ``sinks.ClientStream`` writes them)."""

    def __init__(self, request_id: str, model: str, *, chat: bool, include_usage: bool) -> None:
        self.request_id, self.model, self.chat, self.include_usage = request_id, model, chat, include_usage
        self.created = int(time.time())
        self.encoder = FrameEncoder(request_id, model, self.created, chat=chat)

    def chunk(self, chunk: StreamChunk) -> bytes:
        return self.encoder.encode(chunk)

    def end(self, result: GenerateResult) -> bytes:
        if not self.include_usage:
            return b"data: [DONE]\n\n"
        usage = usage_frame(result, self.request_id, self.model, self.created, chat=self.chat)
        return sse(usage) + b"data: [DONE]\n\n"

    def failure(self, err: Exception) -> bytes:
        return sse(error_body(err)[1])
