"""The public surface: AbortController/AbortSignal semantics, the registry, exports."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

import abstract_client
from abstract_client import (
    AbortController,
    AbortError,
    AbortSignal,
    GenerationCancelledError,
    Provider,
    available_providers,
    create_llm,
    register_provider,
)
from abstract_client.testing import FakeOpenAIServer


def test_all_exports_exist() -> None:
    for name in abstract_client.__all__:
        assert hasattr(abstract_client, name), name


def test_abort_controller_dom_semantics() -> None:
    controller = AbortController()
    signal = controller.signal
    seen: list[object] = []
    signal.add_listener(lambda s: seen.append(s.reason))
    removed: list[object] = []

    def never(s: AbortSignal) -> None:
        removed.append(s)

    signal.add_listener(never)
    signal.remove_listener(never)
    assert not signal.aborted and signal.reason is None
    signal.throw_if_aborted()  # no-op while not aborted
    controller.abort("bye")
    controller.abort("again")  # only the first abort counts
    assert signal.aborted and signal.reason == "bye" and seen == ["bye"] and removed == []
    with pytest.raises(AbortError):
        signal.throw_if_aborted()
    late: list[object] = []
    signal.add_listener(late.append)  # like the DOM: not called for an already-aborted signal
    assert late == []
    default = AbortController()
    default.abort()
    assert isinstance(default.signal.reason, AbortError)
    with pytest.raises(AbortError):
        default.signal.throw_if_aborted()


def test_abort_signal_timeout_any_and_blocking_wait() -> None:
    t0 = time.monotonic()
    signal = AbortSignal.timeout(0.1)
    assert signal.wait(5)
    assert 0.09 <= time.monotonic() - t0 < 2 and isinstance(signal.reason, TimeoutError)
    user = AbortController()
    combined = AbortSignal.any([user.signal, AbortSignal.timeout(30)])
    threading.Timer(0.05, user.abort, args=("user pressed stop",)).start()
    assert combined.wait(5) and combined.reason == "user pressed stop"
    assert AbortSignal.any([AbortSignal.abort("x")]).reason == "x"
    with pytest.raises(TypeError):
        AbortSignal.any([object()])  # type: ignore[list-item]


def test_abort_from_many_threads_fires_listeners_once() -> None:
    controller = AbortController()
    calls: list[int] = []
    controller.signal.add_listener(lambda s: calls.append(1))
    threads = [threading.Thread(target=controller.abort) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]


def test_registry_builtin_third_party_and_unknown() -> None:
    assert {"openai-compatible", "llamacpp", "vllm", "ollama", "lmstudio", "mlx"} <= set(available_providers())
    with pytest.raises(ValueError, match="unknown provider"):
        create_llm("nope")

    from abstract_client.providers.openai_compatible import OpenAICompatibleProvider

    class Mine(OpenAICompatibleProvider):
        name = "mine"

    register_provider("mine", Mine)
    with FakeOpenAIServer(answer="hello") as server:
        llm = create_llm("mine", "fake-model", base_url=server.base_url)
        with llm:
            assert isinstance(llm.provider, Provider) and llm.generate("x").content == "hello"
            with pytest.raises(GenerationCancelledError):
                llm.generate("x", signal=AbortSignal.abort())  # a third-party lane gets the contract too


def test_closed_llm_refuses_new_calls() -> None:
    with FakeOpenAIServer() as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url)
        llm.close()
        with pytest.raises(abstract_client.AbstractClientError, match="closed"):
            llm.generate("x")


def test_the_library_does_not_need_the_cli_ui() -> None:
    """``rich`` is the ``cli`` extra: the library, its providers and its test fakes import and
    run with it blocked (httpx's own optional CLI import falls back by itself)."""
    code = (
        "import sys; sys.modules['rich'] = None\n"
        "import abstract_client, abstract_client.testing, abstract_client.contract\n"
        "from abstract_client import create_llm\n"
        "from abstract_client.testing import FakeOpenAIServer\n"
        "for name in ('openai-compatible', 'llamacpp', 'vllm', 'ollama', 'lmstudio'):\n"
        "    create_llm(name, 'm', base_url='http://127.0.0.1:9').close()\n"
        "with FakeOpenAIServer() as s:\n"
        "    llm = create_llm('openai-compatible', 'm', base_url=s.base_url)\n"
        "    assert llm.generate('x', max_tokens=2).content == 'tok0 tok1 '\n"
        "    llm.close()\n"
        "assert not any(m.startswith('abstract_client.app') for m in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("lane", ["openai-compatible", "llamacpp", "vllm", "lmstudio"])
def test_extra_body_is_merged_into_the_body(lane: str) -> None:
    """#49: a per-call ``extra_body={"my_field": 1}`` was sent as a nested ``"extra_body"`` field
    (openai-python merges it into the body)."""
    with FakeOpenAIServer(token_delay=0.0, answer="ok") as server:
        base = server.base_url if lane == "openai-compatible" else server.url
        with create_llm(lane, "fake-model", base_url=base, max_retries=0) as llm:
            assert llm.generate("hi", extra_body={"my_field": 1, "cache_prompt": False}).content == "ok"
            body = server.requests("/v1/chat/completions")[-1].body
            assert body["my_field"] == 1 and body["cache_prompt"] is False and "extra_body" not in body
            with pytest.raises(TypeError, match="extra_body"):
                llm.generate("hi", extra_body=["my_field"])  # type: ignore[typeddict-item]


def test_a_chunk_says_what_it_carries() -> None:
    """#49: streams hand out chunks with no text (a role-only first chunk, the finish, the
    usage), so "stop after 5 chunks" stopped after 4 tokens; ``kind`` tells them apart."""
    with FakeOpenAIServer(token_delay=0.0, answer="a b c d e f") as server:
        with create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0) as llm:
            chunks = list(llm.stream("hi"))
    kinds = [c.kind for c in chunks]
    assert kinds.count("text") == 6 and "".join(c.delta for c in chunks if c.kind == "text") == "a b c d e f"
    assert kinds[-1] in ("finish", "usage") and "finish" in kinds
    assert all((c.kind == "text") == bool(c.delta) for c in chunks)
    from abstract_client import StreamChunk, ToolCallDelta

    assert StreamChunk().kind == "empty" and StreamChunk(reasoning="r").kind == "reasoning"
    assert StreamChunk(tool_call=ToolCallDelta(index=0, name="f")).kind == "tool_call"
