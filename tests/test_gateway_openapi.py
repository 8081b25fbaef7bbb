"""The gateway's OpenAPI document matches its routes, and schemathesis, sending what the
document allows and much that it does not, never gets a 5xx (bounded: a fixed seed and a fixed
number of examples per operation)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from abstract_client.gateway import BackendConfig, GatewayConfig
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway


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
    served = {
        (route.path, method)
        for route in gateway.app.app.routes
        if isinstance(route, Route)
        for method in (route.methods or set()) - {"HEAD"}
    }
    assert documented == served


def test_schemathesis_finds_no_server_error(gateway: InProcessGateway) -> None:
    cli = Path(sys.executable).parent / "schemathesis"
    argv = [
        str(cli) if cli.exists() else "schemathesis",
        "run",
        gateway.url + "/openapi.json",
        "--checks",
        "not_a_server_error",
        "--max-examples",
        "25",
        "--seed",
        "1",
        "--request-timeout",
        "30",
        "--no-color",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout
