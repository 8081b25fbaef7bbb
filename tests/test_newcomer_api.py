"""What a newcomer meets first (#49): a misspelt option is a TypeError and nothing is sent; the
four generation methods take one set of options; every HTTP lane takes the server's root or its
/v1; a stopped generate() keeps its partial text on every lane whose server streams."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from abstract_client import LLM, GenerateOptions, GenerationCancelledError, create_llm
from abstract_client.http_lane import v1_base
from abstract_client.testing import FakeLMStudioServer, FakeOllamaServer, FakeOpenAIServer, FakeServer
from abstract_client.testing._server import Conn, RequestRecord

from .helpers import press_when

METHODS = ("generate", "agenerate", "stream", "astream")


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.0) as server:
        yield server


def _start(llm: LLM, method: str, **options: Any) -> None:
    """Call ``method`` as a user would (iterating a stream, awaiting the async twins)."""
    if method == "generate":
        llm.generate("hi", **options)
    elif method == "stream":
        for _ in llm.stream("hi", **options):
            pass
    else:

        async def run() -> None:
            if method == "agenerate":
                await llm.agenerate("hi", **options)
            else:
                async for _ in llm.astream("hi", **options):
                    pass

        anyio.run(run)


@pytest.mark.parametrize("method", METHODS)
def test_a_misspelt_option_is_a_type_error_and_nothing_is_sent(fake: FakeOpenAIServer, method: str) -> None:
    with create_llm("llamacpp", base_url=fake.base_url) as llm:
        with pytest.raises(TypeError) as info:
            _start(llm, method, max_token=3)
        message = str(info.value)
        assert f"{method}() got an unexpected keyword argument 'max_token'" in message
        assert "did you mean 'max_tokens'?" in message and "extra_body=" in message
        with pytest.raises(TypeError, match="temprature"):
            _start(llm, method, temprature=0.2, max_tokens=2)
        with pytest.raises(TypeError, match=r"'native'.*the llamacpp lane takes no options of its own"):
            _start(llm, method, native=True)  # LM Studio's, not llama-server's
        with pytest.raises(TypeError, match=r"'plain_wire' \(it is plain_route= now\)"):
            _start(llm, method, plain_wire=True)  # an option's old name
        assert fake.records == [] and fake.connections == 0
        _start(llm, method, max_tokens=3, extra_body={"max_token": 3})  # the way to send a field as it is
    body = fake.last.body
    assert body["max_tokens"] == 3 and body["max_token"] == 3 and "extra_body" not in body


def test_lane_options_are_taken_where_the_lane_declares_them() -> None:
    with FakeOpenAIServer(token_delay=0.0) as openai, create_llm("vllm", "m", base_url=openai.base_url) as llm:
        llm.generate("hi", max_tokens=2, json_schema={"type": "object"})
        assert openai.last.body["response_format"]["type"] == "json_schema"
        assert "json_schema" in llm.provider.call_options
    with (
        FakeOllamaServer(token_delay=0.0) as ollama,
        create_llm("ollama", "fake-model", base_url=ollama.base_url) as llm,
    ):
        llm.generate("hi", max_tokens=2, options={"num_ctx": 512}, keep_alive="1m")
        assert ollama.last.body["options"]["num_ctx"] == 512 and ollama.last.body["keep_alive"] == "1m"
    with FakeLMStudioServer(token_delay=0.0) as lms, create_llm("lmstudio", "fake-model", base_url=lms.base_url) as llm:
        llm.generate("hi", max_tokens=2, native=True)
        assert lms.last.path == "/api/v1/chat"
        with pytest.raises(TypeError, match="keep_alive"):
            llm.generate("hi", keep_alive="1m")  # Ollama's, not LM Studio's
    with FakeOpenAIServer(token_delay=0.0) as a, FakeOpenAIServer(token_delay=0.0) as b:
        with create_llm("openai-compatible", "fake-model", base_url=[a.base_url, b.base_url]) as fleet:
            fleet.generate("hi", max_tokens=2, session="conversation-1")  # the fleet's own key
            assert all("session" not in r.body for r in [*a.records, *b.records])  # never sent upstream
            with pytest.raises(TypeError, match="sesion"):
                fleet.generate("hi", sesion="conversation-1")


def test_the_four_methods_take_one_set_of_options() -> None:
    """Written once (GenerateOptions), shown by each method's signature (help(), IDEs)."""
    signatures = {name: inspect.signature(getattr(LLM, name)) for name in METHODS}
    params = {name: list(sig.parameters.values()) for name, sig in signatures.items()}
    assert all(p == params["generate"] for p in params.values())
    names = [p.name for p in params["generate"]]
    assert names == ["self", "prompt", *GenerateOptions.__annotations__, "lane_options"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params["generate"][2:-1])
    assert inspect.iscoroutinefunction(LLM.agenerate)


