"""openai-python 2.x and the frameworks that pin it — LlamaIndex's ``OpenAILike`` and instructor —
given the library's client (an ``httpx`` one: ``flavor="httpx"``), in a venv of their own made
here. Each runs at its default retries, on the fake server, in a script that reports what its
caller saw: released at once, one request, the server saw the disconnect, the typed error at the
``stop_on`` block's edge (and what the SDK or framework raised inside it).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from abstract_client.app.stop_bench.venvs import venv_python

from .test_docs_code import ROOT, blocks_run_elsewhere

RELEASED = 2.0  # generous: the release is milliseconds (their retry layers slept 1.2-11.5 s)

# openai-python 2.x in front, and the frameworks that pin it
OPENAI_2 = ("openai>=2.50,<3", "llama-index-llms-openai-like>=0.8,<1", "instructor>=1.17,<2")


def old_openai_python() -> Path:
    """A venv with openai-python 2.x (what LlamaIndex pins) and the frameworks on it, in front of
    this interpreter's packages, made once per Python version under the cache (the stop bench's
    venv maker); a failure to make it fails the test with pip's words."""
    try:
        return venv_python("openai-2", OPENAI_2, inherit=True)
    except RuntimeError as error:
        pytest.fail(str(error))


def run_in_old_openai_python(script: str, stdin: str = "") -> dict[str, Any]:
    """``script`` (which prints one JSON line last) in that venv, this tree first on its path."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(old_openai_python()), "-c", script], input=stdin, capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


HARNESS = textwrap.dedent(
    """
    import contextlib, json, threading, time
    import openai
    from abstract_client import GenerationCancelledError, sdk
    from abstract_client.sdk.exchange import Exchange
    from abstract_client.testing import FakeOpenAIServer

    reads = []  # the body bytes the library read for each request, newest last
    body = Exchange.body

    async def recorded(self, response):
        read = bytearray()
        reads.append(read)
        async with contextlib.aclosing(body(self, response)) as pieces:
            async for piece in pieces:
                read += piece
                yield piece

    Exchange.body = recorded

    def stopped(server, call, read=False):
        '''call() inside stop_on, the stop pressed once the server sent 5 tokens (read: once the
        library read them, for a row that counts on their text being kept).'''
        out = {}
        stop = threading.Event()
        before, seen = len(server.requests()), len(reads)

        def press():
            while not (len(server.requests()) > before and server.last.tokens_sent >= 5):
                time.sleep(0.002)
            while read and not (len(reads) > seen and b"tok4 " in reads[-1]):
                time.sleep(0.002)
            out["pressed"] = time.perf_counter()
            stop.set()

        threading.Thread(target=press, daemon=True).start()
        try:
            with sdk.stop_on(stop):
                try:
                    call()
                except Exception as inner:  # what the framework itself raised
                    out["inside"] = type(inner).__module__ + "." + type(inner).__name__
                    out["inside_typed"] = isinstance(inner, GenerationCancelledError)
                    out["inside_wrapped"] = isinstance(inner, openai.APIConnectionError)
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

OPENAI = HARNESS + textwrap.dedent(
    """
    out = {"openai": openai.__version__}
    with FakeOpenAIServer(token_delay=0.01, default_max_tokens=2000) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", http_client=sdk.http_client(flavor="httpx"))
        ask = lambda: client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])
        out["create"] = stopped(server, ask)
    print(json.dumps(out))
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
        out["complete"] = stopped(server, lambda: llm.complete("Tell me a long story"), read=True)
        out["stream"] = stopped(server, lambda: [None for _ in llm.stream_complete("Tell me a long story")], read=True)
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
def test_openai_python_2_gets_the_typed_stop_never_retried() -> None:
    """openai-python 2.x catches any exception from its transport, wraps it in
    ``APIConnectionError`` and retries it with backoff, but lets an ``OpenAIError`` through: the
    stop derives from it too, so the SDK itself raises it at once, unwrapped, with one request."""
    out = run_in_old_openai_python(OPENAI)
    assert out["openai"].startswith("2."), out
    assert out["create"]["inside_typed"] and not out["create"]["inside_wrapped"], out
    assert_stopped_once(out["create"])


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
