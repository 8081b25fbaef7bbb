"""A lane's quirks live in one hook, ``adjust(wire, body, request)``, applied on every wire it
serves (#60): vLLM's ``json_schema=`` becomes each wire's own schema field — chat's
``response_format``, Responses' ``text.format``, Messages' ``output_format`` (the Messages wire
once sent it as a stranger field) — and llama-server's Responses route gets the chat fields it
honours. The lane's ``extra_body`` goes under the request's own fields, on every wire."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest

from abstract_client import NotSupportedError, OutputValidationError, create_llm
from abstract_client.testing import FakeOpenAIServer
from abstract_client.wires.chat import CHAT

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


def test_a_wires_own_properties_go_with_it_to_any_lane() -> None:
    """What a dialect can do is on its ``Wire``, never a test of its name in a lane: a wire given
    as a value with its own schema field gets vLLM's ``json_schema=`` there; one that takes
    images as data only has an image URL refused before anything is sent."""
    own = dataclasses.replace(CHAT, name="mine", schema_field=lambda body, schema: body.update(my_schema=schema))
    with FakeOpenAIServer(token_delay=0.0) as server:
        with (
            create_llm("vllm", "m", base_url=server.base_url, wire=own) as llm,
            contextlib.suppress(OutputValidationError),
        ):
            llm.generate("x", max_tokens=2, json_schema=SCHEMA)
        assert server.last.body["my_schema"] == SCHEMA and "response_format" not in server.last.body
        data_only = dataclasses.replace(CHAT, name="data-only", image_urls=False)
        picture = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]
        seen = len(server.records)
        for wire in (data_only, CHAT):
            with create_llm("openai-compatible", "m", base_url=server.base_url, wire=wire) as llm:
                if wire.image_urls:
                    llm.generate(messages=picture, max_tokens=2)
                else:
                    with pytest.raises(NotSupportedError, match="image"):
                        llm.generate(messages=picture, max_tokens=2)
        assert len(server.records) == seen + 1  # the refused one sent nothing


@pytest.mark.parametrize(
    ("lane", "wire", "resumes_on"),
    [("llamacpp", "messages", "chat"), ("llamacpp", "responses", "chat"), ("vllm", "chat", "responses")],
)
def test_resumable_is_refused_on_a_wire_the_lane_does_not_resume_on(lane: str, wire: str, resumes_on: str) -> None:
    """``resumable=True`` never sends another dialect than the one asked for: a lane made with a
    ``wire=`` it does not resume on refuses the call with the wire that does, before sending."""
    with FakeOpenAIServer(token_delay=0.0) as server, create_llm(lane, "m", base_url=server.base_url, wire=wire) as llm:
        with pytest.raises(NotSupportedError, match=rf"resumes a '{resumes_on}' stream.*wire='{wire}'"):
            llm.generate("x", resumable=True)
        assert server.records == []


def test_resumable_goes_on_the_lanes_own_resuming_wire_by_default() -> None:
    """Made without ``wire=``, a lane resumes on its own resuming wire (vLLM: a Responses background
    response, as documented); made with that wire, the same."""
    for wire in (None, "responses"):
        with FakeOpenAIServer(token_delay=0.0) as server:
            with create_llm("vllm", "m", base_url=server.base_url, wire=wire) as llm:
                assert llm.provider.resumable_refused() is None
        with FakeOpenAIServer(token_delay=0.0) as server:
            with create_llm("openai-compatible", "m", base_url=server.base_url, wire=wire) as llm:
                assert (llm.provider.resumable_refused() is None) is (wire == "responses")
