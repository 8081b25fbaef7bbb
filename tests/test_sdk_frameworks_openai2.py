"""The frameworks that pin openai-python 2.x — LlamaIndex's ``OpenAILike`` and instructor — given
the library's client (an ``httpx`` one: ``flavor="httpx"``), in the venv of their own that
tests/test_sdk_retries.py makes. Each runs at its default retries, on the fake server, in a script
that reports what its caller saw: released at once, one request, the server saw the disconnect,
the typed error at the ``stop_on`` block's edge (and what the framework raised inside it).
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from .test_docs_code import ROOT, blocks_run_elsewhere
from .test_sdk_retries import run_in_old_openai_python

RELEASED = 2.0  # generous: the release is milliseconds (their retry layers slept 1.2-11.5 s)

HARNESS = textwrap.dedent(
    """
    import json, threading, time
    import openai
    from abstract_client import GenerationCancelledError, sdk
    from abstract_client.testing import FakeOpenAIServer

    def stopped(server, call, streamed=False):
        '''call() inside stop_on, the stop pressed once the server sent 5 tokens.'''
        out = {}
        stop = threading.Event()
        before = len(server.requests())

        def press():
            while not (len(server.requests()) > before and server.last.tokens_sent >= 5):
                time.sleep(0.002)
            out["pressed"] = time.perf_counter()
            stop.set()

        threading.Thread(target=press, daemon=True).start()
        try:
            with sdk.stop_on(stop):
                try:
                    call()
                except Exception as inner:
                    out["inside"] = type(inner).__module__ + "." + type(inner).__name__
                    raise
        except Exception as exc:
            out["released"] = time.perf_counter()
            out["typed"] = isinstance(exc, GenerationCancelledError)
            out["reason"] = getattr(exc, "reason", None)
            out["partial"] = bool(getattr(exc, "partial_text", ""))
        server.wait_for_disconnect(server.last, 5)
        out["requests"] = len(server.requests()) - before
        out["disconnected"] = server.last.disconnected_at is not None
        return out
    """
)

LLAMA_INDEX = HARNESS + textwrap.dedent(
    """
    from llama_index.llms.openai_like import OpenAILike
    import llama_index.core

    out = {"version": llama_index.core.__version__, "openai": openai.__version__}
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=2000) as server:
        llm = OpenAILike(
            model="fake-model", api_base=server.base_url, api_key="k", is_chat_model=True,
            http_client=sdk.http_client(flavor="httpx"),
        )
        out["complete"] = stopped(server, lambda: llm.complete("Tell me a long story"))
        out["stream"] = stopped(server, lambda: [None for _ in llm.stream_complete("Tell me a long story")])
    print(json.dumps(out))
    """
)

INSTRUCTOR = HARNESS + textwrap.dedent(
    """
    import instructor
    from pydantic import BaseModel

    class Story(BaseModel):
        title: str
        text: str

    out = {"version": instructor.__version__, "openai": openai.__version__}
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=2000) as server:
        base = openai.OpenAI(base_url=server.base_url, api_key="k", http_client=sdk.http_client(flavor="httpx"))
        client = instructor.from_openai(base)
        ask = lambda: client.chat.completions.create(
            model="fake-model", response_model=Story, messages=[{"role": "user", "content": "A long story"}]
        )
        out["create"] = stopped(server, ask)
    print(json.dumps(out))
    """
)


def assert_stopped_once(row: dict[str, Any]) -> None:
    assert row["typed"] and row["reason"] == "user", row
    assert row["released"] - row["pressed"] < RELEASED, row
    assert row["requests"] == 1 and row["disconnected"], row


@pytest.mark.timeout(600)
def test_llama_index_openai_like_stops_at_once_never_retried() -> None:
    """LlamaIndex retries ``APIConnectionError`` (what openai 2.x makes of a foreign error) with
    its own backoff: 11 s. The stop passes openai 2.x as an ``OpenAIError``, which LlamaIndex
    does not retry: released at once, typed inside the block too."""
    out = run_in_old_openai_python(LLAMA_INDEX)
    assert out["openai"].startswith("2."), out
    assert_stopped_once(out["complete"])
    assert_stopped_once(out["stream"])
    assert out["complete"]["partial"] and out["stream"]["partial"], out  # (a plain call rides the stream)


@pytest.mark.timeout(600)
def test_instructor_stops_at_once_typed_at_the_blocks_edge() -> None:
    out = run_in_old_openai_python(INSTRUCTOR)
    assert_stopped_once(out["create"])


@pytest.mark.timeout(600)
def test_the_docs_recipes_for_them_run() -> None:
    """docs/frameworks.md's blocks marked to run beside openai-python 2.x, in order, against the
    fake at the documented address (the docs suite leaves them to this test)."""
    page = ROOT / "docs" / "frameworks.md"
    blocks = blocks_run_elsewhere(page)
    assert len(blocks) == 2
    script = textwrap.dedent(
        """
        import json, sys
        from abstract_client.testing import FakeOpenAIServer

        blocks = json.loads(sys.stdin.read())
        with FakeOpenAIServer(token_delay=0.01, default_max_tokens=2000) as server:
            namespace = {"__name__": "docs_frameworks"}
            for line, code in blocks:
                code = code.replace("http://127.0.0.1:8080", server.url)
                exec(compile(code, f"docs/frameworks.md:{line}", "exec"), namespace)
            records = server.requests()
            print(json.dumps({"completed": sum(r.completed for r in records), "requests": len(records)}))
        """
    )
    out = run_in_old_openai_python(script, stdin=json.dumps(blocks))
    # each block's stop lands mid-answer (or, on a slow first call, before its request is sent):
    # no answer ever completes
    assert out["completed"] == 0 and out["requests"] <= 2, out
