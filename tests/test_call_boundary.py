"""Hostile or careless arguments at the library's call boundary: a clear TypeError or
ValueError at the call site, and nothing sent (the fake server saw no connection)."""

from __future__ import annotations

import logging
import math

import httpx
import pytest

from abstract_client import LLM, Timeout, create_llm
from abstract_client.testing import FakeOpenAIServer, FakeServer

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
        {"proxy": "http://bob:secret@corp.example:3128"},
        {"verify": False},
        {"cert": ("/tmp/client.pem", "/tmp/client.key")},
        {"trust_env": False},
        {"http_client": "a client object"},
    ],
    ids=lambda s: next(iter(s)),
)
def test_an_http_client_setting_never_reaches_a_request_body(setting: dict[str, object]) -> None:
    """httpx's client settings are refused by name at create_llm (a TypeError), never sent to
    the model server as body fields — a proxy password included."""
    with FakeOpenAIServer() as server:
        with pytest.raises(TypeError, match="HTTP client setting"):
            create_llm("openai-compatible", "m", base_url=server.base_url, **setting)
        assert server.requests("/v1/chat/completions") == []


def test_extra_request_fields_must_be_json_at_create_llm() -> None:
    with pytest.raises(TypeError, match="must be JSON"):
        create_llm("openai-compatible", "m", base_url="http://127.0.0.1:9", temperature_schedule=object())
    with pytest.raises(TypeError, match="must be JSON"):
        create_llm("openai-compatible", "m", base_url="http://127.0.0.1:9", top_k=float("nan"))
