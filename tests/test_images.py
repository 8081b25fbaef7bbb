"""Images on every HTTP wire, checked on the fake servers' real sockets: the bytes a server
decoded from what it received are the caller's image. Limits and refusals happen at the call
site or in the contract's first step — the fake then has no generation request at all."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import pytest

from abstract_client import (
    ImageInputError,
    ImageLimits,
    NotSupportedError,
    create_llm,
    image_part,
)
from abstract_client.images import resolve_images
from abstract_client.testing import FakeLMStudioServer, FakeOllamaServer, FakeOpenAIServer, FakeServer

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8  # a PNG by its signature: all a wire carries
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(255, -1, -1)) * 4


def ask(*parts: Any) -> list[Any]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is in these?"}, *parts]}]


def generations(server: FakeServer) -> list[Any]:
    return [r for r in server.requests() if r.method == "POST"]


# (lane, fake, base url attribute, extra create_llm options)
WIRES = [
    ("openai-compatible", FakeOpenAIServer, "base_url", {}),
    ("vllm", FakeOpenAIServer, "url", {}),
    ("llamacpp", FakeOpenAIServer, "url", {}),
    ("ollama", FakeOllamaServer, "url", {}),
    ("ollama-v1", FakeOllamaServer, "url", {"use_openai_api": True}),
    ("lmstudio", FakeLMStudioServer, "url", {}),
    ("lmstudio-native", FakeLMStudioServer, "url", {"native": True}),
]


@pytest.mark.parametrize(("lane", "fake", "url", "options"), WIRES, ids=[w[0] for w in WIRES])
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_every_wire_carries_the_images_bytes(
    lane: str, fake: type[FakeServer], url: str, options: dict[str, Any], stream: bool, tmp_path: Path
) -> None:
    """Two images — bytes and a file — arrive decoded, in order, on the server's socket."""
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(JPEG)
    options = dict(options)  # the parameter's dict is shared between the two stream cases
    native = options.pop("native", False)
    with (
        fake() as server,
        create_llm(
            lane.removesuffix("-v1").removesuffix("-native"), "fake-model", base_url=getattr(server, url), **options
        ) as llm,
    ):
        messages = ask(image_part(PNG), image_part(photo))
        if native:  # LM Studio's native route takes one input: the text and its images
            if stream:
                pieces = list(llm.stream(messages=messages, max_tokens=3, native=True))
                assert pieces
            else:
                assert llm.generate(messages=messages, max_tokens=3, native=True).content
        elif stream:
            assert list(llm.stream(messages=messages, max_tokens=3))
        else:
            assert llm.generate(messages=messages, max_tokens=3).content
        record = generations(server)[-1]
        assert record.path == ("/api/v1/chat" if native else record.path)
        assert record.images == [PNG, JPEG]
        assert "What is in these?" in str(record.body)
        assert str(photo) not in str(record.body)  # a path never goes on a wire


@pytest.mark.parametrize(
    ("lane", "fake", "options"),
    [("ollama", FakeOllamaServer, {}), ("lmstudio", FakeLMStudioServer, {"native": True})],
    ids=["ollama", "lmstudio-native"],
)
def test_base64_only_wires_refuse_a_url_before_sending(
    lane: str, fake: type[FakeServer], options: dict[str, Any]
) -> None:
    with fake() as server, create_llm(lane, "fake-model", base_url=server.url, max_retries=0) as llm:
        with pytest.raises(NotSupportedError, match="never fetches"):
            llm.generate(messages=ask(image_part("https://example.com/cat.png")), **options)
        assert generations(server) == []


def test_v1_wire_passes_a_url_on_for_the_server_to_fetch() -> None:
    with FakeOpenAIServer() as server, create_llm("openai-compatible", "fake-model", base_url=server.base_url) as llm:
        llm.generate(messages=ask(image_part("https://example.com/cat.png")))
        sent = server.last.body["messages"][0]["content"][1]
        assert sent == {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


def test_llama_server_without_a_projector_is_refused_before_the_generation() -> None:
    """/props says modalities.vision false: a NotSupportedError naming --mmproj, never the
    server's 500 (which would look like a failing server, and be retried)."""
    with FakeOpenAIServer() as server, create_llm("llamacpp", "m", base_url=server.url) as llm:
        server.behavior.vision = False
        with pytest.raises(NotSupportedError, match="mmproj"):
            llm.generate(messages=ask(image_part(PNG)))
        assert [r.path for r in server.requests()] == ["/props"]
        assert llm.generate("text still works", max_tokens=2).content  # text calls are unaffected


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ask(image_part(PNG + bytes(2000))), "over max_bytes"),
        (lambda: ask(*[image_part(PNG)] * 3), "more than 2 images"),
        (lambda: ask({"type": "image_url", "image_url": {"url": "data:image/png;base64,###"}}), "not valid base64"),
        (lambda: ask({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}), "not an image"),
        (lambda: ask({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}), "not a PNG"),
        (lambda: ask({"type": "image_url", "image_url": {"url": "/nonexistent/cat.png"}}), "cannot read"),
        (lambda: ask({"type": "image_url", "image_url": {}}), "needs image_url"),
    ],
    ids=["too-large", "too-many", "bad-base64", "not-an-image", "not-image-bytes", "missing-file", "no-url"],
)
def test_a_bad_image_is_refused_at_the_call_site(make: Any, match: str) -> None:
    with FakeOpenAIServer() as server:
        llm = create_llm(
            "openai-compatible", "fake-model", base_url=server.base_url, max_image_bytes=3000, max_images=2
        )
        with llm, pytest.raises(ImageInputError, match=match) as info:
            llm.generate(messages=make())
        assert isinstance(info.value, ValueError)  # a wrong argument, as every other one
        assert server.requests() == []


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.png"
    big.write_bytes(PNG + bytes(10_000))
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("the file was read"))
    with pytest.raises(ImageInputError, match="over max_bytes"):
        resolve_images(ask(image_part(big)), ImageLimits(max_bytes=1000))


def test_resolving_never_modifies_the_callers_messages(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    messages = ask({"type": "image_url", "image_url": {"url": f"file://{tmp_path / 'a.png'}"}})
    before = repr(messages)
    resolved = resolve_images(messages, ImageLimits())
    assert repr(messages) == before
    url = resolved[0]["content"][1]["image_url"]["url"]
    assert url == "data:image/png;base64," + base64.b64encode(PNG).decode()
    with pytest.raises(ValueError):
        ImageLimits(max_bytes=-1)
    with pytest.raises(ValueError):
        create_llm("openai-compatible", "m", base_url="http://127.0.0.1:9", max_images=True)


def test_gateway_never_reads_a_file_a_client_names(tmp_path: Path) -> None:
    """Through the gateway an image is data or a URL: a path is a 400 and the file is not read;
    a data URL reaches the upstream as the same bytes."""
    from abstract_client.gateway import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    secret = tmp_path / "secret.png"
    secret.write_bytes(PNG)
    with FakeOpenAIServer() as upstream:
        config = GatewayConfig(
            backends=[BackendConfig(name="m", provider="openai-compatible", base_url=upstream.base_url)]
        )
        with InProcessGateway(config) as gw:
            body = {"model": "m", "max_tokens": 3, "messages": ask(image_part(secret))}
            refused = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
            assert refused.status_code == 400, refused.text
            assert "not files" in refused.json()["error"]["message"]
            assert generations(upstream) == []
            body["messages"] = ask(image_part(PNG))
            answered = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
            assert answered.status_code == 200, answered.text
            assert upstream.last.images == [PNG]
