"""The chat page (`serve --ui`) in a real browser: Debian's Chromium, headless, driven by the
Playwright client (no browser download). A person types, watches the answer stream, presses Stop
(or Esc): the page shows the stopped state at once and keeps the partial answer, the gateway
records the client's disconnect, and the engine's own evidence says it stopped — llama-server's
``cancel task`` and its frozen decoded count; the in-process MLX engine's token counter.
Screenshots land in ``$ABSTRACT_CLIENT_ARTIFACTS`` (default: the test's temp dir), never in git."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from abstract_client.gateway import BackendConfig, GatewayConfig
from abstract_client.testing.gateway import InProcessGateway
from abstract_client.testing.processes import LlamaServer

from .helpers import launch_llama_server, needs_mlx, wait_until
from .test_llamacpp_real import assert_server_stopped

CHROMIUM = os.environ.get("ABSTRACT_CLIENT_CHROMIUM", "/usr/bin/chromium")
STORY = "Write a very long story about a fox and a crow, with many chapters."


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if os.environ.get("ABSTRACT_CLIENT_REQUIRE_ENGINES") != "1" and not shutil.which(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("ABSTRACT_CLIENT_ARTIFACTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = launch_llama_server(tmp_path_factory, "llama-ui", threads=1)
    yield server
    server.stop()


def open_page(browser: Any, url: str) -> Any:
    # bypass_csp: the page's own policy forbids eval, which Playwright's wait_for_function uses
    page = browser.new_page(viewport={"width": 390, "height": 760}, bypass_csp=True)  # a phone-width screen
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url + "/")
    page.wait_for_function("document.getElementById('model').options.length > 0")
    page.requests = requests  # every request the page made, checked: none leaves the gateway
    return page


def ask(page: Any, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    last_answer = "() => { const a = document.querySelectorAll('.assistant'); return a.length && a[a.length - 1]; }"
    page.wait_for_function(f"(({last_answer})() || {{textContent: ''}}).textContent.length > 15", timeout=120_000)


def stopped(page: Any) -> tuple[float, str]:
    page.wait_for_function("document.body.dataset.state === 'stopped'", timeout=10_000)
    note = page.wait_for_selector(".note", timeout=10_000).text_content()
    return float(page.evaluate("document.body.dataset.stopShownMs")), note


def test_stop_in_the_browser_stops_llama_server(browser: Any, llama: LlamaServer, artifacts: Path) -> None:
    config = GatewayConfig(backends=[BackendConfig(name="smollm2", provider="llamacpp", base_url=llama.url)], ui=True)
    with InProcessGateway(config) as gw:
        page = open_page(browser, gw.url)
        for gesture in ("click", "escape"):
            cancels = len(llama.cancelled_tasks())
            ask(page, STORY)
            if gesture == "click":
                page.screenshot(path=str(artifacts / "chat-mid-answer.png"))
                page.click("#stop")
            else:
                page.keyboard.press("Escape")
            shown_ms, note = stopped(page)
            assert shown_ms < 100, shown_ms  # the page shows the stop at once
            assert "client_disconnect" in note and "engine stopped" in note
            assert_server_stopped(llama, cancels)  # cancel task, slot idle, decoded count frozen
            answer = page.locator(".assistant").last
            assert "stopped" in (answer.get_attribute("class") or "") and len(answer.text_content() or "") > 15
        page.screenshot(path=str(artifacts / "chat-after-stop.png"))
        stops = gw.gateway.metrics.stops[("smollm2", "client_disconnect")]
        assert stops == 2
        # a second question after the stop is answered
        page.fill("#prompt", "Say hello.")
        page.press("#prompt", "Enter")
        page.wait_for_function("document.body.dataset.state === 'done'", timeout=120_000)
        assert page.locator(".assistant").last.text_content()
        assert all(url.startswith(gw.url) for url in page.requests), page.requests  # nothing external
        page.close()


@needs_mlx
def test_stop_in_the_browser_stops_in_process_mlx(browser: Any) -> None:
    from abstract_client.app.assets import smollm2_mlx
    from abstract_client.providers.mlx import MLXProvider

    config = GatewayConfig(backends=[BackendConfig(name="smollm2", provider="mlx", model=str(smollm2_mlx()))], ui=True)
    with InProcessGateway(config) as gw:
        provider = gw.gateway.backends["smollm2"].llm.provider
        assert isinstance(provider, MLXProvider)
        page = open_page(browser, gw.url)
        ask(page, STORY)
        page.click("#stop")
        shown_ms, note = stopped(page)
        assert shown_ms < 100, shown_ms
        assert provider.thread.wait_idle(15)
        assert "tokens sampled after the stop: 0" in note  # the engine's own counter
        record = next(iter(gw.gateway.stop_records.values()))
        stats = provider.stats(record["request_id"])
        assert stats is not None and stats.stopped_in == "decode" and stats.tokens_at_stop == stats.tokens
        t0 = time.monotonic()
        assert wait_until(lambda: provider.thread.idle, 5) and time.monotonic() - t0 < 5
        page.close()


def test_the_page_asks_for_the_key_and_keeps_it_in_memory(browser: Any) -> None:
    from abstract_client.testing import FakeOpenAIServer

    with FakeOpenAIServer(token_delay=0.01) as upstream:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=upstream.base_url)
        with InProcessGateway(GatewayConfig(backends=[backend], ui=True, api_key="s3cret-key")) as gw:
            page = browser.new_page(bypass_csp=True)
            page.goto(gw.url + "/")
            page.wait_for_selector("#key:not([hidden])")
            page.fill("#key", "s3cret-key")
            page.dispatch_event("#key", "change")
            page.wait_for_function("document.getElementById('model').options.length > 0")
            ask(page, "hello")
            page.keyboard.press("Escape")
            _, note = stopped(page)
            assert "client_disconnect" in note
            storage = page.evaluate("JSON.stringify([localStorage, sessionStorage, document.cookie])")
            assert "s3cret" not in storage
            page.close()
