"""The legacy ``/v1/completions`` dialect: a prompt in, text out, no chat template.

Not a wire a lane is asked for by name (it is not registered): the ``vllm`` lane takes it for
``raw=True``, and any ``"v1"`` lane speaks it when given the value itself
(``create_llm("llamacpp", wire=COMPLETIONS)``: ``tests/test_fifth_wire.py``,
docs/writing-a-lane.md). A chat-shaped call sends its last message's text as the prompt.
"""

from __future__ import annotations

from typing import Any

from ..errors import ProviderProtocolError
from ..provider import Completion
from ..types import GenerationRequest, StreamChunk
from .chat import ChatChunks, sampling_fields, usage_from
from .wire import Wire

__all__ = ["COMPLETIONS"]


def completions_body(request: GenerationRequest, stream: bool) -> dict[str, Any]:
    prompt = request.prompt if request.prompt is not None else _last_text(request.messages)
    body: dict[str, Any] = {"model": request.model, "prompt": prompt, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(sampling_fields(request))
    if request.response_format is not None:  # vLLM's field (a server that does not know it ignores it)
        body["structured_outputs"] = {"json": request.response_format.schema or {"type": "object"}}
    body.update(request.extra)
    return body


def _last_text(messages: list[Any]) -> str:
    content = messages[-1].get("content") if messages else ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def text_chunk(obj: Any) -> StreamChunk:
    """One ``text_completion`` frame (or a whole body) as a chunk."""
    if not isinstance(obj, dict):
        raise ProviderProtocolError(f"unexpected /v1/completions frame: {str(obj)[:200]}")
    choices = obj.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    text = choice.get("text", "")
    if not isinstance(text, str):
        raise ProviderProtocolError(f"malformed completion text: {str(text)[:200]}")
    finish = choice.get("finish_reason")
    return StreamChunk(
        delta=text,
        finish_reason=finish if isinstance(finish, str) else None,
        usage=usage_from(obj.get("usage")),
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
        raw=obj,
    )


COMPLETIONS = Wire(
    "completions",
    "/completions",
    completions_body,
    lambda: ChatChunks(text_chunk),
    lambda body: Completion.from_chunk(text_chunk(body), raw=body),
)
