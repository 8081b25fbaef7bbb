"""LM Studio's native wire: ``/api/v1/chat`` (SSE events ``message.delta``,
``reasoning.delta``, ``chat.end``; one JSON ``result`` when not streaming).

Sans-io: the request's ``input`` (:func:`native_input`: text, or message and image items) and
the answer's ``result`` as the final chunk (:func:`chunk_from_result`: its ``output`` items,
``stats``). Malformed results are ``ProviderProtocolError`` (fuzzed: ``tests/test_wires.py``).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from ..errors import ProviderProtocolError
from ..http.chunk_decoder import SSEChunks
from ..http.mapping import error_from_response
from ..http.sse import SSEEvent
from ..http.wire import load_frame
from ..images import base64_payload
from ..provider import Completion
from ..types import GenerationRequest, StreamChunk, Timings, Usage
from .wire import Wire, register

__all__ = ["LMSTUDIO", "LMStudioChunks", "chunk_from_result", "lmstudio_body", "native_input"]


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def chunk_from_result(result: Any, delta: str | None) -> StreamChunk:
    if not isinstance(result, dict):
        raise ProviderProtocolError(f"unexpected LM Studio result: {str(result)[:200]}")
    stats, output = result.get("stats") or {}, result.get("output") or []
    if not isinstance(stats, dict) or not isinstance(output, list):  # a str, a number: not a result
        raise ProviderProtocolError(f"malformed LM Studio result: {str(result)[:200]}")
    outputs = [o for o in output if isinstance(o, dict)]
    text = "".join(str(o.get("content", "")) for o in outputs if o.get("type") == "message")
    reasoning = "".join(str(o.get("content", "")) for o in outputs if o.get("type") == "reasoning")
    n_in, n_out = stats.get("input_tokens"), stats.get("total_output_tokens")
    ttft, rate, model = (
        stats.get("time_to_first_token_seconds"),
        stats.get("tokens_per_second"),
        result.get("model_instance_id"),
    )
    return StreamChunk(
        delta=text if delta is None else delta,
        reasoning=reasoning if delta is None else "",
        finish_reason="stop",
        usage=Usage(
            prompt_tokens=n_in if isinstance(n_in, int) else None,
            completion_tokens=n_out if isinstance(n_out, int) else None,
        ),
        timings=Timings(
            ttft_ms=ttft * 1000 if _number(ttft) else None,
            tokens_per_s=float(rate) if _number(rate) else None,
        ),
        model=model if isinstance(model, str) else None,
        raw=result,
    )


def native_input(content: Any) -> Any:
    """``/api/v1/chat``'s ``input``: the text, or — with images — a list of ``{"type": "message",
    "content"}`` and ``{"type": "image", "data_url"}`` items in the parts' order (data URLs
    only: LM Studio fetches nothing)."""
    if not isinstance(content, list):
        return content
    if not any(p.get("type") == "image_url" for p in content):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    items: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "image_url":
            mime, payload = base64_payload(part, "lmstudio")
            items.append({"type": "image", "data_url": f"data:{mime};base64,{payload}"})
        elif part.get("type") == "text":
            items.append({"type": "message", "content": part.get("text", "")})
    return items


def lmstudio_body(request: GenerationRequest, stream: bool) -> dict[str, Any]:
    """``/api/v1/chat``'s body: one ``input`` (the last turn), the system prompt apart."""
    extra = dict(request.extra)
    extra.pop("native", None)
    system = "\n".join(str(m.get("content", "")) for m in request.messages if m.get("role") == "system")
    turns = [m for m in request.messages if m.get("role") != "system"]
    if len(turns) > 1:
        raise ValueError("LM Studio's native chat takes one input; use the /v1 route for multi-turn messages")
    body: dict[str, Any] = {
        "model": request.model,
        "input": native_input(turns[-1].get("content") or "") if turns else "",
        "stream": stream,
    }
    if system:
        body["system_prompt"] = system
    if request.max_tokens is not None:
        body["max_output_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.reasoning is not None:
        level = request.reasoning
        body["reasoning"] = level if isinstance(level, str) else ("on" if level else "off")
    body.update(extra)
    return body


class LMStudioChunks(SSEChunks):
    """Named SSE events (``message.delta``, ``reasoning.delta``, ``error``), ending with ``chat.end``
    (no ``[DONE]``)."""

    cut = "the LM Studio stream ended before chat.end"

    def event(self, event: SSEEvent) -> list[StreamChunk]:
        data = load_frame(event.data)
        if event.event == "error":
            raise error_from_response(200, data if isinstance(data, dict) else {"error": str(data)})
        if event.event == "message.delta":
            return [StreamChunk(delta=str(data.get("content", "")), raw=data)]
        if event.event == "reasoning.delta":
            return [StreamChunk(reasoning=str(data.get("content", "")), raw=data)]
        if event.event == "chat.end":
            self.finished = self.done = True
            return [chunk_from_result(data.get("result") if isinstance(data, dict) else None, delta="")]
        return []


def _whole_result(body: Any) -> Completion:
    return Completion.from_chunk(chunk_from_result(body, delta=None), raw=body)


LMSTUDIO = register(
    Wire(
        "lmstudio",
        "/api/v1/chat",
        lmstudio_body,
        LMStudioChunks,
        _whole_result,
        frozenset({"lmstudio"}),
        image_urls=False,
    )
)
