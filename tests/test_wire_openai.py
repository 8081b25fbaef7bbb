"""Wire mapping of the openai-compatible lane, with respx (no sockets: mapping only)."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from abstract_client import (
    ContextOverflowError,
    InvalidRequestError,
    ModelNotFoundError,
    ProviderAPIError,
    ProviderProtocolError,
    RateLimitError,
    ServerUnavailableError,
    create_llm,
)

BASE = "http://fake.test/v1"


def sse_body(*frames: object, done: bool = True) -> bytes:
    out = b""
    for f in frames:
        if isinstance(f, bytes) and f.startswith(b":"):
            out += f + b"\n"  # a comment (keep-alive ping), not a data frame
            continue
        out += b"data: " + (f if isinstance(f, bytes) else json.dumps(f).encode()) + b"\n\n"
    if done:
        out += b"data: [DONE]\n\n"
    return out


def chunk(text: str | None = None, finish: str | None = None) -> dict[str, object]:
    delta = {} if text is None else {"content": text}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "model": "m"}


@pytest.fixture
def llm():  # type: ignore[no-untyped-def]
    client = create_llm("openai-compatible", "m", base_url=BASE, api_key="sk-secret-123", max_retries=0)
    yield client
    client.close()


@respx.mock
def test_request_body_and_headers(llm) -> None:  # type: ignore[no-untyped-def]
    route = respx.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            },
        )
    )
    result = llm.generate("hi", system="be brief", max_tokens=5, temperature=0.2, seed=7, stop="\n", top_k=3)
    sent = json.loads(route.calls.last.request.content)
    assert sent == {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "stream": False,
        "max_tokens": 5,
        "temperature": 0.2,
        "seed": 7,
        "stop": ["\n"],
        "top_k": 3,
    }
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-secret-123"
    assert result.content == "ok" and result.usage is not None and result.usage.total_tokens == 4


@respx.mock
def test_stream_maps_chunks_usage_and_timings(llm) -> None:  # type: ignore[no-untyped-def]
    body = sse_body(
        chunk(""),
        chunk("Hel"),
        b": not data\n",
        chunk("lo"),
        chunk(finish="stop"),
        {
            "choices": [],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2},
            "timings": {"prompt_ms": 1.5, "predicted_ms": 3.0, "predicted_per_second": 66.0},
        },
    )
    route = respx.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
    )
    with llm.stream("hi") as stream:
        text = "".join(c.delta for c in stream)
    assert json.loads(route.calls.last.request.content)["stream_options"] == {"include_usage": True}
    result = stream.result()
    assert text == "Hello" and result.finish_reason == "stop"
    assert result.usage is not None and result.usage.completion_tokens == 2
    assert result.timings.predicted_ms == 3.0 and result.timings.tokens_per_s == 66.0


@respx.mock
def test_missing_done_after_finish_is_accepted(llm) -> None:  # type: ignore[no-untyped-def]
    respx.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(200, content=sse_body(chunk("a"), chunk(finish="stop"), done=False))
    )
    assert "".join(c.delta for c in llm.stream("x")) == "a"


@respx.mock
def test_stream_cut_before_final_frame_is_a_protocol_error(llm) -> None:  # type: ignore[no-untyped-def]
    respx.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(200, content=sse_body(chunk("par"), chunk("tial"), done=False))
    )
    with pytest.raises(ProviderProtocolError) as info:
        list(llm.stream("x"))
    assert info.value.partial_text == "partial"


@respx.mock
@pytest.mark.parametrize("frame", [b"{not json", b'{"choices": "nope"}', b'{"choices": [{"delta": {"content": 5}}]}'])
def test_malformed_frames_keep_partial_text(llm, frame: bytes) -> None:  # type: ignore[no-untyped-def]
    respx.post(f"{BASE}/chat/completions").mock(return_value=httpx.Response(200, content=sse_body(chunk("ok "), frame)))
    with pytest.raises(ProviderProtocolError) as info:
        list(llm.stream("x"))
    assert info.value.partial_text == "ok "


@respx.mock
@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            404,
            {"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": "model"}},
            ModelNotFoundError,
        ),
        (404, {"error": "model 'x' not found"}, ModelNotFoundError),
        (404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}, ProviderAPIError),
        (
            400,
            {
                "error": {
                    "code": 400,
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 9000,
                    "n_ctx": 4096,
                    "message": "request (9000 tokens) exceeds the available context size (4096 tokens)",
                }
            },
            ContextOverflowError,
        ),
        (
            400,
            {
                "object": "error",
                "message": "This model's maximum context length is 2048 tokens. However...",
                "code": 400,
            },
            ContextOverflowError,
        ),
        (400, {"error": "No models loaded. Please load a model"}, ModelNotFoundError),
        (400, {"error": "bad field"}, InvalidRequestError),
        (422, {"detail": [{"loc": ["body"], "msg": "bad"}]}, InvalidRequestError),
        (429, {"error": {"message": "slow down"}}, RateLimitError),
        (
            503,
            {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
            ServerUnavailableError,
        ),
        (500, b"<html>oops</html>", ProviderAPIError),
    ],
)
def test_error_bodies_map_to_types(llm, status: int, body: object, expected: type) -> None:  # type: ignore[no-untyped-def]
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    respx.post(f"{BASE}/chat/completions").mock(return_value=httpx.Response(status, **kwargs))
    with pytest.raises(expected) as info:
        llm.generate("x")
    assert type(info.value) is expected
    assert info.value.status == status
    with pytest.raises(expected):
        list(llm.stream("x"))


@respx.mock
def test_context_overflow_fields(llm) -> None:  # type: ignore[no-untyped-def]
    respx.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(
            400,
            json={
                "error": {
                    "code": 400,
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 9000,
                    "n_ctx": 4096,
                    "message": "too big",
                }
            },
        )
    )
    with pytest.raises(ContextOverflowError) as info:
        llm.generate("x")
    assert (info.value.n_prompt_tokens, info.value.n_ctx) == (9000, 4096)


@respx.mock
def test_error_body_on_http_200(llm) -> None:  # type: ignore[no-untyped-def]
    respx.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(200, json={"error": "Unexpected endpoint or method. (POST /chat/completions)"})
    )
    with pytest.raises(ProviderAPIError) as info:
        llm.generate("x")
    assert "Unexpected endpoint" in str(info.value)


@respx.mock
def test_error_frame_mid_stream_then_done(llm) -> None:  # type: ignore[no-untyped-def]
    respx.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(
            200,
            content=sse_body(
                chunk("so far"), {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}
            ),
        )
    )
    with pytest.raises(ProviderAPIError) as info:
        list(llm.stream("x"))
    assert info.value.partial_text == "so far" and info.value.status == 500


@respx.mock
def test_list_models(llm) -> None:  # type: ignore[no-untyped-def]
    respx.get(f"{BASE}/models").mock(return_value=httpx.Response(200, json={"data": [{"id": "a"}, {"id": "b"}]}))
    assert [m.id for m in llm.list_models()] == ["a", "b"]


@respx.mock
def test_api_key_never_in_reprs_or_errors(llm, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    import logging

    caplog.set_level(logging.DEBUG)
    respx.post(f"{BASE}/chat/completions").mock(return_value=httpx.Response(401, json={"error": "bad key"}))
    with pytest.raises(ProviderAPIError) as info:
        llm.generate("x")
    texts = [repr(llm), repr(llm.provider), repr(llm.provider.clients), str(info.value), repr(info.value), caplog.text]
    assert not any("sk-secret-123" in t for t in texts)
