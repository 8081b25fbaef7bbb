"""The gateway serves Anthropic's Messages API (#51): the real ``anthropic`` SDK against it —
create, stream, close early (the upstream sees the connection go, the gateway records the
stop), tool use streamed, keys by ``x-api-key``, Anthropic's error shapes — in front of the
bundled fake and in front of a real llama-server (whose own ``cancel task`` line proves the
stop)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from abstract_client.gateway.config import BackendConfig, GatewayConfig
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway
from abstract_client.testing.processes import LlamaServer

from .helpers import WEATHER_TOOL, launch_llama_server, wait_until

KEY = "sk-gateway-test"
WEATHER = {
    "name": "get_weather",
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.005) as server:
        yield server


@pytest.fixture
def gateway(upstream: FakeOpenAIServer) -> Iterator[InProcessGateway]:
    backend = BackendConfig(name="m", provider="llamacpp", base_url=upstream.base_url)
    with InProcessGateway(GatewayConfig(backends=[backend], api_key=KEY)) as gw:
        yield gw


def _client(gw: InProcessGateway, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


def test_the_sdk_creates_and_streams_a_message(gateway: InProcessGateway, upstream: FakeOpenAIServer) -> None:
    client = _client(gateway)
    message = client.messages.create(
        model="m", max_tokens=3, system="Be brief.", messages=[{"role": "user", "content": "hello there"}]
    )
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == "tok0 tok1 tok2 "
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    assert upstream.last.body["messages"][0] == {"role": "system", "content": "Be brief."}
    with client.messages.stream(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok0 tok1 tok2 tok3 " and final.stop_reason == "max_tokens" and final.usage.output_tokens == 4


def test_a_client_that_closes_its_stream_stops_the_upstream(
    gateway: InProcessGateway, upstream: FakeOpenAIServer
) -> None:
    upstream.behavior.token_delay = 0.01
    client = _client(gateway)
    with client.messages.stream(
        model="m",
        max_tokens=10_000,
        messages=[{"role": "user", "content": "a long story"}],
        extra_headers={"X-Request-Id": "story-1"},
    ) as stream:
        for n, _ in enumerate(stream.text_stream):
            if n == 5:
                break  # leaving the block closes the connection
    record = upstream.last
    upstream.wait_for_disconnect(record, timeout=10)
    assert record.tokens_sent < 10_000
    stop = {}

    def recorded() -> bool:
        nonlocal stop
        answer = httpx.get(f"{gateway.url}/v1/requests/story-1", headers={"x-api-key": KEY})
        stop = answer.json() if answer.status_code == 200 else {}
        return bool(stop)

    assert wait_until(recorded, timeout=10), "the gateway recorded no stop"
    assert stop["reason"] == "client_disconnect"


def test_a_tool_call_streams_as_a_tool_use_block(gateway: InProcessGateway, upstream: FakeOpenAIServer) -> None:
    upstream.behavior.script = [
        {"tool": 0, "id": "call_1", "name": "get_weather", "arguments": '{"city": '},
        {"tool": 0, "arguments": '"Paris"}'},
    ]
    upstream.behavior.template_tools = True
    client = _client(gateway)
    with client.messages.stream(
        model="m",
        max_tokens=50,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        final = stream.get_final_message()
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    assert upstream.last.body["tool_choice"] == "required"
    history: list[Any] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny"}]},
    ]
    upstream.behavior.script = None
    client.messages.create(model="m", max_tokens=2, messages=history, tools=[WEATHER])  # type: ignore[list-item]
    sent = upstream.last.body["messages"]
    assert sent[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert sent[2] == {"role": "tool", "tool_call_id": block.id, "content": "sunny"}


def test_keys_and_errors_are_anthropics(gateway: InProcessGateway) -> None:
    with pytest.raises(anthropic.AuthenticationError):
        _client(gateway, key="wrong").messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(anthropic.BadRequestError) as refused:
        _client(gateway).messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    answer = httpx.post(
        f"{gateway.url}/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert answer.status_code == 400
    assert answer.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens is required: an integer"},
    }


def test_the_gateways_own_refusals_are_anthropics_too(upstream: FakeOpenAIServer) -> None:
    """A full queue (503 ``overloaded_error``, with Retry-After) and a request id already in
    flight (409): the gateway's own answers, in the route's shape; and the stream opens with
    ``message_start`` then ``ping``, as Anthropic's does."""
    upstream.behavior.token_delay = 0.02
    backend = BackendConfig(
        name="m", provider="llamacpp", base_url=upstream.base_url, max_concurrent=1, queue_timeout=0.3
    )
    with InProcessGateway(GatewayConfig(backends=[backend], api_key=KEY)) as gw:
        body = {"model": "m", "max_tokens": 10_000, "stream": True, "messages": [{"role": "user", "content": "long"}]}
        headers = {"x-api-key": KEY, "x-request-id": "held-1"}
        with httpx.stream("POST", f"{gw.url}/v1/messages", json=body, headers=headers, timeout=30) as held:
            lines = held.iter_lines()  # kept open: leaving a for loop over it would close the response
            events: list[str] = []
            while len(events) < 3:
                line = next(lines)
                if line.startswith("event: "):
                    events.append(line[7:])
            assert events == ["message_start", "ping", "content_block_start"]
            busy = httpx.post(
                f"{gw.url}/v1/messages", json=body | {"stream": False}, headers={"x-api-key": KEY}, timeout=30
            )
            assert busy.status_code == 503 and busy.headers["retry-after"]
            assert busy.json()["type"] == "error" and busy.json()["error"]["type"] == "overloaded_error"
            twice = httpx.post(f"{gw.url}/v1/messages", json=body, headers=headers, timeout=30)
            assert twice.status_code == 409
            assert (
                twice.json()["error"]["type"] == "invalid_request_error"
                and "held-1" in twice.json()["error"]["message"]
            )


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = launch_llama_server(tmp_path_factory, "llama-gateway-messages")
    yield server
    server.stop()


