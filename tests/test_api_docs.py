"""The public API is documented where a user reads it: every exported callable, every public
method and property of the objects it returns, and the generation methods' parameters,
returns and raises."""

from __future__ import annotations

import inspect
from typing import Any

import abstract_client
from abstract_client import LLM, AbortController, AbortSignal, GenerationStream, SyncGenerationStream


def test_every_export_has_a_docstring() -> None:
    missing = [n for n in abstract_client.__all__ if callable(getattr(abstract_client, n))]
    missing = [n for n in missing if not inspect.getdoc(getattr(abstract_client, n))]
    assert missing == []


def test_every_public_method_and_property_has_a_docstring() -> None:
    missing = []
    for cls in (LLM, SyncGenerationStream, GenerationStream, AbortController, AbortSignal):
        for name, member in vars(cls).items():
            if name.startswith("_") or not (callable(member) or isinstance(member, (property, staticmethod))):
                continue
            if not inspect.getdoc(member):
                missing.append(f"{cls.__name__}.{name}")
    assert missing == []


def test_the_sync_generation_methods_document_args_returns_and_raises() -> None:
    for method in (LLM.generate, LLM.stream, LLM.embed, LLM.count_tokens, LLM.unload_model):
        doc = inspect.getdoc(method) or ""
        for section in ("Returns:", "Raises:"):
            assert section in doc, (method.__name__, section)
    for key in abstract_client.GenerateOptions.__annotations__:
        assert key in (inspect.getdoc(abstract_client.GenerateOptions) or ""), key


def test_the_documented_path_to_the_socket_is_the_real_one(monkeypatch: Any) -> None:
    """docs/architecture.md lists the frames of one sync ``generate`` from the call to the
    socket's binding; a real call (``llamacpp`` lane, fake server) must show exactly those."""
    import re
    import traceback
    from pathlib import Path

    from abstract_client import create_llm
    from abstract_client.http import guard
    from abstract_client.testing import FakeOpenAIServer

    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "architecture.md").read_text()
    section = doc.split("**The call**", 1)[1].split("**The stop**", 1)[0]
    documented = re.findall(r"^\d+\. `([\w/.]+\.py): (\w+)`", section, re.M)
    assert len(documented) >= 10, documented

    def ours(frames: list[traceback.FrameSummary]) -> list[tuple[str, str]]:
        paths = [Path(f.filename).resolve() for f in frames]
        return [
            (str(p.relative_to(root)), f.name)
            for p, f in zip(paths, frames, strict=True)
            if p.is_relative_to(root / "abstract_client") or p.is_relative_to(root / "providers")
        ]

    from abstract_client import _sync

    caller: list[list[tuple[str, str]]] = []
    loop: list[list[tuple[str, str]]] = []
    real_run, real_attach = _sync.Portal.run, guard.SocketGuard.attach

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:  # the caller's thread
        caller.append([*ours(traceback.extract_stack()[:-1]), ("abstract_client/_sync.py", "run")])
        return real_run(self, *args, **kwargs)

    def attach(self: Any, sock: Any) -> None:  # the loop's thread
        loop.append([*ours(traceback.extract_stack()[:-1]), ("abstract_client/http/guard.py", "attach")])
        real_attach(self, sock)

    monkeypatch.setattr(_sync.Portal, "run", run)
    monkeypatch.setattr(guard.SocketGuard, "attach", attach)
    with FakeOpenAIServer() as server, create_llm("llamacpp", "m", base_url=server.base_url) as llm:
        llm.generate("hi", max_tokens=2)
    assert caller and loop
    assert caller[0] + loop[0] == [(file, name) for file, name in documented], (caller[0], loop[0])


def test_the_fakes_route_table_in_docs_testing_is_every_route_they_serve() -> None:
    """docs/testing.md lists every route each fake serves, no more, no fewer (read from each
    fake's own route table)."""
    import re
    from pathlib import Path

    from abstract_client.testing import FakeLMStudioServer, FakeOllamaServer, FakeOpenAIServer

    page = (Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
    for fake in (FakeOpenAIServer, FakeOllamaServer, FakeLMStudioServer):
        row = re.search(rf"^\| `{fake.__name__}` \| (.*?) \|", page, re.M)
        assert row, f"docs/testing.md has no row for {fake.__name__}"
        documented = set(re.findall(r"`(/[^`]*)`", row.group(1)))
        served = set(re.findall(r'\("(?:GET|POST|HEAD)", "(/[^"]*)"\)', inspect.getsource(fake.route)))
        assert documented == served, (fake.__name__, sorted(documented - served), sorted(served - documented))
