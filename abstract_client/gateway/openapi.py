"""The gateway's OpenAPI 3.1 document, served at ``/openapi.json``: the routes it really has,
what their bodies may hold (the checks ``openai_wire`` and the library's call boundary make),
and the OpenAI error body every failure answers with. ``tests/test_gateway_openapi.py`` runs
schemathesis against it (no 5xx for anything a client can send)."""

from __future__ import annotations

from typing import Any

from .._validate import MAX_DIMENSIONS, MAX_TOKENS_LIMIT

__all__ = ["openapi_document"]

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
        (429, "the backend is rate limiting"),
        (499, "stopped (the client left, the cancel endpoint, shutdown)"),
        (502, "the backend failed"),
        (503, "busy (Retry-After) or unavailable"),
        (504, "a deadline passed"),
    )
}
_PART = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}
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
                    "items": {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}},
                },
            ]
        },
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
    },
}
_SAMPLING = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT},
    "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_LIMIT},
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "n": {"const": 1},
}
_TEXT = {"type": "string"}
_REQUEST_ID = {
    "name": "X-Request-Id",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
}


def _post(summary: str, body: dict[str, Any] | None, ok: dict[str, Any]) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "parameters": [_REQUEST_ID],
        "responses": {"200": ok, **_ERRORS},
    }
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return {"post": operation}


def _json_ok(description: str, *, stream: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return {"description": description, "content": content}


def openapi_document(*, ui: bool = False) -> dict[str, Any]:
    chat = {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}},
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {
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
            },
            "response_format": {"type": "object"},
            "reasoning_effort": {"enum": ["none", "minimal", "low", "medium", "high"]},
            "chat_template_kwargs": {"type": "object"},
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
            "model": {"type": "string"},
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "dimensions": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_DIMENSIONS},
        },
    }
    model_only = {"type": "object", "required": ["model"], "properties": {"model": {"type": "string"}}}
    get_ok = {"get": {"parameters": [_REQUEST_ID], "responses": {"200": _json_ok("ok"), **_ERRORS}}}
    path_id = {"name": "request_id", "in": "path", "required": True, "schema": {"type": "string"}}
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "abstract-client gateway",
            "version": "1",
            "description": "OpenAI-compatible; Stop means stop.",
        },
        "paths": {
            "/v1/chat/completions": _post("a chat answer (stream: SSE)", chat, _json_ok("the answer", stream=True)),
            "/v1/completions": _post(
                "a text completion (stream: SSE)", completion, _json_ok("the answer", stream=True)
            ),
            "/v1/embeddings": _post("embeddings", embeddings, _json_ok("the vectors")),
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
            "/health": {"get": {"responses": {"200": _json_ok("alive")}}},
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
        "components": {"schemas": {"Error": _ERROR, "Message": _MESSAGE}},
    }
    if ui:
        page = {"description": "the chat page", "content": {"text/html": {"schema": {"type": "string"}}}}
        document["paths"]["/"] = {"get": {"summary": "the chat page (--ui)", "responses": {"200": page}}}
    return document
