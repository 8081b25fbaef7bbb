"""The gateway in front of REAL engines, driven by openai-python and curl: a client's disconnect
ends in llama-server's own ``cancel task`` log line, and in the MLX lane's own token counter
(0 tokens sampled once its worker saw the flag; the engine idle). vLLM's case is in
``test_vllm_real.py`` (its module server)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from abstract_client.gateway import BackendConfig, GatewayConfig
from abstract_client.testing.gateway import GatewayProcess, InProcessGateway
from abstract_client.testing.processes import LlamaServer

from .helpers import launch_llama_server, needs_gguf, needs_mlx, needs_transformers, wait_until
from .test_llamacpp_real import CAPITAL, assert_server_stopped

STORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a very long story about a dragon."},
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = launch_llama_server(tmp_path_factory, "llama-gateway")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    server = GatewayProcess.launch(["-p", "llamacpp", "-u", llama.url, "--name", "smollm2"], log_path=log)
    yield server
    server.stop()


def oa(gateway: GatewayProcess, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, **kw)  # type: ignore[arg-type]


@pytest.mark.llamacpp
def test_openai_python_through_the_gateway_to_llama_server(gateway: GatewayProcess, llama: LlamaServer) -> None:
    assert llama.wait_idle(15)
    answer = oa(gateway).chat.completions.create(model="smollm2", messages=CAPITAL, max_tokens=20, temperature=0)  # type: ignore[arg-type]
    assert "Paris" in (answer.choices[0].message.content or "")
    # stream, break: the gateway logs the stop and llama-server cancels the task
    cancels = len(llama.cancelled_tasks())
    stream = oa(gateway).chat.completions.create(
        model="smollm2",
        messages=STORY,  # type: ignore[arg-type]
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"X-Request-Id": "break-1"},
    )
    for n, _ in enumerate(stream):
        if n == 10:
            break
    stream.close()
    assert gateway.wait_for_stop("break-1")[0][1] == "client_disconnect"
    assert_server_stopped(llama, cancels)
    # non-streaming, abandoned by the client's timeout: the same
    cancels = len(llama.cancelled_tasks())
    with pytest.raises(openai.APITimeoutError):
        oa(gateway, timeout=2.0).chat.completions.create(
            model="smollm2",
            messages=STORY,  # type: ignore[arg-type]
            max_tokens=2000,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": "timeout-1"},
        )
    assert gateway.wait_for_stop("timeout-1")[0][1] == "client_disconnect"
    assert_server_stopped(llama, cancels)


@pytest.mark.llamacpp
def test_curl_max_time_through_the_gateway_to_llama_server(gateway: GatewayProcess, llama: LlamaServer) -> None:
    assert llama.wait_idle(15)
    cancels = len(llama.cancelled_tasks())
    body = json.dumps({"model": "smollm2", "messages": STORY, "max_tokens": 2000, "ignore_eos": True, "stream": True})
    proc = subprocess.run(
        [
            "curl",
            "-sS",
            "-N",
            "--max-time",
            "2",
            "-H",
            "Content-Type: application/json",
            "-H",
            "X-Request-Id: curl-1",
            "-d",
            body,
            gateway.url + "/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 28, proc.stderr
    assert gateway.wait_for_stop("curl-1")[0][1] == "client_disconnect"
    assert_server_stopped(llama, cancels)


# -- in-process MLX behind the gateway -----------------------------------------------------------------


def disconnect_after_chunks(gw: InProcessGateway, body: dict[str, Any], request_id: str, chunks: int = 8) -> int:
    """Stream ``body`` through the gateway and leave after ``chunks`` frames (leaving the block
    closes the connection: the disconnect). Returns the frames received."""
    received = 0
    with httpx.stream(
        "POST", gw.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": request_id}, timeout=120
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                received += 1
                if received == chunks:
                    break
    return received


def assert_engine_stopped_in_decode(provider: Any, request_id: str, received: int) -> None:
    """The in-process engine's own record: stopped in decode, nothing counted after the flag."""
    assert provider.thread.wait_idle(15), "the engine is still decoding"
    stats = provider.stats(request_id)
    assert stats is not None and stats.stopped_in == "decode" and not stats.finished
    assert stats.tokens_at_stop == stats.tokens
    assert received <= stats.tokens < 2000


