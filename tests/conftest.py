from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import respx.mocks

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from abstract_client import LLM, create_llm
from abstract_client.testing import (
    FakeLMStudioServer,
    FakeOllamaServer,
    FakeOpenAIServer,
    FakeServer,
)

# The lanes honour the environment's proxies (trust_env, as httpx): a machine's HTTP_PROXY would
# send every loopback test through it. The network tests set their own.
for _name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
    os.environ.pop(_name, None)
    os.environ.pop(_name.upper(), None)


class _TransportMocker(respx.mocks.AbstractRequestMocker):
    """respx at the transports: the lanes' generations go straight to their private transport
    (``abstract_client/http/transport.py``), past httpx's client and httpcore, where respx's own
    mockers wait. httpx's own transports are mocked the same way (for tests that use them)."""

    name = "abstract-client-transports"
    targets: ClassVar[list[str]] = [
        "abstract_client.http.transport.GuardedTransport",
        "httpx.AsyncHTTPTransport",
        "httpx.HTTPTransport",
    ]
    target_methods: ClassVar[list[str]] = ["handle_async_request", "handle_request"]

    @classmethod
    def to_httpx_request(cls, **kwargs: Any) -> httpx.Request:
        return kwargs["request"]  # type: ignore[no-any-return]

    @classmethod
    def from_sync_httpx_response(cls, httpx_response: httpx.Response, target: Any, **kwargs: Any) -> httpx.Response:
        return httpx_response

    @classmethod
    async def from_async_httpx_response(
        cls, httpx_response: httpx.Response, target: Any, **kwargs: Any
    ) -> httpx.Response:
        return httpx_response


respx.mocks.DEFAULT_MOCKER = _TransportMocker.name

# The contract suite runs on every HTTP lane, each against its protocol-faithful fake server.
LANES: dict[str, type[FakeServer]] = {
    "openai-compatible": FakeOpenAIServer,
    "ollama": FakeOllamaServer,
    "lmstudio": FakeLMStudioServer,
}


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every async test runs on asyncio AND trio."""
    return str(request.param)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight MLX llama (built once per session; the MLX test modules share it)."""
    from abstract_client.testing.tiny_mlx import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(params=list(LANES))
def lane(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def server(lane: str) -> Iterator[FakeServer]:
    # LM Studio's fake finishes prompts before noticing a disconnect by default (as LM Studio
    # does); the generic contract tests want every lane to notice at once. tests/test_lanes.py
    # covers the finish-the-prompt mode.
    with LANES[lane](finish_prompt_before_disconnect=False) as srv:
        yield srv


@pytest.fixture
def llm(server: FakeServer, lane: str) -> Iterator[LLM]:
    client = create_llm(lane, "fake-model", base_url=server.base_url, max_retries=0)
    yield client
    client.close()