@pytest.mark.parametrize(
    ("lane", "fake_class", "path"),
    [
        ("llamacpp", FakeOpenAIServer, "/v1/chat/completions"),
        ("vllm", FakeOpenAIServer, "/v1/chat/completions"),
        ("remote", FakeOpenAIServer, "/v1/chat/completions"),
        ("openai-compatible", FakeOpenAIServer, "/v1/chat/completions"),
        ("ollama", FakeOllamaServer, "/api/chat"),
        ("lmstudio", FakeLMStudioServer, "/v1/chat/completions"),
    ],
)
def test_every_http_lane_takes_the_root_or_its_v1(lane: str, fake_class: type[FakeServer], path: str) -> None:
    with fake_class(token_delay=0.0) as server:
        root = f"http://127.0.0.1:{server.port}"
        for url in (root, root + "/", root + "/v1", root + "/v1/"):
            with create_llm(lane, "fake-model", base_url=url) as llm:
                assert llm.generate("hi", max_tokens=2).content
            assert server.last.path == path, url


def test_a_url_with_a_path_is_taken_as_written() -> None:
    assert v1_base("http://127.0.0.1:8080") == "http://127.0.0.1:8080/v1"
    assert v1_base("https://host/openai/v1/") == "https://host/openai/v1"
    assert v1_base("https://host/api") == "https://host/api"
    with create_llm("openai-compatible", "m", base_url="https://host/openai/v1") as llm:
        assert llm.provider.clients is not None and llm.provider.clients.base_url == "https://host/openai/v1"


STREAMING_LANES = [
    ("llamacpp", FakeOpenAIServer),
    ("vllm", FakeOpenAIServer),
    ("remote", FakeOpenAIServer),
    ("openai-compatible", FakeOpenAIServer),
    ("ollama", FakeOllamaServer),
    ("lmstudio", FakeLMStudioServer),
]


@pytest.mark.parametrize(("lane", "fake_class"), STREAMING_LANES, ids=[lane for lane, _ in STREAMING_LANES])
def test_a_stopped_generate_keeps_its_partial_text(lane: str, fake_class: type[FakeServer]) -> None:
    """The README's promise as written: ``generate()`` (no option) stopped after the server sent
    tokens raises with what had arrived, on every HTTP lane."""
    with fake_class(token_delay=0.01) as server, create_llm(lane, "fake-model", base_url=server.base_url) as llm:
        stop = threading.Event()
        press = press_when(lambda: server.records and server.last.tokens_sent >= 3, stop.set)
        with pytest.raises(GenerationCancelledError) as info:
            llm.generate("a long story", max_tokens=10_000, cancel_event=stop)
        press.wait()
        assert server.last.body.get("stream", True) is not False  # the streaming wire (Ollama's default)
        assert info.value.partial_text.startswith("tok0") and info.value.generated_tokens > 0
        assert server.last.tokens_sent < 10_000


