"""Ollama's native wire: ``/api/chat`` and ``/api/generate``, NDJSON.

Sans-io: messages in Ollama's shape (:func:`native_messages`: content parts → text +
``images``, tool-call arguments as objects, a tool answer named by its call), and each NDJSON
object as a chunk (:func:`chunk_from`: the final one's ``done_reason``, token counts and
nanosecond durations become ``finish_reason``, usage and timings in ms). Malformed objects are
``ProviderProtocolError`` (fuzzed: ``tests/test_wires.py``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ..errors import ProviderProtocolError
from ..http.chunk_decoder import ChunkDecoder
from ..http.ndjson import NDJSONDecoder
from ..http.wire import raise_if_error
from ..images import base64_payload
from ..provider import Completion, EmbeddingBatch
from ..types import GenerationRequest, StreamChunk, Timings, ToolCallDelta, Usage
from .chat import sampling_fields, tool_pieces, wire_messages
from .wire import Embeddings, Wire, register

__all__ = ["OLLAMA", "OllamaChunks", "chunk_from", "native_messages", "ollama_body", "tool_calls_from"]

# request fields that go to the body's top level, not into ``options``
_PASSTHROUGH = ("keep_alive", "format", "think", "tools", "truncate", "images", "suffix", "system", "template")


def native_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages in Ollama's native shape: content parts → text + ``images`` (base64 of the data
    URLs), tool-call arguments as objects, and a tool answer named by the call it answers."""
    names: dict[str, str] = {}
    out = []
    for message in wire_messages(messages):
        m = dict(message)
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = "".join(p.get("text", "") for p in content if p.get("type") == "text")
            images = [_base64_of(p) for p in content if p.get("type") == "image_url"]
            if images:
                m["images"] = images
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function", {})
                args = fn.get("arguments")
                names[str(c.get("id"))] = str(fn.get("name"))
                calls.append(
                    {
                        "function": {
                            "name": fn.get("name"),
                            "arguments": json.loads(args) if isinstance(args, str) and args else args or {},
                        }
                    }
                )
            m["tool_calls"] = calls
        if m.get("role") == "tool" and "tool_name" not in m and m.get("tool_call_id") in names:
            m["tool_name"] = names[m["tool_call_id"]]
        out.append(m)
    return out


def _base64_of(part: dict[str, Any]) -> str:
    return base64_payload(part, "ollama")[1]


def tool_calls_from(obj: dict[str, Any], first_index: int) -> list[ToolCallDelta]:
    message = obj.get("message")
    if not isinstance(message, dict) or not message.get("tool_calls"):
        return []
    pieces = tool_pieces(message["tool_calls"])
    return [replace(p, index=first_index + n, id=p.id or f"call_{uuid.uuid4().hex[:24]}") for n, p in enumerate(pieces)]


def chunk_from(obj: Any) -> StreamChunk:
    if not isinstance(obj, dict):
        raise ProviderProtocolError(f"unexpected Ollama object: {str(obj)[:200]}")
    message = obj.get("message")
    content = message.get("content", "") if isinstance(message, dict) else obj.get("response", "")
    thinking = (message if isinstance(message, dict) else obj).get("thinking") or ""
    if not isinstance(content, str) or not isinstance(thinking, str):
        raise ProviderProtocolError(f"malformed Ollama content: {str(obj)[:200]}")
    done = obj.get("done") is True
    usage = timings = None
    if done:

        def ms(key: str) -> float | None:
            v = obj.get(key)
            return v / 1e6 if isinstance(v, (int, float)) else None

        n_prompt, n_eval = obj.get("prompt_eval_count"), obj.get("eval_count")
        usage = Usage(
            prompt_tokens=n_prompt if isinstance(n_prompt, int) else None,
            completion_tokens=n_eval if isinstance(n_eval, int) else None,
        )
        prompt_ms, eval_ms = ms("prompt_eval_duration"), ms("eval_duration")
        timings = Timings(
            prompt_ms=prompt_ms,
            predicted_ms=eval_ms,
            prompt_tokens_per_s=(n_prompt / prompt_ms * 1000) if isinstance(n_prompt, int) and prompt_ms else None,
            tokens_per_s=(n_eval / eval_ms * 1000) if isinstance(n_eval, int) and eval_ms else None,
        )
    reason = obj.get("done_reason")
    return StreamChunk(
        delta=content,
        reasoning=thinking,
        finish_reason=(reason if isinstance(reason, str) else "stop") if done else None,
        usage=usage,
        timings=timings,
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
        raw=obj,
    )


