"""The call boundary: what a caller passes is checked before anything is held or sent.

A wrong argument is a ``TypeError`` or ``ValueError`` at the call site, never a
``ProviderProtocolError`` after connecting, an "unhandled errors in a TaskGroup", or a value
passed upstream unchecked (the gateway maps these errors to a 400 with an OpenAI error body).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import httpx

__all__ = [
    "MAX_TOKENS_LIMIT",
    "check_base_url",
    "check_dimensions",
    "check_generation",
    "check_messages",
    "check_request_id",
    "check_text",
    "check_wire_json",
]

_ROLES = ("system", "developer", "user", "assistant", "tool")
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,200}")  # printable ASCII, no spaces, no CR/LF
MAX_TOKENS_LIMIT = 2**31 - 1
_OTHER_IMAGE_PARTS = ("input_image", "image")  # the Responses API's and Anthropic's image part names


def check_text(value: str, what: str) -> str:
    """A string that can be sent as UTF-8 (no lone surrogate such as ``"\\ud800"``)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode ({exc.reason} at index {exc.start})") from None
    return value


def check_messages(messages: object) -> None:
    """OpenAI-style messages: a list of dicts with a known ``role`` and string, list-of-parts or
    null ``content``; every text valid Unicode."""
    if not isinstance(messages, list):
        raise TypeError(f"messages must be a list of dicts, not {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', not {type(message).__name__}")
        role = message.get("role")
        if role not in _ROLES:
            raise ValueError(f"messages[{i}]['role'] must be one of {_ROLES}, not {role!r}")
        content = message.get("content")
        if isinstance(content, str):
            check_text(content, f"messages[{i}]['content']")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                    raise TypeError(f"messages[{i}]['content'][{j}] must be a content part dict with a 'type'")
                if part["type"] in _OTHER_IMAGE_PARTS:  # they would pass the image checks by
                    raise ValueError(
                        f"messages[{i}]['content'][{j}]: a {part['type']!r} part is not sent; images go as "
                        "'image_url' parts (abstract_client.image_part), where their size and source are checked"
                    )
                if part["type"] == "text" and not isinstance(part.get("text"), str):
                    raise TypeError(f"messages[{i}]['content'][{j}]['text'] must be a string")
                if isinstance(part.get("text"), str):
                    check_text(part["text"], f"messages[{i}]['content'][{j}]['text']")
        elif content is not None:
            raise TypeError(
                f"messages[{i}]['content'] must be a string, a list of parts or None, not {type(content).__name__}"
            )
        _check_tool_fields(message, i)


def _check_tool_fields(message: Mapping[str, Any], i: int) -> None:
    """A history's tool calls and tool answers, in OpenAI's shape (a server refuses others)."""
    call_id = message.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise TypeError(f"messages[{i}]['tool_call_id'] must be a string, not {type(call_id).__name__}")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise TypeError(f"messages[{i}]['tool_calls'] must be a list, not {type(calls).__name__}")
    for j, call in enumerate(calls):
        if callable(getattr(call, "to_message", None)):  # a ToolCall of an earlier answer
            continue
        function = call.get("function") if isinstance(call, Mapping) else None
        if (
            not isinstance(function, Mapping)
            or not isinstance(call.get("id"), (str, type(None)))
            or call.get("type") not in ("function", None)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), (str, Mapping))  # Ollama's wire takes an object
        ):
            raise TypeError(
                f"messages[{i}]['tool_calls'][{j}] must be a ToolCall or a function call dict (a string "
                "'id', 'type' 'function', a 'function' with a string 'name' and 'arguments')"
            )


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, not {value!r}")
    return float(value)


def _integer(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}")
    return value


def check_generation(options: Mapping[str, Any]) -> None:
    """The sampling options of a generation (whatever lane will receive them)."""
    if options.get("max_tokens") is not None:
        n = _integer(options["max_tokens"], "max_tokens")
        if not 1 <= n <= MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens must be between 1 and {MAX_TOKENS_LIMIT}, not {n}")
    if options.get("temperature") is not None and _number(options["temperature"], "temperature") < 0:
        raise ValueError("temperature must be >= 0")
    if options.get("model") is not None:
        if not isinstance(options["model"], str):
            raise TypeError(f"model must be a string, not {type(options['model']).__name__}")
        check_text(options["model"], "model")
    if options.get("seed") is not None and not -(2**63) <= _integer(options["seed"], "seed") < 2**64:
        raise ValueError("seed must fit in 64 bits")  # a 4,000-digit seed went upstream
    min_tokens = options.get("min_tokens")
    if min_tokens is not None and not 0 <= _integer(min_tokens, "min_tokens") <= MAX_TOKENS_LIMIT:
        raise ValueError(f"min_tokens must be between 0 and {MAX_TOKENS_LIMIT}")
    if options.get("ignore_eos") is not None and not isinstance(options["ignore_eos"], bool):
        raise TypeError(f"ignore_eos must be true or false, not {type(options['ignore_eos']).__name__}")
    for key in ("top_p", "min_p"):
        if key in options and options[key] is not None and not 0 <= _number(options[key], key) <= 1:
            raise ValueError(f"{key} must be between 0 and 1")
    if "top_k" in options and options["top_k"] is not None and _integer(options["top_k"], "top_k") < 0:
        raise ValueError("top_k must be >= 0")
    for key in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        if key in options and options[key] is not None:
            _number(options[key], key)
    bias = options.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, Mapping):
            raise TypeError("logit_bias must map token ids to numbers")
        for token, value in bias.items():
            _number(value, f"logit_bias[{token!r}]")
    stop = options.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise TypeError("stop must be a string or a list of strings")
        for s in stops:
            check_text(s, "stop")