def disconnect_mid_stream(gw: InProcessGateway, name: str, provider_type: type, request_id: str) -> dict[str, Any]:
    """A client leaves a stream of the in-process backend ``name`` after a few chunks: its engine
    stopped in decode (its own record) and the gateway counted the stop. Returns the request."""
    provider = gw.gateway.backends[name].llm.provider
    assert isinstance(provider, provider_type)
    body = {"model": name, "messages": STORY, "max_tokens": 2000, "stream": True, "logit_bias": {2: -1e9}}
    assert_engine_stopped_in_decode(provider, request_id, disconnect_after_chunks(gw, body, request_id))
    assert wait_until(lambda: gw.gateway.metrics.stops[(name, "client_disconnect")] == 1)
    return body


def capital(gw: InProcessGateway, name: str) -> dict[str, Any]:
    """The next request's answer, as JSON (the engine serves on after the stop)."""
    answer = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": name, "messages": CAPITAL, "max_tokens": 12},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


@needs_mlx
def test_disconnect_stops_in_process_mlx(tmp_path: Path) -> None:
    from abstract_client.app.assets import smollm2_mlx
    from abstract_client.providers.mlx import MLXProvider

    config = GatewayConfig(backends=[BackendConfig(name="smollm2", provider="mlx", model=str(smollm2_mlx()))])
    with InProcessGateway(config) as gw:
        body = disconnect_mid_stream(gw, "smollm2", MLXProvider, "mlx-1")
        assert gw.gateway.metrics.running["smollm2"] == 0
        # the engine answers the next request at once
        t0 = time.perf_counter()
        assert capital(gw, "smollm2")["choices"][0]["message"]["content"]
        assert time.perf_counter() - t0 < 60
        # Regenerate the stopped request: its prompt comes from the KV the stop kept, and the
        # gateway says so (OpenAI's usage field) and counts it in /metrics
        again = httpx.post(
            gw.url + "/v1/chat/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=120
        )
        usage = again.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        metrics = httpx.get(gw.url + "/metrics").text
        pattern = r'^abstract_client_gateway_prompt_tokens_cached_total\{backend="smollm2"\} (\S+)$'
        counted = re.search(pattern, metrics, re.M)
        assert counted is not None and float(counted.group(1)) >= usage["prompt_tokens"] - 1, metrics


@needs_transformers
def test_disconnect_stops_in_process_transformers() -> None:
    from abstract_client.app.assets import smollm2_hf
    from abstract_client.providers.transformers import TransformersProvider

    config = GatewayConfig(backends=[BackendConfig(name="smol-hf", provider="transformers", model=str(smollm2_hf()))])
    with InProcessGateway(config) as gw:
        disconnect_mid_stream(gw, "smol-hf", TransformersProvider, "hf-1")
        assert "Paris" in capital(gw, "smol-hf")["choices"][0]["message"]["content"]


@needs_gguf
def test_disconnect_stops_in_process_gguf() -> None:
    from abstract_client.app.assets import smollm2_gguf
    from abstract_client.providers.gguf import GGUFProvider

    config = GatewayConfig(
        backends=[BackendConfig(name="smol-gguf", provider="gguf", model=str(smollm2_gguf()), options={"n_ctx": 4096})]
    )
    with InProcessGateway(config) as gw:
        disconnect_mid_stream(gw, "smol-gguf", GGUFProvider, "gguf-1")
        answer = capital(gw, "smol-gguf")
        assert "Paris" in answer["choices"][0]["message"]["content"]
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the context kept its KV


@pytest.mark.llamacpp
def test_async_openai_python_through_the_gateway_to_llama_server(gateway: GatewayProcess, llama: LlamaServer) -> None:
    import asyncio

    assert llama.wait_idle(15)
    cancels = len(llama.cancelled_tasks())

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model="smollm2",
            messages=STORY,  # type: ignore[arg-type]
            max_tokens=2000,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": "async-break-1"},
        )
        n = 0
        async for _ in stream:
            n += 1
            if n == 10:
                break
        await stream.close()
        await client.close()

    asyncio.run(main())
    assert gateway.wait_for_stop("async-break-1")[0][1] == "client_disconnect"
    assert_server_stopped(llama, cancels)
    cancels = len(llama.cancelled_tasks())

    async def abandoned() -> None:
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=2.0)
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(
                model="smollm2",
                messages=STORY,  # type: ignore[arg-type]
                max_tokens=2000,
                extra_body={"ignore_eos": True},
                extra_headers={"X-Request-Id": "async-timeout-1"},
            )
        await client.close()

    asyncio.run(abandoned())
    assert gateway.wait_for_stop("async-timeout-1")[0][1] == "client_disconnect"
    assert_server_stopped(llama, cancels)