class _NeverStreams(FakeOpenAIServer):
    """A /v1 server that answers ``stream: true`` with one JSON body (some minimal servers do)."""

    def chat(self, conn: Conn, record: RequestRecord) -> None:
        if isinstance(record.body, dict):
            record.body = {**record.body, "asked_to_stream": record.body.get("stream"), "stream": False}
        super().chat(conn, record)


def test_a_server_that_does_not_stream_gets_the_plain_route(caplog: pytest.LogCaptureFixture) -> None:
    with (
        _NeverStreams(token_delay=0.01) as server,
        create_llm("openai-compatible", "m", base_url=server.base_url) as llm,
    ):
        with caplog.at_level(logging.WARNING, logger="abstract_client"):
            assert llm.generate("hi", max_tokens=3).content == "tok0 tok1 tok2 "  # asked to stream, answered plain
            assert llm.generate("hi", max_tokens=3).content == "tok0 tok1 tok2 "
        asked = [r.body["asked_to_stream"] for r in server.records]
        assert asked == [True, False, False]  # the first refusal moved the lane to its plain route
        assert [r.message for r in caplog.records].count(
            "openai-compatible: the server does not stream; generate() uses its plain route"
        ) == 1
        stop = threading.Event()
        press = press_when(lambda: server.last.tokens_sent >= 3 and len(server.records) == 4, stop.set)
        with pytest.raises(GenerationCancelledError) as info:
            llm.generate("a long story", max_tokens=10_000, cancel_event=stop)
        press.wait()
        assert info.value.partial_text == ""  # nothing arrived, nothing invented
        assert "plain route, so no partial text" in str(info.value)
        with pytest.raises(Exception, match="expected a stream, got a JSON body"):
            next(iter(llm.stream("hi", max_tokens=3)))  # a stream cannot be one: said, typed


def test_the_error_tree_is_the_one_its_docstring_draws() -> None:
    """errors.py draws the hierarchy a caller catches by; each drawn edge is a real base, and
    every exported error is drawn."""
    import re

    import abstract_client
    from abstract_client import errors

    drawn: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^[\s│]*(?:[├└]── )?([A-Z]\w+Error)\b", line)
        if match is None or ("──" not in line and not line.strip().startswith("AbstractClientError")):
            continue
        depth = match.start(1)  # the column of the name: its depth in the drawing
        while parents and parents[-1][0] >= depth:
            parents.pop()
        if parents:
            drawn.setdefault(match.group(1), parents[-1][1])
        parents.append((depth, match.group(1)))
    for child, parent in drawn.items():
        assert issubclass(getattr(errors, child), getattr(errors, parent)), (child, parent)
    exported = {n for n in abstract_client.__all__ if n.endswith("Error") and n != "AbstractClientError"}
    assert exported <= set(drawn)
    assert not issubclass(errors.NotSupportedError, errors.ProviderError)  # "the server refused"


def test_refusals_before_sending_are_not_the_servers(fake: FakeOpenAIServer) -> None:
    """What is refused before anything is sent never claims the server refused it; a deadline
    follows the one documented rule (timeout= is the call's limit, a signal is a Stop)."""
    from abstract_client import AbortSignal, GenerationTimeoutError, NotSupportedError, ProviderError

    with create_llm("ollama", "fake-model", base_url=fake.base_url) as llm:
        with pytest.raises(NotSupportedError) as info:
            llm.generate("hi", resumable=True)
        assert not isinstance(info.value, ProviderError)
    assert fake.records == []
    fake.behavior.token_delay = 0.01
    with create_llm("llamacpp", base_url=fake.base_url) as llm:
        with pytest.raises(GenerationTimeoutError) as late:
            llm.generate("hi", max_tokens=10_000, timeout=0.3)
        assert late.value.kind == "total"
        with pytest.raises(GenerationCancelledError) as stopped:
            llm.generate("hi", max_tokens=10_000, signal=AbortSignal.timeout(0.3))
        assert stopped.value.reason == "timeout"
