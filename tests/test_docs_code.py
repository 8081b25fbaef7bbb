"""Docs are code: every ```python block in README.md and docs/ runs here, as written.

A page's blocks run in order in one namespace (a later block may use an earlier one's names, as
a reader does). A block that talks to a server gets one: the bundled fake for the lane, or a
real llama-server where the page's point is the server's own behaviour (tools, resumable
streams, embeddings). Only addresses and file paths are substituted — the documented
``http://127.0.0.1:8080`` becomes the fake's port — and a lane's default address (a block that
passes none) is the fake's. Functions a block defines named ``test_*`` are called afterwards.
A page whose blocks have no stage here fails: a new page cannot slip past.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from abstract_client.testing import FakeOllamaServer, FakeOpenAIServer

from .helpers import launch_llama_server

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def fenced_python(text: str) -> list[tuple[int, str]]:
    """``(line, code)`` of each ```python block of a Markdown text."""
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in FENCE.finditer(text)]


# A block that needs packages the project's environment cannot hold beside its own (a framework
# that pins an older openai-python) starts with this line; the test named there runs it, in the
# venv it makes, and this suite leaves it out (tests/test_sdk_frameworks_openai2.py).
ELSEWHERE = "# runs beside openai-python 2.x: tests/test_sdk_frameworks_openai2.py\n"


def python_blocks(page: Path) -> list[tuple[int, str]]:
    return [(line, code) for line, code in fenced_python(page.read_text()) if not code.startswith(ELSEWHERE)]


def blocks_run_elsewhere(page: Path) -> list[tuple[int, str]]:
    return [(line, code) for line, code in fenced_python(page.read_text()) if code.startswith(ELSEWHERE)]


def pages_with_code() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [str(p.relative_to(ROOT)) for p in pages if python_blocks(p)]


@dataclass
class Stage:
    """What a page's blocks run against: text substitutions (the documented address -> the
    real one) and the lanes' default addresses."""

    replace: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)  # lane class path -> base URL
    env: dict[str, str] = field(default_factory=dict)


StageFactory = Callable[[pytest.TempPathFactory, Path], contextlib.AbstractContextManager[Stage]]
STAGES: dict[str, StageFactory] = {}
# pages whose stage is a real llama-server: marked as the real-engine tests are (the core suite
# on the other Python versions runs without engines)
REAL_SERVER_PAGES = {"docs/embeddings.md", "docs/tools-and-structured-output.md", "docs/resumable.md"}


def stage(*pages: str) -> Callable[[StageFactory], StageFactory]:
    def register(factory: StageFactory) -> StageFactory:
        for page in pages:
            STAGES[page] = factory
        return factory

    return register


@contextlib.contextmanager
def _fake(**behavior: Any) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(**behavior) as server:
        yield server


@stage(
    "README.md",
    "docs/index.md",
    "docs/cancellation.md",
    "docs/writing-a-lane.md",
    "docs/testing.md",
)
@contextlib.contextmanager
def _one_fake(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    """A llama-server-like fake at the documented address (10 ms a token: a Stop pressed after
    a second lands mid-answer)."""
    with _fake(token_delay=0.01) as server:
        root = server.base_url.removesuffix("/v1")
        yield Stage(
            replace={"http://127.0.0.1:8080": root},
            defaults={"providers.llamacpp.LlamaCppProvider": root},
        )


@stage("docs/fleet.md")
@contextlib.contextmanager
def _three_fakes(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    with _fake() as a, _fake() as b, _fake() as c:
        yield Stage(
            replace={
                "http://a:8080": a.base_url.removesuffix("/v1"),
                "http://b:8080": b.base_url.removesuffix("/v1"),
                "http://c:8080": c.base_url.removesuffix("/v1"),
                "http://gpu-box:8000/v1": c.base_url,
            }
        )


@stage("docs/sdks.md", "docs/frameworks.md")
@contextlib.contextmanager
def _fake_and_ollama(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    """llama-server's and Ollama's fakes at their documented addresses, 10 ms a token and
    answers long enough that every Stop on the page lands mid-answer."""
    with (
        _fake(token_delay=0.01, default_max_tokens=2000) as llama,
        FakeOllamaServer(token_delay=0.01, default_max_tokens=2000, models={"llama3.2": True}) as ollama,
    ):
        yield Stage(replace={"http://127.0.0.1:8080": llama.url, "http://127.0.0.1:11434": ollama.url})


@stage("docs/images.md")
@contextlib.contextmanager
def _ollama(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    """Ollama and llama-server fakes at their default addresses; a screenshot on the Desktop (a
    PNG by its signature: all the wire carries; no imaging library needed)."""
    (home / "Desktop").mkdir()
    (home / "Desktop" / "screenshot.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    with FakeOllamaServer(token_delay=0.0, models={"llava": True}) as ollama, _fake() as llama:
        yield Stage(
            defaults={
                "providers.ollama.OllamaProvider": ollama.base_url,
                "providers.llamacpp.LlamaCppProvider": llama.base_url.removesuffix("/v1"),
            }
        )


@stage("docs/network.md")
@contextlib.contextmanager
def _company_network(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    """The company's CA and the user's client certificate, made here (create_llm reads them)."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    me = ca.issue_cert("me@corp.example")
    d = tmp.mktemp("ssl")
    ca.cert_pem.write_to_path(str(d / "corp-ca.pem"))
    me.cert_chain_pems[0].write_to_path(str(d / "me.pem"))
    me.private_key_pem.write_to_path(str(d / "me.key"))
    yield Stage(replace={f"/etc/ssl/{n}": str(d / n) for n in ("corp-ca.pem", "me.pem", "me.key")})


@stage("docs/observability.md")
@contextlib.contextmanager
def _nothing(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    yield Stage()


@stage("docs/gateway.md")
@contextlib.contextmanager
def _gateway(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    """A real gateway (in this process) in front of a llama-server fake, at the documented
    address."""
    from abstract_client.gateway.config import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    with _fake(token_delay=0.01) as upstream:
        config = GatewayConfig(
            backends=[BackendConfig(name="smollm2", provider="llamacpp", base_url=upstream.base_url)]
        )
        with InProcessGateway(config) as gw:
            yield Stage(replace={"http://127.0.0.1:8000": gw.url})


@stage("docs/anthropic.md")
@contextlib.contextmanager
def _fake_and_gateway(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    """A fake server at the documented 8080 and a real gateway at the documented 8000 in front
    of it (through the anthropic lane: the fake counts tokens at /v1/messages/count_tokens)."""
    from abstract_client.gateway.config import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    with _fake(token_delay=0.01) as upstream:
        root = upstream.base_url.removesuffix("/v1")
        backend = BackendConfig(name="smollm2", provider="anthropic", base_url=root)
        with InProcessGateway(GatewayConfig(backends=[backend])) as gw:
            yield Stage(replace={"http://127.0.0.1:8080": root, "http://127.0.0.1:8000": gw.url})


@stage("docs/embeddings.md")
@contextlib.contextmanager
def _llama_embeddings(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    server = launch_llama_server(tmp, "docs-embeddings", extra=["--embeddings", "--pooling", "mean"])
    try:
        yield Stage(replace={"http://127.0.0.1:8080": server.url})
    finally:
        server.stop()


@stage("docs/resumable.md")
@contextlib.contextmanager
def _llama_and_two_hosts(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    """A real llama-server at the documented 8080, and the two gateway hosts of "Several hosts"
    at their documented addresses, sharing a real redis-server (the page creates, reads, resumes
    and cancels a background response across them)."""
    from abstract_client.gateway.config import BackendConfig, GatewayConfig
    from abstract_client.testing.gateway import InProcessGateway

    from .test_gateway_hosts import RedisServer

    server = launch_llama_server(tmp, "docs-resumable", extra=["--jinja"])
    redis = RedisServer(tmp.mktemp("docs-redis"))
    try:
        hosts = []
        with contextlib.ExitStack() as stack:
            for _ in range(2):
                backend = BackendConfig(name="llamacpp", provider="llamacpp", base_url=server.url)
                hosts.append(stack.enter_context(InProcessGateway(GatewayConfig([backend], store=redis.url))))
            yield Stage(
                replace={
                    "http://127.0.0.1:8080": server.url,
                    "http://10.0.0.11:8000": hosts[0].url,
                    "http://10.0.0.12:8000": hosts[1].url,
                }
            )
    finally:
        redis.stop()
        server.stop()


@stage("docs/tools-and-structured-output.md")
@contextlib.contextmanager
def _llama(tmp: pytest.TempPathFactory, home: Path) -> Iterator[Stage]:
    server = launch_llama_server(tmp, "docs-llama", extra=["--jinja"])
    try:
        yield Stage(replace={"http://127.0.0.1:8080": server.url})
    finally:
        server.stop()


def run_blocks(label: str, blocks: list[tuple[int, str]], replace: dict[str, str]) -> dict[str, Any]:
    """Run ``blocks`` in order in one namespace (addresses substituted), then every ``test_*``
    function they defined; an exception fails the page, with the block's line in its traceback."""
    namespace: dict[str, Any] = {"__name__": f"docs_{Path(label).stem.replace('-', '_')}"}
    for line, code in blocks:
        for documented, real in replace.items():
            code = code.replace(documented, real)
        exec(compile(code, f"{label}:{line}", "exec"), namespace)  # the docs' own code
    for name, value in list(namespace.items()):
        if name.startswith("test_") and callable(value):
            value()
    return namespace


def test_a_block_that_fails_fails_its_page() -> None:
    page = "Intro\n\n```python\nx = 1\n```\n\n```python\ndef test_x():\n    assert x == 2\n```\n"
    blocks = [(line, code) for line, code in fenced_python(page)]
    assert [code for _, code in blocks] == ["x = 1\n", "def test_x():\n    assert x == 2\n"]
    with pytest.raises(AssertionError):
        run_blocks("page.md", blocks, {})
    assert run_blocks("page.md", [(3, "y = 'http://127.0.0.1:8080'\n")], {"http://127.0.0.1:8080": "X"})["y"] == "X"


def _class(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(__import__(f"abstract_client.{module}", fromlist=[name]), name)


def test_every_page_with_code_has_a_stage() -> None:
    assert sorted(set(pages_with_code()) - set(STAGES)) == []
    real = (_llama, _llama_embeddings, _llama_and_two_hosts)
    assert {page for page, stage in STAGES.items() if stage in real} == REAL_SERVER_PAGES
    assert "README.md" in pages_with_code()


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=pytest.mark.llamacpp) if p in REAL_SERVER_PAGES else p for p in pages_with_code()],
)
def test_the_page_runs(
    page: str,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if page not in STAGES:
        pytest.fail(f"{page} has Python blocks and no stage in tests/test_docs_code.py")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with STAGES[page](tmp_path_factory, home) as scene:
        monkeypatch.setenv("HOME", str(home))  # after the stage: engines are found in the real cache
        for lane, url in scene.defaults.items():
            monkeypatch.setattr(_class(lane), "default_base_url", url)
        for name, value in scene.env.items():
            monkeypatch.setenv(name, value)
        run_blocks(page, python_blocks(ROOT / page), scene.replace)
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err


def test_the_first_page_links_every_guide() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    guides = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
    assert [g for g in guides if f"]({g})" not in index] == []


def test_the_address_table_is_the_lanes_defaults() -> None:
    """docs/index.md's table of addresses: each lane's default, as the code has it."""
    from abstract_client.registry import _factory

    index = (ROOT / "docs" / "index.md").read_text()
    rows = dict(re.findall(r"^\| `([\w-]+)` \| `(https?://[^`]+)` \|", index, re.M))
    lanes = ["llamacpp", "vllm", "ollama", "lmstudio", "remote", "anthropic", "openai-compatible"]
    assert sorted(rows) == sorted(lanes)
    for lane in lanes:
        assert _factory(lane).default_base_url == rows[lane], lane


def test_the_api_glance_is_the_code() -> None:
    """docs/api.md's "At a glance" is what scripts/api_glance.py renders from the signatures
    (``python scripts/api_glance.py --write`` after changing one)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("api_glance", ROOT / "scripts" / "api_glance.py")
    assert spec is not None and spec.loader is not None
    glance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(glance)
    assert glance.current() == glance.render()


def test_the_architecture_lists_what_a_wire_can_do_as_wire_has_it() -> None:
    """docs/architecture.md's list of a wire's abilities: each a field of ``Wire``, and every
    field beyond what every wire has (its name, path, coders, families, route) listed."""
    import dataclasses

    from abstract_client.wires.wire import Wire

    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = re.search(r"<!-- wire-abilities -->(.*?)<!-- /wire-abilities -->", text, re.S)
    assert listed is not None, "the list's markers are gone"
    named = set(re.findall(r"`(\w+)`", listed.group(1)))
    every_wire_has = {"name", "path", "encode", "decoder", "completion", "families", "route"}
    assert named == {f.name for f in dataclasses.fields(Wire)} - every_wire_has


def test_the_architecture_lists_every_gateway_module_where_it_is() -> None:
    """docs/architecture.md's gateway row names every module of ``abstract_client/gateway/``, each
    under its folder, and no module that is not there."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = re.search(r"<!-- gateway-modules -->(.*?)<!-- /gateway-modules -->", text, re.S)
    assert listed is not None, "the list's markers are gone"
    named: set[str] = set()
    folder = ""
    for folder_named, module in re.findall(r"`(\w+)/`|`(\w+\.py)`", listed.group(1)):
        if folder_named:
            folder = folder_named + "/"
        else:
            named.add(folder + module)
    gateway = ROOT / "abstract_client" / "gateway"
    modules = {str(p.relative_to(gateway)) for p in gateway.rglob("*.py") if p.name != "__init__.py"}
    assert named == modules