@pytest.mark.llamacpp
def test_the_sdk_through_the_gateway_stops_a_real_llama_server(llama: LlamaServer) -> None:
    backend = BackendConfig(name="smollm2", provider="llamacpp", base_url=llama.url)
    with InProcessGateway(GatewayConfig(backends=[backend])) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
        counted = client.messages.count_tokens(model="smollm2", messages=[{"role": "user", "content": "hello there"}])
        assert counted.input_tokens > 2  # llama-server's own tokenizer, the chat template applied
        message = client.messages.create(
            model="smollm2",
            max_tokens=20,
            extra_body={"temperature": 0},
            system="You are a helpful assistant.",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert "Paris" in message.content[0].text  # type: ignore[union-attr]
        cancels = len(llama.cancelled_tasks())
        with client.messages.stream(
            model="smollm2",
            max_tokens=2000,
            messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
            extra_body={"ignore_eos": True},
        ) as stream:
            for n, _ in enumerate(stream.text_stream):
                if n == 10:
                    break
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(llama.cancelled_tasks()) <= cancels:
            time.sleep(0.05)
        assert len(llama.cancelled_tasks()) > cancels, "no 'cancel task' in llama-server's log"
        assert llama.wait_idle(15.0), f"slot still processing: {llama.slots()}"


def test_what_claude_code_sends_is_served(gateway: InProcessGateway, upstream: FakeOpenAIServer) -> None:
    """Claude Code 2.1.327's request, in the shape it was recorded (2026-12-06): a
    billing block at the top of its system prompt (it would defeat every prefix cache: not sent
    on), a ``system`` turn after the first user turn, text blocks with ``cache_control``, its
    whole tool list with no ``tool_choice`` (on a model that cannot call tools: not offered, so
    an answer in words comes back instead of an error), and fields the gateway does not use."""
    upstream.behavior.template_tools = False  # SmolLM2's template: no tool calls
    upstream.behavior.answer = "Hi!"  # (max_tokens is 32,000: the fake's endless answer would take minutes)
    body = {
        "model": "m",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.327.8c9; cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\nPlatform: linux"}]},
        ],
        "tools": [WEATHER],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "{}"},
    }
    with httpx.stream("POST", f"{gateway.url}/v1/messages", headers={"x-api-key": KEY}, json=body) as answer:
        assert answer.status_code == 200, answer.read()
        events = [line.removeprefix("event: ") for line in answer.iter_lines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    sent = upstream.last.body
    assert sent["messages"][0] == {"role": "system", "content": "You are a Claude agent."}  # no billing block
    assert sent["messages"][1:] == [
        {"role": "user", "content": "Say hi"},
        {"role": "system", "content": "# Environment\nPlatform: linux"},
    ]
    assert "tools" not in sent


# -- what the route refuses before anything reaches the upstream (#58) ------------------------------

_PNG = bytes.fromhex("89504e470d0a1a0a")


def _image(source: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "what is it"}]}


def _b64(data: bytes) -> dict[str, Any]:
    import base64

    return {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}