def check_wire_json(fields: Mapping[str, Any]) -> None:
    """Everything of a request that travels as JSON, checked as JSON before anything is sent: no
    NaN or infinity, no lone surrogate, no cycle, nothing nested past the parser. Fields that the
    checks above do not name (a message's ``name``, a tool call's arguments, lane-specific
    fields) used to fail only in the lane's encoder, as a ``ProviderProtocolError`` after
    connecting."""
    try:
        json.dumps(_without_long_texts(fields), allow_nan=False, ensure_ascii=False, default=_wire_form).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"the request holds text that is not valid Unicode ({exc.reason})") from None
    except RecursionError:
        raise ValueError("the request nests too deep to be sent as JSON") from None
    except ValueError as exc:  # NaN, infinity, a circular reference
        raise ValueError(f"the request cannot be sent as JSON: {exc}") from None


_CHECKED_TEXT_BUDGET = 256 * 1024  # characters of message text encoded again, at most


def _without_long_texts(fields: Mapping[str, Any]) -> Mapping[str, Any]:
    """``fields`` with the messages' texts and image URLs left out once they add up past
    ``_CHECKED_TEXT_BUDGET`` (the call boundary checked them: ``check_messages``,
    ``resolve_images``). Encoding 30 MB of text again is one C call of ~40-80 ms on the
    caller's event loop (the gateway's, for a large request)."""
    messages = fields.get("messages")
    if not isinstance(messages, list) or _text_size(messages) <= _CHECKED_TEXT_BUDGET:
        return fields
    light = []
    for message in messages:
        if isinstance(message, Mapping):
            content = message.get("content")
            if isinstance(content, str):
                message = {**message, "content": ""}
            elif isinstance(content, list):
                message = {**message, "content": [_light_part(p) if isinstance(p, Mapping) else p for p in content]}
        light.append(message)
    return {**fields, "messages": light}


def _text_size(messages: list[Any]) -> int:
    size = 0
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            size += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping):
                    text, image = part.get("text"), part.get("image_url")
                    size += len(text) if isinstance(text, str) else 0
                    url = image.get("url") if isinstance(image, Mapping) else None
                    size += len(url) if isinstance(url, str) else 0
    return size


def _light_part(part: Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(part.get("text"), str):
        return {**part, "text": ""}
    image = part.get("image_url")
    if isinstance(image, Mapping) and isinstance(image.get("url"), str):
        return {**part, "image_url": {**image, "url": ""}}
    return part


def _wire_form(value: Any) -> Any:
    to_message = getattr(value, "to_message", None)  # a ToolCall in an assistant turn
    if callable(to_message):
        return to_message()
    raise TypeError(f"the request holds a {type(value).__name__}, which is not JSON")


MAX_DIMENSIONS = 65_536


def check_dimensions(dimensions: object) -> None:
    """An embedding length: None (the model's own) or an integer 1..65,536."""
    if dimensions is None:
        return
    n = _integer(dimensions, "dimensions")
    if not 1 <= n <= MAX_DIMENSIONS:
        raise ValueError(f"dimensions must be between 1 and {MAX_DIMENSIONS}, not {n}")


def check_request_id(request_id: object) -> None:
    """A caller's request id: it travels in HTTP headers and logs, so printable ASCII only."""
    if not isinstance(request_id, str):
        raise TypeError(f"request_id must be a string, not {type(request_id).__name__}")
    if not _REQUEST_ID.fullmatch(request_id):
        raise ValueError(
            "request_id must be 1-200 printable ASCII characters without spaces or line breaks, "
            f"not {request_id[:40]!r}"
        )


def check_base_url(url: object) -> tuple[str, dict[str, str]]:
    """A server's base URL, and the headers its credentials become.

    ``http(s)://host[:port][/path]`` only; a URL with ``user:password@`` is accepted, and the
    credentials move into an ``Authorization: Basic`` header so that they never appear in the
    URL (``repr``, httpx's request log, error messages)."""
    if not isinstance(url, str):
        raise TypeError(f"base_url must be a string, not {type(url).__name__}")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"base_url {_redact(url)!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"base_url must start with http:// or https:// and name a host, not {_redact(url)!r}")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ValueError(f"base_url's port must be between 1 and 65535, not {parsed.port}")
    headers: dict[str, str] = {}
    if parsed.userinfo:
        user, _, password = parsed.userinfo.decode().partition(":")
        token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
        parsed = parsed.copy_with(username=None, password=None)
    return str(parsed), headers


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)