def ollama_body(request: GenerationRequest, stream: bool) -> dict[str, Any]:
    """The ``/api/chat`` (or, raw, ``/api/generate``) body: ``stream`` always explicit (Ollama
    streams unless told not to), sampling into ``options`` (``max_tokens`` → ``num_predict``)."""
    extra = dict(request.extra)
    options: dict[str, Any] = dict(extra.pop("options", None) or {})
    options.update(sampling_fields(request, max_tokens_key="num_predict"))
    for key in ("num_ctx", "top_k", "top_p", "min_p", "repeat_penalty"):
        if key in extra:
            options[key] = extra.pop(key)
    body: dict[str, Any] = {"model": request.model, "stream": stream}
    if request.raw:
        body.update(prompt=request.prompt or "", raw=True)
    else:
        body["messages"] = native_messages(request.messages)
        if request.tools and request.tool_choice != "none":
            body["tools"] = request.tools
    if request.response_format is not None:
        body["format"] = request.response_format.schema or "json"
    if request.reasoning is not None:
        body["think"] = request.reasoning
    if options:
        body["options"] = options
    for key in _PASSTHROUGH:
        if key in extra:
            body[key] = extra.pop(key)
    body.update(extra)
    return body


class OllamaChunks(ChunkDecoder):
    """An NDJSON stream of ``/api/chat`` or ``/api/generate`` objects, up to ``done: true``."""

    def __init__(self) -> None:
        self._lines = NDJSONDecoder()
        self._calls = 0  # Ollama sends whole calls, each list indexed from 0: numbered across lines

    def feed(self, data: bytes) -> Iterator[StreamChunk]:
        return self._objects(self._lines.feed(data))

    def _objects(self, objects: list[Any]) -> Iterator[StreamChunk]:
        for obj in objects:
            raise_if_error(obj)
            chunk = chunk_from(obj)
            pieces = tool_calls_from(obj, self._calls)
            self._calls += len(pieces)
            for piece in pieces:
                yield StreamChunk(tool_call=piece, raw=obj)
            yield chunk
            if obj.get("done") is True:
                self.done = True
                return

    def end(self) -> Iterator[StreamChunk]:
        yield from self._objects(self._lines.close())
        if not self.done:
            raise ProviderProtocolError("the Ollama stream ended before its final object (done: true)")


def _path_for(request: GenerationRequest) -> str:
    return "/api/generate" if request.raw else "/api/chat"  # raw: a plain prompt, no template


def completion_of(obj: Any) -> Completion:
    raise_if_error(obj)
    completion = Completion.from_chunk(chunk_from(obj), raw=obj)
    completion.tool_calls = tool_calls_from(obj, 0)
    return completion


def _embed_body(texts: list[str], model: str | None, dimensions: int | None, extra: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "input": texts}
    if dimensions is not None:
        body["dimensions"] = dimensions
    body.update({k: v for k, v in extra.items() if k in ("keep_alive", "truncate", "options")})
    return body


def _embed_batch(obj: Any) -> EmbeddingBatch:
    """``/api/embed``'s answer (all-or-nothing per request on Ollama's side)."""
    vectors = obj.get("embeddings") if isinstance(obj, dict) else None
    if not isinstance(vectors, list) or not all(
        isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) for v in vectors
    ):
        raise ProviderProtocolError(f"unexpected /api/embed body: {str(obj)[:200]}")
    n_prompt = obj.get("prompt_eval_count")
    return EmbeddingBatch(
        vectors=[[float(x) for x in v] for v in vectors],
        usage=Usage(prompt_tokens=n_prompt if isinstance(n_prompt, int) else None),
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
    )


OLLAMA = register(
    Wire(
        "ollama",
        "/api/chat",
        ollama_body,
        OllamaChunks,
        completion_of,
        frozenset({"ollama"}),
        _path_for,
        schema_field=lambda body, schema: body.update(format=schema),
        image_urls=False,
        embeddings=Embeddings("/api/embed", _embed_body, _embed_batch),
    )
)