def _refused_before_upstream(
    gw: InProcessGateway, upstream: FakeOpenAIServer, path: str, body: dict[str, Any], status: int = 400
) -> dict[str, Any]:
    before = len(upstream.requests())
    headers = {"x-api-key": KEY, "content-type": "application/json"}  # json.dumps escapes a lone surrogate
    answer = httpx.post(f"{gw.url}{path}", content=json.dumps(body), headers=headers, timeout=60)
    assert answer.status_code == status, (path, str(body)[:200], answer.text[:300])
    shaped = answer.json()
    assert shaped["type"] == "error" and shaped["error"]["type"] == "invalid_request_error", shaped
    assert len(upstream.requests()) == before, f"{path} sent {str(body)[:200]} upstream"
    return dict(shaped)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_images_are_checked_on_both_routes_before_the_upstream(
    gateway: InProcessGateway, upstream: FakeOpenAIServer, path: str
) -> None:
    """``count_tokens`` forwarded what ``/v1/messages`` refuses (a 200 for base64 garbage, a
    22 MB image, 17 images, a file:// URL; a 502 for a lone surrogate)."""
    turns = [
        [_image(_b64(b"not an image at all"))],
        [_image(_b64(_PNG + bytes(21 * 2**20)))],
        [_image(_b64(_PNG + bytes(64))) for _ in range(17)],
        [_image({"type": "url", "url": "file:///etc/passwd"})],
        [_image({"type": "url", "url": "http://169.254.169.254/latest/meta-data/"})],
        [_image({"type": "url", "url": "http://[fe80::1]/x.png"})],
        [_image({"type": "url", "url": "http://metadata.google.internal/x.png"})],
        [_image({"type": "url", "url": "http://10.1.2.3/x.png"})],  # private: refused by the gateway's default
        [_image({"type": "url", "url": "http://localhost:8080/x.png"})],
        [{"role": "user", "content": "a lone \ud800 surrogate"}],
    ]
    for messages in turns:
        _refused_before_upstream(gateway, upstream, path, {"model": "m", "max_tokens": 5, "messages": messages})


def test_the_messages_route_refuses_unbounded_or_unpaired_values(
    gateway: InProcessGateway, upstream: FakeOpenAIServer
) -> None:
    hi = [{"role": "user", "content": "hi"}]
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    bodies: list[dict[str, Any]] = [
        {"stop_sequences": ["x"] * 100_000},
        {"stop_sequences": ["x" * 10_000_000]},
        {"stop_sequences": [""]},
        {"top_k": 1e30},
        {"top_k": -1},
        {"thinking": {"type": "enabled", "budget_tokens": -1}},
        {"thinking": {"type": "enabled", "budget_tokens": 10**30}},
        {"thinking": {"type": "enabled", "budget_tokens": 50}, "max_tokens": 40},
        # a tool_result whose id no tool_use made
        {"messages": [*hi, {"role": "assistant", "content": "ok"}, {"role": "user", "content": [result]}]},
        # a tool_use never answered
        {"messages": [*hi, {"role": "assistant", "content": [use]}, {"role": "user", "content": "and?"}]},
        # the same tool_use id twice
        {
            "messages": [
                *hi,
                {"role": "assistant", "content": [use, use]},
                {"role": "user", "content": [result, result]},
            ]
        },
        {"messages": [*hi, {"role": "assistant", "content": [{**use, "input": {"city": "\udc00"}}]}]},
    ]
    for extra in bodies:
        body = {"model": "m", "max_tokens": 5, "messages": hi, **extra}
        _refused_before_upstream(gateway, upstream, "/v1/messages", body)
    # what Anthropic's API takes still passes: a paired history, a budget below max_tokens
    paired = [*hi, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    body = {"model": "m", "max_tokens": 40, "messages": paired, "thinking": {"type": "enabled", "budget_tokens": 20}}
    answer = httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60)
    assert answer.status_code == 200, answer.text


def test_every_refusal_before_the_route_is_in_anthropics_shape_and_the_key_comes_first(
    upstream: FakeOpenAIServer,
) -> None:
    backend = BackendConfig(name="m", provider="llamacpp", base_url=upstream.base_url)
    config = GatewayConfig(backends=[backend], api_key=KEY, max_body_bytes=4096)
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    text = json.dumps(body)

    def anthropic_error(answer: httpx.Response, status: int, kind: str) -> None:
        assert answer.status_code == status, answer.text
        assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == kind, answer.text

    with InProcessGateway(config) as gw:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            url = gw.url + path
            for headers in ({}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"}):
                anthropic_error(httpx.post(url, json=body, headers=headers), 401, "authentication_error")
            # no key and a body that is not JSON: the key is judged first
            plain = {"content-type": "text/plain"}
            anthropic_error(httpx.post(url, content=text, headers=plain), 401, "authentication_error")
            keyed = {"x-api-key": KEY}
            anthropic_error(httpx.post(url, content=text, headers={**plain, **keyed}), 415, "invalid_request_error")
            anthropic_error(
                httpx.post(url, json=body, headers={**keyed, "x-request-id": "a b"}), 400, "invalid_request_error"
            )
            anthropic_error(httpx.post(url, content="x" * 5000, headers=keyed), 413, "request_too_large")
            anthropic_error(
                httpx.post(url, json=body, headers={**keyed, "host": "evil.example"}), 403, "permission_error"
            )
        # the chat route keeps OpenAI's shape
        chat = httpx.post(gw.url + "/v1/chat/completions", json=body)
        assert chat.status_code == 401 and chat.json()["error"]["type"] == "authentication_error"
        assert "type" not in chat.json() or chat.json()["type"] != "error"
