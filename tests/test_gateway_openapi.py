"""The gateway's OpenAPI document matches its routes and what they send, and schemathesis, sending
what the document allows and much that it does not, finds nothing wrong with ``--checks all``
(bounded: a fixed seed and a fixed number of examples per operation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from abstract_client.gateway import BackendConfig, GatewayConfig
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway

from .helpers import wait_until


@pytest.fixture(scope="module")
def gateway() -> Iterator[InProcessGateway]:
    # every answer is one word, whatever max_tokens a generated request asks for
    with FakeOpenAIServer(token_delay=0.0, answer="ok") as upstream:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=upstream.base_url)
        with InProcessGateway(GatewayConfig(backends=[backend])) as gw:
            yield gw


def test_the_document_lists_exactly_the_routes(gateway: InProcessGateway) -> None:
    from starlette.routing import Route

    document = httpx.get(gateway.url + "/openapi.json", timeout=30).json()
    assert document["openapi"].startswith("3.")
    documented = {(path, method.upper()) for path, ops in document["paths"].items() for method in ops}
    app = gateway.app
    while not hasattr(app, "routes"):  # inside its middleware
        app = app.app
    served = {
        (route.path, method)
        for route in app.routes
        if isinstance(route, Route)
        for method in (route.methods or set()) - {"HEAD"}
    }
    assert documented == served


def test_the_guides_endpoints_table_is_the_document() -> None:
    """docs/gateway.md's endpoints table names exactly the routes /openapi.json describes (the
    ``--ui`` page included), one row per method and path."""
    import re
    from pathlib import Path

    from abstract_client.gateway.routes.openapi import openapi_document

    guide = (Path(__file__).resolve().parent.parent / "docs" / "gateway.md").read_text()
    table = guide.split("| route | what |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(GET|POST) (/[^`]*)` \|", table, re.M)
    document = openapi_document(ui=True)
    documented = sorted((m.upper(), path) for path, ops in document["paths"].items() for m in ops)
    assert sorted(rows) == documented
    assert len(rows) == len(set(rows)) == table.count("\n| `")


def test_schemathesis_every_check_passes(gateway: InProcessGateway) -> None:
    """Every check: no 5xx; what the document refuses is refused and what it allows is taken;
    every answer, JSON or each server-sent event, is what the document says. What a schema
    cannot say (a tool_choice naming a tool that is not offered...) is made consistent by
    ``schemathesis_hooks.py``; ``schemathesis.toml`` says which valid requests may still be
    refused, and why."""
    here = Path(__file__).parent
    cli = Path(sys.executable).parent / "schemathesis"
    argv = [
        str(cli) if cli.exists() else "schemathesis",
        "--config-file",
        str(here / "schemathesis.toml"),
        "run",
        gateway.url + "/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        "25",
        "--seed",
        "1",
        "--request-timeout",
        "30",
        "--no-color",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": str(here.parent)}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout


def _event_schemas(document: dict[str, Any], path: str) -> tuple[Any, Any]:
    """(a validator of one SSE event's data, of the JSON answer), resolving refs in the document."""
    content = document["paths"][path]["post"]["responses"]["200"]["content"]
    data = content["text/event-stream"]["schema"]["properties"]["data"]["anyOf"][1]
    assert data["contentMediaType"] == "application/json"
    registry = Registry().with_resource("urn:doc", Resource.from_contents(document, default_specification=DRAFT202012))
    route = "urn:doc#/paths/" + path.replace("/", "~1") + "/post/responses/200/content"
    return (
        Draft202012Validator(
            {"$ref": route + "/text~1event-stream/schema/properties/data/anyOf/1/contentSchema"}, registry=registry
        ),
        Draft202012Validator({"$ref": route + "/application~1json/schema"}, registry=registry),
    )


def _events(gateway: InProcessGateway, path: str, body: dict[str, Any]) -> list[str]:
    with httpx.stream("POST", gateway.url + path, json={**body, "stream": True}, timeout=30) as resp:
        assert resp.status_code == 200
        return [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]


def test_what_is_sent_is_what_the_document_says() -> None:
    """Every event of real streams (usage, reasoning, tool calls, a stream that fails midway) and
    every JSON answer validate against /openapi.json; "[DONE]" ends a stream that did not fail."""
    script = [
        {"reasoning": "think"},
        {"content": "hi"},
        {"tool": 0, "id": "call_1", "name": "get_weather", "arguments": '{"city": '},
        {"tool": 0, "arguments": '"Paris"}'},
    ]
    with FakeOpenAIServer(token_delay=0.0) as upstream:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=upstream.base_url)
        with InProcessGateway(GatewayConfig(backends=[backend])) as gw:
            document = httpx.get(gw.url + "/openapi.json", timeout=30).json()
            chat_event, chat_answer = _event_schemas(document, "/v1/chat/completions")
            text_event, text_answer = _event_schemas(document, "/v1/completions")
            messages = [{"role": "user", "content": "hi"}]
            usage = {"stream_options": {"include_usage": True}}

            upstream.behavior.script = script
            events = _events(gw, "/v1/chat/completions", {"messages": messages, **usage})
            upstream.behavior.script = None
            events += _events(gw, "/v1/chat/completions", {"messages": messages, "max_tokens": 3})
            assert events.count("[DONE]") == 2
            for event in (e for e in events if e != "[DONE]"):
                chat_event.validate(json.loads(event))
            kinds = [json.loads(e)["choices"][0]["delta"] for e in events if e != "[DONE]" and json.loads(e)["choices"]]
            assert any("reasoning_content" in d for d in kinds) and any("tool_calls" in d for d in kinds)
            assert any("usage" in json.loads(e) for e in events if e != "[DONE]")

            events = _events(gw, "/v1/completions", {"prompt": "hi", "max_tokens": 3, **usage})
            assert events[-1] == "[DONE]"
            for event in events[:-1]:
                text_event.validate(json.loads(event))

            upstream.inject("close_without_done")  # the upstream dies midway: an Error event, no [DONE]
            events = _events(gw, "/v1/chat/completions", {"messages": messages, "max_tokens": 8})
            assert "[DONE]" not in events and "error" in json.loads(events[-1])
            for event in events:
                chat_event.validate(json.loads(event))

            upstream.behavior.script = script
            chat_answer.validate(httpx.post(gw.url + "/v1/chat/completions", json={"messages": messages}).json())
            upstream.behavior.script = None
            text_answer.validate(httpx.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}).json())

            # /v1/responses: every event of a stream (reasoning, text, a tool call; one that
            # fails midway ends with response.failed) and every response object
            response_event, response_answer = _event_schemas(document, "/v1/responses")
            upstream.behavior.script = script
            events = _events(gw, "/v1/responses", {"input": "hi"})
            upstream.behavior.script = None
            upstream.inject("close_without_done")
            events += _events(gw, "/v1/responses", {"input": "hi", "max_output_tokens": 8})
            kinds = [json.loads(e)["type"] for e in events]
            for event in events:
                response_event.validate(json.loads(event))
            assert {"response.reasoning_text.delta", "response.output_text.delta"} <= set(kinds)
            assert {"response.function_call_arguments.delta", "response.completed", "response.failed"} <= set(kinds)
            upstream.behavior.script = script
            response_answer.validate(httpx.post(gw.url + "/v1/responses", json={"input": "hi"}).json())
            upstream.behavior.script = None
            started = httpx.post(gw.url + "/v1/responses", json={"input": "hi", "background": True}).json()
            response_answer.validate(started)
            url = f"{gw.url}/v1/responses/{started['id']}"
            assert wait_until(lambda: httpx.get(url).json()["status"] != "in_progress", 10)
            response_answer.validate(httpx.get(url).json())
            response_answer.validate(httpx.post(url + "/cancel").json())
