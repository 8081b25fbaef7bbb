"""The gateway's OpenAPI 3.1 document, served at ``/openapi.json``: the routes it really has,
what their bodies may hold (the checks ``wires.chat_server`` and the library's call boundary make),
and the OpenAI error body every failure answers with. ``tests/test_gateway_openapi.py`` runs
schemathesis against it (no 5xx for anything a client can send)."""

from __future__ import annotations

from typing import Any

from ..._validate import MAX_DIMENSIONS, MAX_TOKENS_LIMIT
from ...wires.messages_server import MAX_STOP_SEQUENCE_CHARS, MAX_STOP_SEQUENCES

__all__ = ["openapi_document"]


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional field the gateway takes ``null`` for, as if it were absent (as OpenAI does)."""
    return {"anyOf": [schema, {"type": "null"}]}


_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "code": {"type": ["string", "integer", "null"]},
                "partial_text": {"type": "string"},
            },
        }
    },
}
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_ERRORS = {
    str(status): {
        "description": why,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    for status, why in (
        (400, "invalid or not supported"),
        (401, "missing or wrong API key"),
        (403, "needs the admin key"),
        (404, "unknown model, route or request"),
        (409, "a request with this X-Request-Id is in flight"),
        (413, "the body is larger than the limit"),
        (422, "the answer does not match response_format or the tools"),
        (429, "a key's limit (Retry-After), or the backend is rate limiting"),
        (499, "stopped (the client left, the cancel endpoint, shutdown)"),
        (502, "the backend failed"),
        (503, "busy (Retry-After) or unavailable"),
        (504, "a deadline passed"),
    )
}
_PART = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}
_TOOL_CALL = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
        },
    },
}
_HISTORY_CALL = {  # a call of an earlier answer, sent back (its id and type may be left out)
    "type": "object",
    "required": ["function"],
    "properties": {
        "id": _or_null({"type": "string"}),
        "type": _or_null({"const": "function"}),
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {
                "name": {"type": "string"},
                "arguments": {"oneOf": [{"type": "string"}, {"type": "object"}]},  # JSON text, or Ollama's object
            },
        },
    },
}
_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1},  # unique among the tools
                "description": _or_null({"type": "string"}),
                "parameters": _or_null({"type": "object"}),  # a JSON Schema (checked against its metaschema)
            },
        },
    },
}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {
            "oneOf": [
                {"type": "string"},
                {"type": "null"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type"],
                        "properties": {"type": {"type": "string"}},
                        # a text part's text is a string (the call-boundary check refuses others)
                        "if": {"properties": {"type": {"const": "text"}}},
                        "then": {"required": ["text"], "properties": {"text": {"type": "string"}}},
                    },
                },
            ]
        },
        "tool_calls": _or_null({"type": "array", "items": _HISTORY_CALL}),
        "tool_call_id": _or_null({"type": "string"}),
    },
}


_SAMPLING = {
    "model": _or_null({"type": "string"}),
    "max_tokens": _or_null({"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT}),
    "max_completion_tokens": _or_null({"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT}),
    "temperature": _or_null({"type": "number", "minimum": 0}),
    "top_p": _or_null({"type": "number", "minimum": 0, "maximum": 1}),
    "seed": _or_null({"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}),
    "stop": _or_null({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
    "stream": {"type": "boolean"},
    "stream_options": _or_null({"type": "object", "properties": {"include_usage": {"type": "boolean"}}}),
    "n": _or_null({"const": 1}),
}
_TEXT = {"type": "string"}
_REQUEST_ID = {
    "name": "X-Request-Id",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
}


_USAGE = _or_null(
    {
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
            "prompt_tokens": {"type": "integer", "minimum": 0},
            "completion_tokens": {"type": "integer", "minimum": 0},
            "total_tokens": {"type": "integer", "minimum": 0},
            "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}},
        },
    }
)
# "stop", "length", "tool_calls" (or what else the backend said); null until the last frame
_FINISH = {"type": ["string", "null"]}
_TOOL_CALL_DELTA = {
    "type": "object",
    "required": ["index", "function"],
    "properties": {
        "index": {"type": "integer", "minimum": 0},
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["arguments"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
        },
    },
}


def _answer(kind: str, choice: dict[str, Any], *, chunk: bool) -> dict[str, Any]:
    """An answer object: ``choices`` of ``choice``; a stream's last frame may carry only usage."""
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": kind},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "maxItems": 1, "items": choice},
            "usage": _USAGE,
        },
        **({} if chunk else {"additionalProperties": False}),
    }


def _choice(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["index", *required, "finish_reason"],
        "properties": {"index": {"const": 0}, **properties, "finish_reason": _FINISH},
        "additionalProperties": False,
    }


_CONTENT = {"type": ["string", "null"]}
_RESPONSES = {
    "ChatCompletion": _answer(
        "chat.completion",
        _choice(
            ["message"],
            {
                "message": {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {
                        "role": {"const": "assistant"},
                        "content": _CONTENT,
                        "reasoning_content": {"type": "string"},
                        "tool_calls": _or_null({"type": "array", "items": _HISTORY_CALL}),
                    },
                    "additionalProperties": False,
                }
            },
        ),
        chunk=False,
    ),
    "ChatCompletionChunk": _answer(
        "chat.completion.chunk",
        _choice(
            ["delta"],
            {
                "delta": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string"},
                        "reasoning_content": {"type": "string"},
                        "tool_calls": {"type": "array", "items": _TOOL_CALL_DELTA},
                    },
                    "additionalProperties": False,
                }
            },
        ),
        chunk=True,
    ),
    "TextCompletion": _answer("text_completion", _choice(["text"], {"text": _CONTENT}), chunk=False),
    "TextCompletionChunk": _answer("text_completion", _choice(["text"], {"text": {"type": "string"}}), chunk=True),
    "Embeddings": {
        "type": "object",
        "required": ["object", "data", "model"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["object", "index", "embedding"],
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer", "minimum": 0},
                        "embedding": {"type": "array", "items": {"type": "number"}},
                    },
                },
            },
            "model": {"type": "string"},
            "usage": {"type": "object"},
        },
    },
}


# -- the Responses API (/v1/responses) ------------------------------------------------------------

_RESPONSE_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"enum": ["input_text", "output_text", "text"]}, "text": {"type": "string"}},
}
_RESPONSE_ITEM = {
    "oneOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "type": {"const": "message"},
                "role": {"enum": ["user", "assistant", "system", "developer"]},
                "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _RESPONSE_TEXT_PART}]},
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "name", "arguments"],
            "properties": {
                "type": {"const": "function_call"},
                "call_id": {"type": "string"},
                "name": {"type": "string", "minLength": 1},
                "arguments": {"type": "string"},  # JSON text
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "output"],
            "properties": {
                "type": {"const": "function_call_output"},
                "call_id": {"type": "string"},  # a call an earlier item made
                "output": {"type": "string"},
            },
        },
        # an earlier answer's reasoning, sent back: dropped (the model reasons anew)
        {"type": "object", "required": ["type"], "properties": {"type": {"const": "reasoning"}}},
    ]
}
_RESPONSE_TOOL = {
    "type": "object",
    "required": ["type", "name"],
    "properties": {
        "type": {"const": "function"},
        "name": {"type": "string", "minLength": 1},  # unique among the tools
        "description": _or_null({"type": "string"}),
        "parameters": _or_null({"type": "object"}),  # a JSON Schema (checked against its metaschema)
        "strict": _or_null({"type": "boolean"}),
    },
}
_RESPONSE_FORMAT = {
    "oneOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
        {
            "type": "object",
            "required": ["type", "name", "schema"],
            "properties": {
                "type": {"const": "json_schema"},
                "name": {"type": "string"},
                "schema": {"type": "object"},
                "strict": _or_null({"type": "boolean"}),
            },
        },
    ]
}
_RESPONSES_REQUEST = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "model": _or_null({"type": "string"}),
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": _RESPONSE_ITEM}]},
        "instructions": _or_null({"type": "string"}),
        "max_output_tokens": _or_null({"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT}),
        "temperature": _or_null({"type": "number", "minimum": 0}),
        "top_p": _or_null({"type": "number", "minimum": 0, "maximum": 1}),
        "seed": _or_null({"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}),
        "stream": _or_null({"type": "boolean"}),
        "background": _or_null({"type": "boolean"}),  # needs store (not false)
        "store": _or_null({"type": "boolean"}),
        "tools": _or_null({"type": "array", "items": _RESPONSE_TOOL}),
        "tool_choice": _or_null(
            {
                "oneOf": [
                    {"enum": ["auto", "none", "required"]},
                    {
                        "type": "object",
                        "required": ["type", "name"],
                        "properties": {"type": {"const": "function"}, "name": {"type": "string", "minLength": 1}},
                    },
                ]
            }
        ),
        "text": _or_null({"type": "object", "properties": {"format": _or_null(_RESPONSE_FORMAT)}}),
        "reasoning": _or_null(
            {
                "type": "object",
                "properties": {"effort": _or_null({"enum": ["none", "minimal", "low", "medium", "high"]})},
            }
        ),
    },
}
_RESPONSE_SCHEMAS = {
    "Response": {
        "type": "object",
        "required": ["id", "object", "created_at", "status", "output"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "response"},
            "created_at": {"type": "integer"},
            "status": {"enum": ["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]},
            "background": {"type": "boolean"},
            "model": {"type": "string"},
            "output": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "id"],
                    "properties": {
                        "type": {"enum": ["message", "reasoning", "function_call"]},
                        "id": {"type": "string"},
                    },
                },
            },
            "usage": _or_null(
                {
                    "type": "object",
                    "required": ["input_tokens", "output_tokens", "total_tokens"],
                    "properties": {
                        "input_tokens": {"type": "integer", "minimum": 0},
                        "output_tokens": {"type": "integer", "minimum": 0},
                        "total_tokens": {"type": "integer", "minimum": 0},
                    },
                }
            ),
            "error": _or_null(
                {"type": "object", "required": ["code", "message"], "properties": {"message": {"type": "string"}}}
            ),
        },
    },
    # one event of a response's stream: response.created … response.completed (or .incomplete,
    # .failed, or an error event), numbered from 0
    "ResponseEvent": {
        "type": "object",
        "required": ["type", "sequence_number"],
        "properties": {"type": {"type": "string"}, "sequence_number": {"type": "integer", "minimum": 0}},
    },
}


