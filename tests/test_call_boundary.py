"""Hostile or careless arguments at the library's call boundary: a clear TypeError or
ValueError at the call site, and nothing sent (the fake server saw no connection)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from abstract_client import LLM, Timeout, create_llm
from abstract_client.testing import FakeOpenAIServer, FakeServer

_SELF: dict[str, object] = {"role": "user", "content": "hi"}
_SELF["again"] = _SELF  # a message that holds itself

BAD_GENERATIONS: list[tuple[dict[str, object], type[Exception]]] = [
    ({"messages": [1]}, TypeError),
    ({"messages": [[None, None]]}, TypeError),
    ({"messages": "hi"}, TypeError),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, ValueError),
    ({"messages": [{"role": "user", "content": 5}]}, TypeError),
    ({"messages": [{"role": "user", "content": [5]}]}, TypeError),
    ({"messages": [{"role": "user", "content": "\ud800"}]}, ValueError),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}]}, ValueError),
    ({"system": "\ud800"}, ValueError),
    ({"temperature": math.nan}, ValueError),
    ({"temperature": math.inf}, ValueError),
    ({"temperature": -1.0}, ValueError),
    ({"temperature": "hot"}, TypeError),
    ({"max_tokens": -1}, ValueError),
    ({"max_tokens": 0}, ValueError),
    ({"max_tokens": "100"}, TypeError),
    ({"max_tokens": 1e30}, TypeError),
    ({"max_tokens": 2**40}, ValueError),
    ({"max_tokens": True}, TypeError),
    ({"seed": "x"}, TypeError),
    ({"stop": [1]}, TypeError),
    ({"stop": "\ud800"}, ValueError),
    ({"top_p": 2.0}, ValueError),
    ({"top_k": -1}, ValueError),
    ({"logit_bias": {"1": math.nan}}, ValueError),
    ({"timeout": -1}, ValueError),
    ({"timeout": math.nan}, TypeError),
    ({"request_id": "a\r\nX-Injected: 1"}, ValueError),
    ({"request_id": "naïve"}, ValueError),
    ({"request_id": ""}, ValueError),
    ({"request_id": 42}, TypeError),
    # #40: outside content and stop, what reached the lane's encoder (a ProviderProtocolError after
    # connecting; the gateway's 502) or went upstream unchecked
    ({"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]}, ValueError),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, TypeError),
    ({"messages": [_SELF]}, ValueError),
    (
        {"messages": [{"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/passwd"}]}]},
        ValueError,
    ),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"data": "x" * 10}}]}]}, ValueError),
    ({"extra": {"logprobs_scale": float("nan")}}, ValueError),
    ({"seed": 10**4000}, ValueError),
    ({"min_tokens": {}}, TypeError),
    ({"ignore_eos": "x"}, TypeError),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"$ref": "#"}}}}, ValueError),
    ({"response_format": {"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"anyOf": [{"$ref": "#"}]}}}}, ValueError),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}]},
        ValueError,
    ),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_GENERATIONS, ids=[repr(k)[:60] for k, _ in BAD_GENERATIONS])
def test_bad_generation_arguments_are_refused_before_anything_is_sent(
    server: FakeServer, llm: LLM, kwargs: dict[str, object], error: type[Exception]
) -> None:
    prompt = None if "messages" in kwargs else "hi"
    with pytest.raises(error):
        llm.generate(prompt, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(error):
        llm.stream(prompt, **kwargs)  # type: ignore[arg-type]
    assert server.connections == 0 and llm.in_flight == []


def test_a_lone_surrogate_in_the_prompt_or_an_embedding_input(server: FakeServer, llm: LLM) -> None:
    with pytest.raises(ValueError, match="not valid Unicode"):
        llm.generate("bad \ud800 text")
    with pytest.raises(ValueError, match="texts\\[1\\]"):
        llm.embed(["fine", "bad \udc00"])
    with pytest.raises(ValueError):
        llm.count_tokens("x", timeout=-5)
    assert server.connections == 0


@pytest.mark.parametrize(
    ("base_url", "match"),
    [
        ("localhost:8080", "http:// or https://"),
        ("http://[::1", "not a valid URL"),
        ("http://127.0.0.1:99999", "port"),
        ("ftp://127.0.0.1/", "http:// or https://"),
        ("http://", "not a valid URL|http:// or https://"),
    ],
)
def test_bad_base_urls_are_refused_by_create_llm(base_url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        create_llm("openai-compatible", "m", base_url=base_url)


def test_bad_timeouts_are_refused_by_create_llm_and_timeout() -> None:
    with pytest.raises(ValueError):
        create_llm("openai-compatible", "m", base_url="http://127.0.0.1:1", timeout=-1)
    with pytest.raises(ValueError):
        Timeout(connect=0)
    with pytest.raises(TypeError):
        Timeout(total="5")  # type: ignore[arg-type]


def test_credentials_in_the_base_url_are_sent_as_basic_auth_and_shown_nowhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with FakeOpenAIServer() as server:
        url = server.base_url.replace("http://", "http://alice:s3cr3t@")
        llm = create_llm("openai-compatible", "fake-model", base_url=url, max_retries=0)
        try:
            assert llm.generate("hi", max_tokens=2).content == "tok0 tok1 "
            auth = server.last.headers.get("authorization") or server.last.headers.get("Authorization")
            assert auth == "Basic " + __import__("base64").b64encode(b"alice:s3cr3t").decode()
            shown = [repr(llm), repr(llm.provider), repr(llm.provider.clients), caplog.text]
            server.stop()
            with pytest.raises(Exception) as info:
                llm.generate("hi", max_tokens=2)
            shown.append(str(info.value))
        finally:
            llm.close()
    for text in shown:
        assert "s3cr3t" not in text and "alice" not in text, text


def test_httpx_sees_no_credentials_in_the_url() -> None:
    from abstract_client._validate import check_base_url

    url, headers = check_base_url("https://bob:p%40ss@example.test:8443/v1")
    assert url == "https://example.test:8443/v1" and httpx.URL(url).userinfo == b""
    assert headers["Authorization"].startswith("Basic ")


@pytest.mark.parametrize(
    "setting",
    [
        {"http_client": "a client object"},
        {"auth": ("bob", "secret")},
        {"transport": object()},
        {"verfy": False},  # a typo is not a body field
        {"top_k": 3},  # a body field, outside extra_body
        {"extra_body": {"top_k": float("nan")}},
        {"extra_body": {"schedule": object()}},
        {"extra_body": "top_k=3"},
    ],
    ids=lambda s: f"{next(iter(s))}={next(iter(s.values()))!r}"[:40],
)
def test_an_option_the_lane_does_not_take_is_refused_at_create_llm(setting: dict[str, object]) -> None:
    """httpx settings this library does not take, names no lane knows, and body fields that are
    not JSON are a TypeError at create_llm, naming what is valid: nothing is sent."""
    with FakeOpenAIServer() as server:
        with pytest.raises(TypeError) as info:
            create_llm("openai-compatible", "m", base_url=server.base_url, **setting)
        assert server.requests() == []
    message = str(info.value)
    assert "create_llm('openai-compatible')" in message
    if next(iter(setting)) in ("http_client", "auth", "transport"):  # said for what it is
        assert "HTTP client setting abstract-client does not take (it takes proxy=" in message
    if "unknown option" in message:
        assert "valid: " in message and "verify=" in message and "extra_body=" in message


def test_no_setting_or_credential_reaches_a_request_body(tmp_path: Path) -> None:
    """The network settings are the transport's; only ``extra_body`` joins the body."""
    ca = tmp_path / "ca.pem"
    trustme = pytest.importorskip("trustme")
    trustme.CA().cert_pem.write_to_path(str(ca))
    with FakeOpenAIServer(token_delay=0.0) as server:
        settings: dict[str, Any] = {
            "verify": str(ca),
            "trust_env": False,
            "headers": {"X-Tenant": "t1"},
            "extra_body": {"top_k": 3},
            "proxy": None,
        }
        with create_llm(
            "openai-compatible", "fake-model", base_url=server.base_url, api_key="sk-secret", **settings
        ) as llm:
            llm.generate("hi", max_tokens=2)
        record = server.requests("/v1/chat/completions")[0]
    assert set(record.body) == {"model", "messages", "stream", "stream_options", "max_tokens", "top_k"}
    assert record.body["top_k"] == 3
    for secret in ("sk-secret", str(ca), "trust_env", "verify"):
        assert secret not in json.dumps(record.body)
    assert record.headers["authorization"] == "Bearer sk-secret" and record.headers["x-tenant"] == "t1"


def test_network_settings_do_not_apply_to_an_in_process_lane() -> None:
    with pytest.raises(TypeError, match="proxy"):
        create_llm("gguf", "/any/model.gguf", proxy="http://corp:3128")
