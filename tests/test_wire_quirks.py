"""A lane's quirks live in one hook, ``adjust(wire, body, request)``, applied on every wire it
serves (#60): vLLM's ``json_schema=`` becomes each wire's own schema field — chat's
``response_format``, Responses' ``text.format``, Messages' ``output_format`` (the Messages wire
once sent it as a stranger field) — and llama-server's Responses route gets the chat fields it
honours. The lane's ``extra_body`` goes under the request's own fields, on every wire."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from abstract_client import OutputValidationError, create_llm
from abstract_client.testing import FakeOpenAIServer

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
SCHEMA_FIELD = {
    "chat": ("response_format", {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}),
    "responses": ("text", {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}),
    "messages": ("output_format", {"type": "json_schema", "schema": SCHEMA}),
}


def _sent(lane: str, wire: str, extra_body: dict[str, Any] | None = None, **call: Any) -> dict[str, Any]:
    """The body the lane sent for one call (the fake's canned answer is no JSON: that error is
    the output check's, after the send)."""
    with (
        FakeOpenAIServer(token_delay=0.0) as server,
        create_llm(lane, "m", base_url=server.base_url, wire=wire, extra_body=extra_body) as llm,
        contextlib.suppress(OutputValidationError),
    ):
        llm.generate("x", max_tokens=2, **call)
    body: dict[str, Any] = server.last.body
    return body


@pytest.mark.parametrize("wire", ["chat", "responses", "messages"])
def test_vllm_takes_json_schema_on_every_wire_in_that_wires_field(wire: str) -> None:
    body = _sent("vllm", wire, json_schema=SCHEMA)
    field, value = SCHEMA_FIELD[wire]
    assert body[field] == value and "json_schema" not in body


@pytest.mark.parametrize("wire", ["chat", "responses", "messages"])
def test_extra_body_goes_under_the_requests_own_fields(wire: str) -> None:
    body = _sent("llamacpp", wire, extra_body={"top_p": 0.5, "ignore_eos": False}, ignore_eos=True)
    assert body["top_p"] == 0.5 and body["ignore_eos"] is True  # the call's own field wins over extra_body's


def test_llama_server_responses_route_gets_the_chat_fields_it_honours() -> None:
    body = _sent("llamacpp", "responses", reasoning=False, response_format={"type": "json_object"})
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["response_format"] == {"type": "json_object"} and body["text"] == {"format": {"type": "json_object"}}