# -- Anthropic's Messages API (/v1/messages): the blocks each role may send ------------------------
_M_TEXT = {"type": "object", "required": ["type", "text"], "properties": {"type": {"const": "text"}, "text": _TEXT}}
_M_TEXTS = {"oneOf": [_TEXT, {"type": "array", "items": _M_TEXT}]}  # a string, or text blocks
_M_TOOL_USE = {
    "type": "object",
    "required": ["type", "id", "name", "input"],
    "properties": {
        "type": {"const": "tool_use"},
        "id": {"type": "string"},
        "name": {"type": "string"},
        "input": {"type": "object"},
    },
}
_M_TOOL_RESULT = {
    "type": "object",
    "required": ["type", "tool_use_id"],
    "properties": {
        "type": {"const": "tool_result"},
        "tool_use_id": {"type": "string"},
        "content": _M_TEXTS,
    },
}
_M_THINKING = {
    "type": "object",
    "required": ["type", "thinking"],
    "properties": {"type": {"const": "thinking"}, "thinking": _TEXT, "signature": _TEXT},
}
_M_MESSAGE = {
    "oneOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"const": "user"},
                "content": {"oneOf": [_TEXT, {"type": "array", "items": {"oneOf": [_M_TEXT, _M_TOOL_RESULT]}}]},
            },
        },
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"const": "system"},
                "content": _M_TEXTS,
            },
        },
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"const": "assistant"},
                "content": {
                    "oneOf": [_TEXT, {"type": "array", "items": {"oneOf": [_M_TEXT, _M_TOOL_USE, _M_THINKING]}}]
                },
            },
        },
    ]
}
_M_COMMON = {
    "model": _or_null({"type": "string"}),
    "messages": {"type": "array", "minItems": 1, "items": _M_MESSAGE},
    "system": _or_null(_M_TEXTS),
    "tools": _or_null(
        {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "input_schema"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "description": _or_null(_TEXT),
                    "input_schema": {"type": "object"},
                },
            },
        }
    ),
    "tool_choice": _or_null(
        {
            "oneOf": [
                {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["auto", "any", "none"]}}},
                {
                    "type": "object",
                    "required": ["type", "name"],
                    "properties": {"type": {"const": "tool"}, "name": {"type": "string"}},
                },
            ]
        }
    ),
}
_MESSAGES_REQUEST = {
    "type": "object",
    "required": ["messages", "max_tokens"],
    "properties": {
        **_M_COMMON,
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT},
        "temperature": _or_null({"type": "number", "minimum": 0}),
        "top_p": _or_null({"type": "number", "minimum": 0, "maximum": 1}),
        "top_k": _or_null({"type": "integer", "minimum": 0, "maximum": MAX_TOKENS_LIMIT}),
        "stop_sequences": _or_null(
            {
                "type": "array",
                "maxItems": MAX_STOP_SEQUENCES,
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_SEQUENCE_CHARS, "pattern": "\\S"},
            }
        ),
        "stream": {"type": "boolean"},
        "thinking": _or_null(
            {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"enum": ["enabled", "disabled", "adaptive"]},
                    "budget_tokens": _or_null(
                        {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_TOKENS_LIMIT - 1,
                            "description": "below max_tokens",
                        }
                    ),
                },
            }
        ),
        "metadata": _or_null({"type": "object"}),
    },
}
_COUNT_TOKENS_REQUEST = {"type": "object", "required": ["messages"], "properties": _M_COMMON}
_MESSAGE_SCHEMAS = {
    "AnthropicMessage": {
        "type": "object",
        "required": ["id", "type", "role", "content", "model", "stop_reason", "usage"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": {"type": "string"},
            "content": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type"],
                    "properties": {"type": {"enum": ["text", "thinking", "tool_use"]}},
                },
            },
            "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]},
            "usage": {
                "type": "object",
                "required": ["input_tokens", "output_tokens"],
                "properties": {
                    "input_tokens": {"type": "integer", "minimum": 0},
                    "output_tokens": {"type": "integer", "minimum": 0},
                    "cache_read_input_tokens": {"type": "integer", "minimum": 0},
                },
            },
        },
    },
    # one event of a message's stream: message_start ... message_stop, or an error event
    "AnthropicEvent": {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {
                "enum": [
                    "message_start",
                    "content_block_start",
                    "content_block_delta",
                    "content_block_stop",
                    "message_delta",
                    "message_stop",
                    "ping",
                    "error",
                ]
            }
        },
    },
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _post(summary: str, body: dict[str, Any] | None, ok: dict[str, Any]) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "parameters": [_REQUEST_ID],
        "responses": {"200": ok, **_ERRORS},
    }
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return {"post": operation}


