"""What the gateway's OpenAPI document cannot say, said to schemathesis (``SCHEMATHESIS_HOOKS``).

JSON Schema cannot tie one field's value to another's, and OpenAI (the upstream in the test too)
refuses with a 400 a chat body that:

* names in ``tool_choice`` a function that is not in ``tools``, or asks for ``"required"`` with
  no tools, or names two tools alike;
* answers with a ``tool`` message a call no earlier message made, or carries a tool call whose
  ``arguments`` are not JSON text;
* (Messages) answers with a ``tool_result`` a ``tool_use`` no earlier turn made, leaves a
  ``tool_use`` unanswered or uses its id twice, or gives a thinking budget not below
  ``max_tokens``;
* gives a tool ``parameters`` (``input_schema``) that are an object but not a JSON Schema (``{"if": []}``: the
  document says "an object"; the metaschema is not repeated in it).

Before such a body is sent it is made consistent (``tool_choice`` becomes ``"none"``, a second
name is suffixed, the stray tool answer a user message, the arguments ``"{}"``): still valid by
the schema, still whatever it was otherwise. This runs in every phase (the coverage phase
applies no generation hooks); every check stays on (``--checks all``).
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis

from abstract_client.output.structured import _check_schema


def _valid_schema(parameters: Any) -> Any:
    """``parameters`` if it is a JSON Schema the gateway takes, else the smallest one."""
    if not isinstance(parameters, dict):
        return parameters
    try:
        _check_schema(parameters)
    except (ValueError, TypeError):
        return {"type": "object"}
    return parameters


def _function_names(tools: Any) -> set[str]:
    return {
        t["function"]["name"]
        for t in (tools if isinstance(tools, list) else [])
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
    }


def _flat_tools(body: dict[str, Any], schema_key: str) -> set[Any]:
    """A flat tool list (``{"name", schema_key}``: Responses, Messages) with its names made
    unique and its schemas valid; the names."""
    names: set[Any] = set()
    for i, tool in enumerate(body.get("tools") if isinstance(body.get("tools"), list) else []):
        if isinstance(tool, dict) and schema_key in tool:
            tool[schema_key] = _valid_schema(tool[schema_key])
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            if tool["name"] in names:
                tool["name"] = f"{tool['name']}_{i}"
            names.add(tool["name"])
    return names


def make_consistent(body: Any) -> None:
    if not isinstance(body, dict):
        return
    choice = body.get("tool_choice")
    if choice == "required" and not _function_names(body.get("tools")):
        body["tool_choice"] = "none"
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        named = choice["function"].get("name")
        if isinstance(named, str) and named not in _function_names(body.get("tools")):
            body["tool_choice"] = "none"
    seen: set[Any] = set()
    for i, tool in enumerate(body.get("tools") if isinstance(body.get("tools"), list) else []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and "parameters" in function:
            function["parameters"] = _valid_schema(function["parameters"])
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            if function["name"] in seen:
                function["name"] = f"{function['name']}_{i}"
            seen.add(function["name"])
    calls: set[str] = set()
    for message in body.get("messages") if isinstance(body.get("messages"), list) else []:
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []:
            if not isinstance(call, dict):
                continue
            function = call.get("function")
            if isinstance(function, dict):
                try:
                    json.loads(function.get("arguments"))
                except (TypeError, ValueError):
                    function["arguments"] = "{}"
            calls.add(str(call.get("id")))
        if message.get("role") == "tool" and str(message.get("tool_call_id")) not in calls:
            message["role"] = "user"


def make_response_consistent(body: Any) -> None:
    """The same for a ``/v1/responses`` body (flat tools, ``input`` items), and: a background
    response must be stored."""
    if not isinstance(body, dict):
        return
    if body.get("background") is True and body.get("store") is False:
        body["store"] = True
    names = _flat_tools(body, "parameters")
    choice = body.get("tool_choice")
    named = choice.get("name") if isinstance(choice, dict) else None
    if (choice == "required" and not names) or (
        isinstance(choice, dict) and not (isinstance(named, str) and named in names)
    ):
        body["tool_choice"] = "none"
    calls: set[str] = set()
    items = body.get("input") if isinstance(body.get("input"), list) else []
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            try:
                json.loads(item.get("arguments"))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                item["arguments"] = "{}"
            calls.add(str(item.get("call_id")))
        elif item.get("type") == "function_call_output" and str(item.get("call_id")) not in calls:
            items[n] = {"role": "user", "content": str(item.get("output"))}
    if items and all(isinstance(i, dict) and i.get("type") == "reasoning" for i in items):
        items.append({"role": "user", "content": "hi"})  # reasoning alone is no conversation


def make_message_consistent(body: Any) -> None:
    """The same for a ``/v1/messages`` body (Anthropic's blocks): tool names unique, schemas
    valid, a named tool_choice offered; tool ids that pair up as Anthropic's API requires (each
    ``tool_use`` id once, answered by a ``tool_result`` in the next turn: a duplicate or a stray
    block becomes a text block, an unanswered call gets its answer); a thinking budget below
    ``max_tokens``."""
    if not isinstance(body, dict):
        return
    names = _flat_tools(body, "input_schema")
    choice = body.get("tool_choice")
    named = choice.get("name") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "tool" and not (isinstance(named, str) and named in names):
        body["tool_choice"] = {"type": "auto"}
    thinking, max_tokens = body.get("thinking"), body.get("max_tokens")
    if isinstance(thinking, dict) and isinstance(thinking.get("budget_tokens"), int) and isinstance(max_tokens, int):
        if not 1 <= thinking["budget_tokens"] < max_tokens:
            thinking["budget_tokens"] = None if max_tokens <= 1 else max_tokens - 1
    text = {"type": "text", "text": "an answer"}
    seen: set[str] = set()
    waiting: list[str] = []  # the last assistant turn's calls, not answered yet
    last_calls: list[Any] = []  # that turn's blocks
    for turn in body.get("messages") if isinstance(body.get("messages"), list) else []:
        if not isinstance(turn, dict) or turn.get("role") == "system":
            continue
        if not isinstance(turn.get("content"), list):
            turn["content"] = [{"type": "text", "text": str(turn.get("content"))}]
        blocks = turn["content"]
        if turn.get("role") == "assistant":
            for n, block in enumerate(last_calls):  # a call left unanswered before another assistant turn
                if isinstance(block, dict) and block.get("type") == "tool_use" and str(block.get("id")) in waiting:
                    last_calls[n] = dict(text)
            waiting, last_calls = [], blocks
            for n, block in enumerate(blocks):
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    if str(block.get("id")) in seen:
                        blocks[n] = dict(text)
                    else:
                        seen.add(str(block.get("id")))
                        waiting.append(str(block.get("id")))
            continue
        for n, block in enumerate(blocks):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                if str(block.get("tool_use_id")) in waiting:
                    waiting.remove(str(block.get("tool_use_id")))
                else:
                    blocks[n] = dict(text)
        blocks += [{"type": "tool_result", "tool_use_id": call_id, "content": "an answer"} for call_id in waiting]
        waiting, last_calls = [], []


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    if case.operation.path == "/v1/responses":
        make_response_consistent(case.body)
    elif case.operation.path.startswith("/v1/messages"):
        make_message_consistent(case.body)
    else:
        make_consistent(case.body)