@needs_mlx
def test_an_in_process_stop_is_recorded_with_the_engines_own_figures(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's handler is released at once by a client's disconnect; the engine drains
    behind it. The stop's record (``GET /v1/requests/{id}``, the chat page's note) is published
    only once the engine has settled, with the engine's own figures — never before, with none."""
    from .helpers import HeldFlag

    config = GatewayConfig(backends=[BackendConfig(name="tiny", provider="mlx", model=str(tiny_dir))])
    with InProcessGateway(config) as gw:
        provider = gw.gateway.backends["tiny"].llm.provider
        held = HeldFlag(lambda: provider.thread.ident)  # type: ignore[attr-defined]
        held.install(monkeypatch)
        body = {"model": "tiny", "messages": STORY, "max_tokens": 100_000, "stream": True, "logit_bias": {1: -1e9}}
        try:
            disconnect_after_chunks(gw, body, "held-1")
            assert wait_until(held.reached.is_set, 30), "the engine never read the flag"
            assert wait_until(lambda: "held-1" not in gw.gateway.flights, 30), "the handler was not released"
            handler_released = time.monotonic()
            assert not held.expired.is_set()
            record = httpx.get(gw.url + "/v1/requests/held-1", timeout=10)
            assert record.status_code == 404, record.text  # the engine has not settled: no record yet
        finally:
            engine_released = time.monotonic()
            held.release.set()
        assert provider.thread.wait_idle(30)  # type: ignore[attr-defined]
        assert wait_until(lambda: httpx.get(gw.url + "/v1/requests/held-1", timeout=10).status_code == 200, 30)
        record = httpx.get(gw.url + "/v1/requests/held-1", timeout=10).json()
        assert record["reason"] == "client_disconnect" and record["tokens_after_stop"] == 0
        # counted to the engine's stop, not to the handler's return (the engine was held between)
        assert record["stop_to_engine_stopped_ms"] >= (engine_released - handler_released) * 1000 - 5


@needs_mlx
def test_responses_on_an_in_process_engine_run_past_their_reader_and_stop_by_cancel(tiny_dir: Path) -> None:
    """``/v1/responses`` in front of an in-process engine (#42): a foreground stream stops when
    its client leaves, a background one generates on without a reader and its cancel stops the
    engine — by the engine's own record."""
    config = GatewayConfig(backends=[BackendConfig(name="tiny", provider="mlx", model=str(tiny_dir))])
    with InProcessGateway(config) as gw:
        provider = gw.gateway.backends["tiny"].llm.provider
        body = {"model": "tiny", "input": "Tell me a story.", "max_output_tokens": 100_000, "logit_bias": {1: -1e9}}

        def leave_after(n: int, **extra: Any) -> list[dict[str, Any]]:
            seen = []
            with httpx.stream("POST", gw.url + "/v1/responses", json={**body, **extra}, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        if len(seen) == n:
                            break
            return seen

        foreground = leave_after(8, stream=True)[0]["response"]["id"]
        assert wait_until(lambda: gw.gateway.metrics.stops[("tiny", "client_disconnect")] == 1, 30)
        assert provider.thread.wait_idle(30)
        stopped = provider.stats(foreground.removeprefix("resp_"))
        assert stopped is not None and stopped.stopped_in == "decode" and not stopped.finished

        response_id = leave_after(8, stream=True, background=True)[0]["response"]["id"]
        url = f"{gw.url}/v1/responses/{response_id}"

        def text() -> str:
            output = httpx.get(url, timeout=10).json()["output"]
            return "".join(part["text"] for item in output for part in item.get("content", []))

        so_far = len(text())
        assert wait_until(lambda: len(text()) > so_far + 20, 30), "the engine stopped with its reader"
        cancelled = httpx.post(url + "/cancel", timeout=30).json()
        assert cancelled["status"] == "cancelled"
        assert provider.thread.wait_idle(30)
        stats = provider.stats(response_id)
        assert stats is not None and stats.stopped_in == "decode" and stats.tokens_at_stop == stats.tokens
        assert wait_until(lambda: httpx.get(f"{gw.url}/v1/requests/{response_id}", timeout=10).status_code == 200, 30)
        record = httpx.get(f"{gw.url}/v1/requests/{response_id}", timeout=10).json()
        assert record["reason"] == "cancel_endpoint" and record["tokens_after_stop"] == 0
