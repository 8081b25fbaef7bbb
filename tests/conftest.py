from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from abstract_client import LLM, create_llm
from abstract_client.testing import FakeOpenAIServer


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every async test runs on asyncio AND trio."""
    return str(request.param)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture
def llm(server: FakeOpenAIServer) -> Iterator[LLM]:
    client = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0)
    yield client
    client.close()
