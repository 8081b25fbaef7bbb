"""The gateway behind a real nginx, configured as docs/gateway.md says (the block is read from
the page) and with a bare ``proxy_pass`` (nginx's defaults: HTTP/1.0 upstream, buffering on).

Evidence in tokens, not milliseconds: when the client reads its first content frame, the fake
upstream has written a handful of tokens at most (unbuffered: one or two; the bound of ten
leaves room for a loaded machine). A buffering nginx holds ~20 tokens (4 KiB) back. A client that leaves stops the
upstream (its disconnect timestamp).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import GatewayProcess

from .network_servers import Nginx

DOCS = Path(__file__).resolve().parent.parent / "docs" / "gateway.md"
BARE = "location / { proxy_pass http://{upstream}; }"


def advised_block() -> str:
    block = re.search(r"```nginx\n(.*?)```", DOCS.read_text(), re.S)
    assert block, "docs/gateway.md has no nginx block"
    return block.group(1).replace("127.0.0.1:8000", "{upstream}")


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.05, default_max_tokens=400) as server:
        yield server


@pytest.fixture
def gateway(upstream: FakeOpenAIServer, tmp_path: Path) -> Iterator[GatewayProcess]:
    args = ["-p", "vllm", "-u", upstream.base_url, "-m", "fake-model"]
    server = GatewayProcess.launch(args, log_path=tmp_path / "gateway.log")
    yield server
    server.stop()


@pytest.mark.parametrize("config", ["advised", "bare"])
def test_frames_pass_nginx_as_they_come_and_a_leaving_client_stops_the_upstream(
    config: str, upstream: FakeOpenAIServer, gateway: GatewayProcess, tmp_path: Path
) -> None:
    location = advised_block() if config == "advised" else BARE
    front = Nginx(tmp_path, None, gateway.port, location=location)
    try:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", front.url + "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                assert "no-transform" in response.headers["cache-control"]  # (nginx takes X-Accel-* itself)
                for line in response.iter_lines():
                    if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        break
                record = upstream.requests("/v1/chat/completions")[0]
                written = record.tokens_sent  # what the upstream had written when the first frame arrived
            # leaving the block closed the connection to nginx mid-stream
        # a buffering nginx holds ~20 tokens back (4 KiB); the bound leaves the client half a second
        # (10 tokens) of being descheduled on a loaded machine
        assert written <= 10, f"the first frame came after {written} upstream tokens: buffered"
        upstream.wait_for_disconnect(record, timeout=15)
        assert not record.completed and record.tokens_sent < 400
    finally:
        front.stop()
