"""The OpenAI Responses API, from the gateway's side: a ``/v1/responses`` body into the chat
body every generation route already validates (``chat_server.generation_args``), and a
generation's chunks into the Responses stream events and ``response`` object. Pure functions
and one builder per response; no I/O."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..errors import GenerationCancelledError
from ..types import GenerateResult, StreamChunk, ToolCallDelta
from .chat_server import _PASSTHROUGH, BadRequest, error_body

__all__ = ["ResponseBuilder", "ResponseFrames", "chat_body_of", "encode_event"]

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{key} must be true or false, not {str(value)[:40]!r}")
    return value


def _content(content: Any, where: str) -> Any:
    """A Responses message's content as chat content (text parts → text, ``input_image`` → an
    ``image_url`` part)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            text = part.get("refusal" if kind == "refusal" else "text")
            if not isinstance(text, str):
                raise BadRequest(f"{where}.content[{n}].text must be a string")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise BadRequest(f"{where}.content[{n}]: an input_image needs an image_url (file ids are not served)")
            detail = part.get("detail") or "auto"
            if detail not in ("auto", "low", "high"):
                raise BadRequest(f"{where}.content[{n}].detail must be auto, low or high")
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": detail}})
        else:
            raise BadRequest(f"{where}.content[{n}]: part type {str(kind)[:40]!r} is not supported")
    return parts


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``instructions`` + ``input`` as chat messages: a ``function_call`` item joins the assistant
    turn before it, a ``function_call_output`` is a tool message, a ``reasoning`` item is dropped
    (the model reasons anew)."""
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()  # the call ids the input's function_calls made
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions must be a string")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("input must be a string or a non-empty list of items")
    for n, item in enumerate(items):
        where = f"input[{n}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message" and "role" in item and "content" in item:
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise BadRequest(f"{where}.role must be user, assistant, system or developer")
            messages.append(
                {"role": "system" if role == "developer" else role, "content": _content(item.get("content"), where)}
            )
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not name or not isinstance(arguments, str):
                raise BadRequest(f"{where}: a function_call needs string call_id, name and arguments")
            try:  # a call's arguments are a JSON object: a truncated one is no call to replay
                parsed = json.loads(arguments or "{}")
            except ValueError:
                raise BadRequest(f"{where}: the function_call's arguments are not JSON") from None
            if not isinstance(parsed, dict):
                raise BadRequest(f"{where}: the function_call's arguments must be a JSON object")
            calls.add(call_id)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not isinstance(output, str):
                raise BadRequest(f"{where}: a function_call_output needs a string call_id and output")
            if call_id not in calls:
                raise BadRequest(
                    f"{where}: a function_call_output for call_id {call_id[:40]!r}, which no function_call made"
                )
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            continue
        else:
            raise BadRequest(f"{where}: item type {str(kind)[:40]!r} is not supported")
    return messages


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list")
    out = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise BadRequest(f"tools[{n}]: only function tools are served, not {str(kind)[:40]!r}")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise BadRequest(f"tools[{n}].name must be a non-empty string")
        if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
            raise BadRequest(f"tools[{n}].strict must be true or false")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest('tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}')


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise BadRequest("text must be an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
            raise BadRequest("text.format json_schema needs a string name and an object schema")
        if fmt.get("strict") is not None and not isinstance(fmt["strict"], bool):
            raise BadRequest("text.format.strict must be true or false")
        return {"type": "json_schema", "json_schema": {"name": fmt["name"], "schema": fmt["schema"]}}
    raise BadRequest("text.format.type must be text, json_object or json_schema")


def chat_body_of(body: Any) -> tuple[dict[str, Any], bool, bool]:
    """``(the chat body it amounts to, stream?, background?)`` for a ``/v1/responses`` body."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    for unsupported in ("previous_response_id", "conversation", "prompt"):
        if body.get(unsupported) is not None:
            raise BadRequest(f"{unsupported} is not supported: send the whole input")
    stream, background = _flag(body, "stream", False), _flag(body, "background", False)
    if not _flag(body, "store", True) and background:
        raise BadRequest("a background response is stored: background needs store true")
    chat: dict[str, Any] = {"messages": _messages(body), "stream": stream}
    for key in ("model", "temperature", "seed", "stop", *_PASSTHROUGH):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    tools = _tools(body)
    choice = None if body.get("tool_choice") is None else _tool_choice(body["tool_choice"])
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
    fmt = _response_format(body)
    if fmt is not None:
        chat["response_format"] = fmt
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise BadRequest("reasoning must be an object")
        effort = reasoning.get("effort")
        if effort is not None:
            if effort not in ("none", "minimal", "low", "medium", "high"):
                raise BadRequest(
                    f"reasoning.effort must be none, minimal, low, medium or high, not {str(effort)[:40]!r}"
                )
            chat["reasoning_effort"] = effort
    return chat, stream, background


def encode_event(event: dict[str, Any]) -> bytes:
    """One event on the wire: ``event: <type>`` and its JSON ``data``."""
    return b"event: %s\ndata: %s\n\n" % (event["type"].encode(), json.dumps(event, separators=(",", ":")).encode())


def new_response_id(prefix: str = "") -> str:
    return f"resp_{prefix}{uuid.uuid4().hex}"


class ResponseBuilder:
    """One response: its events, numbered from 0, and its ``response`` object at any moment
    (what ``GET /v1/responses/{id}`` shows while it runs)."""

    def __init__(self, response_id: str, model: str, body: dict[str, Any], *, background: bool) -> None:
        self.id, self.model = response_id, model
        self.created_at = int(time.time())
        self.status = "queued" if background else "in_progress"
        self.background = background
        self.echo = {k: body.get(k) for k in ("instructions", "max_output_tokens", "temperature", "top_p", "tools")}
        self.echo["tool_choice"] = body.get("tool_choice", "auto")
        self.echo["text"] = body.get("text") or {"format": {"type": "text"}}
        self.echo["store"] = body.get("store", True)
        self.output: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete: dict[str, Any] | None = None
        self.sequence = 0
        self.began = False  # response.created was sent
        self._open: dict[str, Any] | None = None  # the output item the deltas go to
        self._calls: dict[int, dict[str, Any]] = {}  # tool-call index → its function_call item

    # -- the response object --------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": self.background,
            "model": self.model,
            "output": [_public(item) for item in self.output],
            "usage": self.usage,
            "error": self.error,
            "incomplete_details": self.incomplete,
            "parallel_tool_calls": True,
            "metadata": {},
            **self.echo,
        }

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    # -- events ---------------------------------------------------------------------------------

    def started(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``: the first events (a foreground
        stream sends them with its first chunk, so an error before it keeps its own status)."""
        if self.began:
            return []
        self.began, self.status = True, "in_progress"
        return [
            self._event("response.created", response=self.response()),
            self._event("response.in_progress", response=self.response()),
        ]

    def chunk(self, chunk: StreamChunk) -> list[dict[str, Any]]:
        if not (chunk.reasoning or chunk.delta or chunk.tool_call):
            return []
        events = self.started()
        if chunk.reasoning:
            events += self._text_delta("reasoning", "response.reasoning_text.delta", chunk.reasoning)
        if chunk.delta:
            events += self._text_delta("message", "response.output_text.delta", chunk.delta, logprobs=[])
        piece = chunk.tool_call
        if piece is not None:
            call = self._calls.get(piece.index)
            if call is None:
                events += self._close()
                call = self._calls[piece.index] = self._add(
                    {
                        "type": "function_call",
                        "id": f"fc_{uuid.uuid4().hex[:24]}",
                        "call_id": piece.id or f"call_{uuid.uuid4().hex[:24]}",
                        "name": piece.name or "",
                        "arguments": "",
                        "status": "in_progress",
                    }
                )
                events.append(
                    self._event("response.output_item.added", output_index=call["_index"], item=_public(call))
                )
            elif self._open is not call:
                events += self._close()
                self._open = call
            if piece.arguments_fragment:
                call["arguments"] += piece.arguments_fragment
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=call["id"],
                        output_index=call["_index"],
                        delta=piece.arguments_fragment,
                    )
                )
        return events

    def _text_delta(self, item_type: str, kind: str, text: str, **fields: Any) -> list[dict[str, Any]]:
        """``text`` into the open item of ``item_type`` (a new one if another is open)."""
        events = self._into(item_type)
        item = self._open
        assert item is not None
        item["_text"] += text
        location = {"item_id": item["id"], "output_index": item["_index"], "content_index": 0}
        return [*events, self._event(kind, **location, delta=text, **fields)]

    def whole(self, result: GenerateResult) -> dict[str, Any]:
        """A whole answer (not streamed) as one ``response`` object: its chunks as a stream of it
        would have been (the builder's one path), then its end."""
        chunks = [StreamChunk(reasoning=result.reasoning or ""), StreamChunk(delta=result.content or "")]
        for n, call in enumerate(result.tool_calls or []):
            fragment = json.dumps(call.arguments)
            chunks.append(
                StreamChunk(tool_call=ToolCallDelta(index=n, id=call.id, name=call.name, arguments_fragment=fragment))
            )
        for chunk in chunks:
            self.chunk(chunk)
        self.finished(result)
        return self.response()

    def finished(self, result: GenerateResult) -> list[dict[str, Any]]:
        events = self.started() + self._close()
        for call in result.tool_calls or []:  # the contract's checked calls: the arguments as sent
            if not any(item.get("call_id") == call.id for item in self.output):
                self._add(
                    {
                        "type": "function_call",
                        "id": f"fc_{uuid.uuid4().hex[:24]}",
                        "call_id": call.id,
                        "name": call.name,
                        "arguments": json.dumps(call.arguments),
                        "status": "completed",
                    }
                )
        if not self.output:  # an empty answer is still a message
            events += self._into("message") + self._close()
        usage = result.usage
        if usage is not None and usage.prompt_tokens is not None and usage.completion_tokens is not None:
            self.usage = {
                "input_tokens": usage.prompt_tokens,
                "input_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            }
        if result.finish_reason == "length":
            self.status, self.incomplete = "incomplete", {"reason": "max_output_tokens"}
            return [*events, self._event("response.incomplete", response=self.response())]
        self.status = "completed"
        return [*events, self._event("response.completed", response=self.response())]

    def failed(self, err: BaseException) -> list[dict[str, Any]]:
        """A background response's end other than an answer: a stop is ``cancelled``, anything
        else ``failed``; either way the stream's last event (an ``error`` for a stop, which has
        no event of its own in the API) says so, so a reader never waits on a silent stream."""
        _, body = error_body(err)
        error = body["error"]
        if isinstance(err, GenerationCancelledError):
            events = self.started() + self._close()
            self.status = "cancelled"
            return [*events, self._event("error", code="response_cancelled", message=error["message"], param=None)]
        return self.failed_with(error.get("code") or error.get("type") or "server_error", error["message"])

    def failed_with(self, code: str, message: str) -> list[dict[str, Any]]:
        events = self.started() + self._close()
        self.status, self.error = "failed", {"code": code, "message": message}
        return [*events, self._event("response.failed", response=self.response())]

    # -- output items ---------------------------------------------------------------------------

    def _add(self, item: dict[str, Any]) -> dict[str, Any]:
        item["_index"] = len(self.output)
        self.output.append(item)
        self._open = item
        return item

    def _into(self, kind: str) -> list[dict[str, Any]]:
        """Open an output item of ``kind`` unless it is the one open."""
        if self._open is not None and self._open["type"] == kind:
            return []
        events = self._close()
        prefix = "msg" if kind == "message" else "rs"
        item: dict[str, Any] = {"type": kind, "id": f"{prefix}_{uuid.uuid4().hex[:24]}", "_text": ""}
        if kind == "message":
            item.update(role="assistant", status="in_progress", content=[])
        else:
            item.update(summary=[], content=[])
        self._add(item)
        events.append(self._event("response.output_item.added", output_index=item["_index"], item=_public(item)))
        if kind == "message":
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=item["_index"],
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        return events

    def _close(self) -> list[dict[str, Any]]:
        """The ``*.done`` events of the open item."""
        item, self._open = self._open, None
        if item is None or item.get("status") == "completed":
            return []
        where = {"item_id": item["id"], "output_index": item["_index"]}
        events = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": item["_text"], "annotations": []}
            item["content"] = [part]
            events.append(
                self._event("response.output_text.done", **where, content_index=0, text=item["_text"], logprobs=[])
            )
            events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        elif item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": item["_text"]}]
            events.append(self._event("response.reasoning_text.done", **where, content_index=0, text=item["_text"]))
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]
                )
            )
        item["status"] = "completed"
        events.append(self._event("response.output_item.done", output_index=item["_index"], item=_public(item)))
        return events


def _public(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the wire shows it (without the builder's own fields; an open item with
    its text so far)."""
    out = {k: v for k, v in item.items() if not k.startswith("_")}
    if item.get("status") != "completed" and item.get("_text"):
        if item["type"] == "message":
            out["content"] = [{"type": "output_text", "text": item["_text"], "annotations": []}]
        elif item["type"] == "reasoning":
            out["content"] = [{"type": "reasoning_text", "text": item["_text"]}]
    return out


class ResponseFrames:
    """The Responses API's events of one response, as a stream's frames (the gateway's
    ``sinks.ClientStream`` writes them)."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder

    def chunk(self, chunk: StreamChunk) -> bytes:
        return b"".join(encode_event(e) for e in self.builder.chunk(chunk))

    def end(self, result: GenerateResult) -> bytes:
        return b"".join(encode_event(e) for e in self.builder.finished(result))

    def failure(self, err: Exception) -> bytes:
        return b"".join(encode_event(e) for e in self.builder.failed(err))