_REACH = {
    "type": "object",
    "required": ["state", "since"],
    "properties": {
        "state": {"enum": ["unknown", "up", "down", "in_process"]},
        "since": {"type": "number"},
        "url": {"type": "string"},
        "error": {"type": "string"},
        "members": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_HEALTH = {
    "type": "object",
    "required": ["status", "in_flight", "backends"],
    "properties": {
        "status": {"enum": ["starting", "ok", "degraded", "unavailable"]},
        "in_flight": {"type": "integer", "minimum": 0},
        "backends": {"type": "object", "additionalProperties": _REACH},
        "store": {
            "type": "object",
            "required": ["state"],
            "properties": {"state": {"enum": ["unknown", "up", "down"]}, "url": {"type": "string"}},
        },
    },
}


_USAGE_ROW = {
    "type": "object",
    "required": ["day", "key", "model", "outcome", "requests", "prompt_tokens", "cached_tokens", "generated_tokens"],
    "properties": {
        "day": {"type": "string", "format": "date"},
        "key": {"type": "string"},
        "model": {"type": "string"},
        "outcome": {"enum": ["completed", "stopped", "error", "refused"]},
        **{
            n: {"type": "integer", "minimum": 0}
            for n in ("requests", "prompt_tokens", "cached_tokens", "generated_tokens")
        },
    },
}
_USAGE = {
    "type": "object",
    "required": ["object", "key", "start", "end", "data", "records_dropped"],
    "properties": {
        "object": {"const": "usage"},
        "key": {"type": ["string", "null"]},
        "start": {"type": ["string", "null"]},
        "end": {"type": ["string", "null"]},
        "data": {"type": "array", "items": _USAGE_ROW},
        "records_dropped": {"type": "integer", "minimum": 0},
    },
}


def _json_ok(description: str, schema: dict[str, Any] | None = None, *, frame: str | None = None) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": schema or {"type": "object"}}}
    if frame is not None:
        # One server-sent event, as OpenAPI before 3.2 describes an event stream: its data is a
        # chunk as JSON, an Error if the stream fails, then "[DONE]" (tests/test_gateway_openapi.py
        # holds real streams to it; schemathesis reads it so too).
        data = {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"oneOf": [_ref(frame), _ref("Error")]},
        }
        event = {"type": "object", "required": ["data"], "properties": {"data": {"anyOf": [{"const": "[DONE]"}, data]}}}
        content["text/event-stream"] = {"schema": event}
    return {
        "description": description
        + (
            ""
            if frame is None
            else f" (stream: SSE; each event's data is a {frame}, then an Error if the stream fails, else [DONE])"
        ),
        "content": content,
    }


def openapi_document(*, ui: bool = False) -> dict[str, Any]:
    chat = {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}},
            "tools": _or_null({"type": "array", "items": _TOOL}),
            "tool_choice": _or_null(
                {
                    "oneOf": [
                        {"enum": ["auto", "none", "required"]},
                        {
                            "type": "object",
                            "required": ["type", "function"],
                            "properties": {
                                "type": {"const": "function"},
                                "function": {
                                    "type": "object",
                                    "required": ["name"],
                                    "properties": {"name": {"type": "string", "minLength": 1}},
                                },
                            },
                        },
                    ]
                }
            ),
            "response_format": _or_null({"type": "object"}),
            "reasoning_effort": _or_null({"enum": ["none", "minimal", "low", "medium", "high"]}),
            "chat_template_kwargs": _or_null({"type": "object"}),
            **_SAMPLING,
        },
    }
    completion = {
        "type": "object",
        "required": ["prompt"],
        "properties": {"prompt": {"type": "string"}, **_SAMPLING},
    }
    embeddings = {
        "type": "object",
        "required": ["input"],
        "properties": {
            "model": _or_null({"type": "string"}),
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "dimensions": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_DIMENSIONS},
        },
    }
    model_only = {"type": "object", "required": ["model"], "properties": {"model": {"type": "string"}}}
    get_ok = {"get": {"parameters": [_REQUEST_ID], "responses": {"200": _json_ok("ok"), **_ERRORS}}}
    path_id = {"name": "request_id", "in": "path", "required": True, "schema": {"type": "string"}}
    response_id = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "abstract-client gateway",
            "version": "1",
            "description": "OpenAI-compatible; Stop means stop.",
        },
        "paths": {
            "/v1/chat/completions": _post(
                "a chat answer (stream: SSE)",
                chat,
                _json_ok("the answer", _ref("ChatCompletion"), frame="ChatCompletionChunk"),
            ),
            "/v1/completions": _post(
                "a text completion (stream: SSE)",
                completion,
                _json_ok("the answer", _ref("TextCompletion"), frame="TextCompletionChunk"),
            ),
            "/v1/embeddings": _post("embeddings", embeddings, _json_ok("the vectors", _ref("Embeddings"))),
            "/v1/models": get_ok,
            "/v1/models/load": _post("load a backend's model", model_only, _json_ok("loaded")),
            "/v1/models/unload": _post("unload a backend's model (stops its calls)", model_only, _json_ok("unloaded")),
            "/v1/requests/{request_id}/cancel": {
                "post": {
                    "summary": "stop a request in flight",
                    "parameters": [path_id],
                    "responses": {"200": _json_ok("stopped"), **_ERRORS},
                }
            },
            "/v1/requests/{request_id}": {
                "get": {
                    "summary": "what the gateway measured for a stopped request",
                    "parameters": [path_id],
                    "responses": {"200": _json_ok("the stop's record"), **_ERRORS},
                }
            },
            "/v1/usage": {
                "get": {
                    "summary": "requests and tokens by day, key, model and outcome (the admin key: every key's;"
                    " a client key: its own)",
                    "parameters": [
                        {"name": name, "in": "query", "required": False, "schema": {"type": "string", "format": "date"}}
                        for name in ("start", "end")
                    ]
                    + [{"name": "key", "in": "query", "required": False, "schema": {"type": "string"}}],
                    "responses": {"200": _json_ok("the usage", _USAGE), **_ERRORS},
                }
            },
            "/v1/responses": _post(
                "a response (OpenAI Responses API; stream: SSE; background: runs until done or cancelled)",
                _RESPONSES_REQUEST,
                _json_ok("the response", _ref("Response"), frame="ResponseEvent"),
            ),
            "/v1/messages": _post(
                "a message (Anthropic's Messages API; stream: SSE events)",
                _MESSAGES_REQUEST,
                _json_ok("the message", _ref("AnthropicMessage"), frame="AnthropicEvent"),
            ),
            "/v1/messages/count_tokens": _post(
                "the prompt's tokens, by the backend's own tokenizer",
                _COUNT_TOKENS_REQUEST,
                _json_ok(
                    "the count",
                    {
                        "type": "object",
                        "required": ["input_tokens"],
                        "properties": {"input_tokens": {"type": "integer"}},
                    },
                ),
            ),
            "/v1/responses/{response_id}": {
                "get": {
                    "summary": "a background response: as it stands, or its events (stream=true) after starting_after",
                    "parameters": [
                        response_id,
                        {"name": "stream", "in": "query", "required": False, "schema": {"type": "boolean"}},
                        {
                            "name": "starting_after",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "integer", "minimum": -1},
                        },
                    ],
                    "responses": {"200": _json_ok("the response", _ref("Response"), frame="ResponseEvent"), **_ERRORS},
                }
            },
            "/v1/responses/{response_id}/cancel": {
                "post": {
                    "summary": "stop a background response (its engine is stopped)",
                    "parameters": [response_id],
                    "responses": {"200": _json_ok("the response as it ended", _ref("Response")), **_ERRORS},
                }
            },
            "/health": {
                "get": {
                    "summary": "liveness: 200 while the process serves; the body says what it can reach",
                    "responses": {"200": _json_ok("the gateway's view of its backends and store", _HEALTH)},
                }
            },
            "/ready": {
                "get": {
                    "summary": "readiness, for a load balancer: 200 when a request can be served, else 503",
                    "responses": {
                        "200": _json_ok("ok or degraded", _HEALTH),
                        "503": _json_ok("starting or unavailable", _HEALTH),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "responses": {
                        "200": {
                            "description": "Prometheus text",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **_ERRORS,
                    }
                }
            },
            "/openapi.json": {"get": {"responses": {"200": _json_ok("this document")}}},
        },
        "components": {
            "schemas": {"Error": _ERROR, "Message": _MESSAGE, **_RESPONSES, **_RESPONSE_SCHEMAS, **_MESSAGE_SCHEMAS}
        },
    }
    if ui:
        page = {"description": "the chat page", "content": {"text/html": {"schema": {"type": "string"}}}}
        document["paths"]["/"] = {"get": {"summary": "the chat page (--ui)", "responses": {"200": page}}}
    return document
