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
from dataclasses import replace
from typing import Any

from ..errors import ProviderProtocolError
from ..images import base64_payload
from ..types import StreamChunk, Timings, ToolCallDelta, Usage
from .chat import tool_pieces, wire_messages

__all__ = ["chunk_from", "native_messages", "tool_calls_from"]


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
