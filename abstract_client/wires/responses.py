"""The OpenAI Responses API as a wire (``POST /v1/responses``), for the lanes that serve it.

Mapped onto the same ``StreamChunk`` / ``Completion`` as the chat wire, so the contract (stop,
tool-call checks, structured output, usage) is the one every call passes through:

* request: messages → ``input`` items (a tool result is a ``function_call_output``, an assistant
  turn's calls are ``function_call`` items), ``max_tokens`` → ``max_output_tokens``, tools in
  the flat ``{"type": "function", "name", ...}`` form, structured output as ``text.format``,
  reasoning as ``reasoning.effort``;
* stream: typed events — ``response.output_text.delta`` (content),
  ``response.reasoning_text.delta`` / ``response.reasoning_summary_text.delta`` (reasoning),
  ``response.output_item.added`` + ``response.function_call_arguments.delta`` (tool calls),
  ``response.completed`` / ``response.incomplete`` (the end, usage), ``response.failed`` and
  ``error`` (a typed error). Every event carries a ``sequence_number``: a background response
  is resumed after the last one handed out (``GET /v1/responses/{id}?stream=true&starting_after=N``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from ..errors import ProviderProtocolError
from ..http.chunk_decoder import SSEChunks
from ..http.mapping import error_from_response
from ..http.sse import SSEDecoder, SSEEvent
from ..http.wire import drain, load_frame
from ..provider import Completion
from ..types import GenerationRequest, Message, StreamChunk, ToolCall, ToolCallDelta, Usage
from .timings import timings_from
from .wire import Wire, register

__all__ = [
    "RESPONSES",
    "TERMINAL_EVENTS",
    "ResponseEvents",
    "ResponsesChunks",
    "completion_from_response",
    "response_events",
    "responses_body",
]

# the events after which a response's stream has nothing more to say (a background stream
# replayed by vLLM stays open after an error: the reader stops here, not at the connection's end)
TERMINAL_EVENTS = frozenset(("response.completed", "response.incomplete", "response.failed", "error"))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _content_parts(content: Any, role: str) -> Any:
    """Chat content → Responses content: text parts are ``input_text`` (``output_text`` in an
    assistant turn), image parts ``input_image``."""
    if not isinstance(content, list):
        return content if content is not None else ""
    text_type = "output_text" if role == "assistant" else "input_text"
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({"type": text_type, "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            detail = image.get("detail") if isinstance(image, dict) else None
            parts.append({"type": "input_image", "image_url": url, "detail": detail or "auto"})
        else:
            parts.append(part)
    return parts


def responses_input(messages: list[Message]) -> list[dict[str, Any]]:
    """Chat messages as Responses ``input`` items."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = str(message.get("role", "user"))
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": _text_of(message.get("content")),
                }
            )
            continue
        calls = message.get("tool_calls") or []
        content = message.get("content")
        if not calls or content:
            items.append({"role": role, "content": _content_parts(content, role)})
        for call in calls:
            wire = call.to_message() if isinstance(call, ToolCall) else call
            fn = wire.get("function", {})
            arguments = fn.get("arguments", "")
            items.append(
                {
                    "type": "function_call",
                    "call_id": wire.get("id"),
                    "name": fn.get("name"),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                }
            )
    return items


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function")
    if tool.get("type") != "function" or not isinstance(fn, dict):
        return tool  # already in the Responses form, or a server's own tool type
    return {"type": "function", **fn}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def responses_body(request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
    """The ``/v1/responses`` body for a request (a lane adds its own fields and ``extra``)."""
    body: dict[str, Any] = {
        "model": request.model or "default",
        "input": responses_input(request.messages),
        "stream": stream,
        "store": False,  # a foreground response is not kept (a background one must be)
    }
    for key, value in (
        ("max_output_tokens", request.max_tokens),
        ("temperature", request.temperature),
        ("seed", request.seed),
        ("stop", request.stop or None),
    ):
        if value is not None:
            body[key] = value
    if request.tools:
        body["tools"] = [_tool(t) for t in request.tools]
        if request.tool_choice is not None:
            body["tool_choice"] = _tool_choice(request.tool_choice)
    fmt = request.response_format
    if fmt is not None:
        body["text"] = {
            "format": {"type": "json_object"}
            if fmt.schema is None
            else {"type": "json_schema", "name": fmt.name, "schema": fmt.schema, "strict": True}
        }
    if request.reasoning is not None:
        effort = request.reasoning if isinstance(request.reasoning, str) else None
        body["reasoning"] = {"effort": effort or ("medium" if request.reasoning else "none")}
    return body


def _usage(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    prompt, completion = obj.get("input_tokens"), obj.get("output_tokens")
    details = obj.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=prompt if isinstance(prompt, int) else None,
        completion_tokens=completion if isinstance(completion, int) else None,
        cached_tokens=cached if isinstance(cached, int) and not isinstance(cached, bool) else None,
    )


def _finish(response: dict[str, Any], called: bool) -> str:
    """A response's status as a chat ``finish_reason``."""
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return "length" if reason in (None, "max_output_tokens") else str(reason)
    return "tool_calls" if called else "stop"


def _raise_failed(response: dict[str, Any]) -> None:
    error = response.get("error")
    if response.get("status") == "failed" or error:
        raise error_from_response(200, {"error": error if isinstance(error, dict) else {"message": str(error)}})


def _position(event: dict[str, Any], item_id: Any) -> Any:
    """Which output item an event is about: its ``output_index`` (OpenAI, vLLM), else the
    item's id (llama-server sends no index)."""
    index = event.get("output_index")
    return index if isinstance(index, int) and not isinstance(index, bool) else item_id


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class ResponseEvents:
    """Responses stream events → chunks, for one response (it numbers the tool calls and keeps
    the response's id, which a resume and a cancel name)."""

    def __init__(self, response_id: str | None = None) -> None:
        self.response_id = response_id
        self.finished = False
        self._calls: dict[Any, int] = {}  # output_index (or the item's id) → tool-call index
        self._arguments: dict[int, str] = {}  # tool-call index → the arguments text handed out
        self._text_seen = False  # a text delta was handed out

    def chunks(self, event: Any) -> list[StreamChunk]:
        if not isinstance(event, dict):
            raise ProviderProtocolError(f"responses stream: expected a JSON object, got {str(event)[:200]}")
        kind = event.get("type")
        if kind == "response.output_text.delta":
            self._text_seen = True
            return [StreamChunk(delta=str(event.get("delta", "")), raw=event)]
        if kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            return [StreamChunk(reasoning=str(event.get("delta", "")), raw=event)]
        if kind == "response.function_call_arguments.delta":
            index = self._calls.get(_position(event, event.get("item_id")))
            if index is None:
                raise ProviderProtocolError(f"arguments for a call that was not announced: {str(event)[:200]}")
            return [self._arguments_piece(index, str(event.get("delta", "")), event)]
        if kind in ("response.output_item.added", "response.output_item.done"):
            return self._item(kind, event)
        if kind in ("response.created", "response.in_progress", "response.queued"):
            response = event.get("response")
            if isinstance(response, dict) and self.response_id is None:
                self.response_id = _str(response.get("id"))
            return []
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            response = event.get("response")
            if not isinstance(response, dict):
                raise ProviderProtocolError(f"{kind} without its response: {str(event)[:200]}")
            _raise_failed(response)
            self.finished = True
            # a server that streamed no delta but put the answer in the final response: the text
            # is there, not "" (only when no delta came: the deltas already said it otherwise)
            whole = "" if self._text_seen else _output_text(response.get("output"))
            return [
                *([StreamChunk(delta=whole, raw=event)] if whole else []),
                StreamChunk(
                    finish_reason=_finish(response, bool(self._calls)),
                    usage=_usage(response.get("usage")),
                    timings=timings_from(event.get("timings")),  # llama-server's, beside the response
                    model=_str(response.get("model")),
                    raw=event,
                ),
            ]
        if kind == "error":
            raise error_from_response(200, {"error": {k: v for k, v in event.items() if k != "type"}})
        return []  # the *.done and content_part events repeat what the deltas said

    def _item(self, kind: str, event: dict[str, Any]) -> list[StreamChunk]:
        item = event.get("item")
        if not isinstance(item, dict) or item.get("type") != "function_call":
            return []
        position = _position(event, item.get("id"))
        index = self._calls.get(position)
        if index is None:
            index = self._calls[position] = len(self._calls)
            piece = ToolCallDelta(index=index, id=_str(item.get("call_id")), name=_str(item.get("name")))
            arguments = item.get("arguments")
            first = StreamChunk(tool_call=piece, raw=event)
            rest = self._arguments_piece(index, arguments, event) if isinstance(arguments, str) and arguments else None
            return [first] if rest is None else [first, rest]
        if kind == "response.output_item.done":  # a server that sent the arguments only whole
            arguments = item.get("arguments")
            sent = self._arguments.get(index, "")
            if isinstance(arguments, str) and len(arguments) > len(sent) and arguments.startswith(sent):
                return [self._arguments_piece(index, arguments[len(sent) :], event)]
        return []

    def _arguments_piece(self, index: int, fragment: str, event: Any) -> StreamChunk:
        self._arguments[index] = self._arguments.get(index, "") + fragment
        return StreamChunk(tool_call=ToolCallDelta(index=index, arguments_fragment=fragment), raw=event)


async def response_events(resp: httpx.Response) -> AsyncGenerator[Any, None]:
    """One connection's Responses events (decoded JSON), up to a terminal event or ``[DONE]``.
    A frame cut by the connection's end is dropped, never handed out half."""
    decoder = SSEDecoder()
    parts = resp.aiter_bytes()
    async for part in parts:
        for event in decoder.feed(part):
            if event.data.strip() == "[DONE]":
                await drain(parts)
                return
            frame = load_frame(event.data)
            yield frame
            if isinstance(frame, dict) and frame.get("type") in TERMINAL_EVENTS:
                return


class ResponsesChunks(SSEChunks):
    """A foreground ``/v1/responses`` stream: typed events up to a terminal one (or ``[DONE]``)."""

    cut = "the responses stream ended before its final event (response.completed)"

    def __init__(self) -> None:
        super().__init__()
        self._events = ResponseEvents()

    def event(self, event: SSEEvent) -> list[StreamChunk]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        frame = load_frame(event.data)
        chunks = self._events.chunks(frame)
        self.finished = self._events.finished
        self.done = isinstance(frame, dict) and frame.get("type") in TERMINAL_EVENTS
        return chunks


def _body(request: GenerationRequest, stream: bool) -> dict[str, Any]:
    return {**responses_body(request, stream=stream), **request.extra}


def _output_text(output: Any) -> str:
    """The message text of a response's ``output`` items."""
    if not isinstance(output, list):
        return ""
    return "".join(
        _text_of(item.get("content")) for item in output if isinstance(item, dict) and item.get("type") == "message"
    )


def completion_from_response(obj: Any) -> Completion:
    """A ``Completion`` from a Responses API ``response`` object (``stream: false``)."""
    if not isinstance(obj, dict) or obj.get("object") not in ("response", None) or "output" not in obj:
        raise ProviderProtocolError(f"unexpected /v1/responses body: {str(obj)[:200]}")
    _raise_failed(obj)
    output = obj.get("output")
    if not isinstance(output, list):
        raise ProviderProtocolError(f"malformed response output: {str(output)[:200]}")
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCallDelta] = []
    for item in output:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "message":
            content.append(_text_of(item.get("content")))
        elif kind == "reasoning":
            reasoning.append(_text_of(item.get("content")) or _text_of(item.get("summary")))
        elif kind == "function_call":
            arguments = item.get("arguments")
            calls.append(
                ToolCallDelta(
                    index=len(calls),
                    id=_str(item.get("call_id")),
                    name=_str(item.get("name")),
                    arguments_fragment=arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
                )
            )
    return Completion(
        timings=timings_from(obj.get("timings")),
        content="".join(content),
        finish_reason=_finish(obj, bool(calls)),
        usage=_usage(obj.get("usage")),
        model=_str(obj.get("model")),
        raw=obj,
        reasoning="".join(reasoning) or None,
        tool_calls=calls,
    )


RESPONSES = register(
    Wire(
        "responses",
        "/responses",
        _body,
        ResponsesChunks,
        completion_from_response,
        resumes=True,
        schema_field=lambda body, schema: body.update(
            text={"format": {"type": "json_schema", "name": "answer", "schema": schema}}
        ),
    )
)
