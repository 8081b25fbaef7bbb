"""Servers misbehaving on real sockets: each fault is a typed error, partial text kept,
connection released."""

from __future__ import annotations

import socket

import httpx
import pytest

from abstract_client import (
    LLM,
    AbortController,
    GenerationCancelledError,
    ProviderAPIError,
    ProviderError,
    ProviderProtocolError,
    TransportError,
)
from abstract_client.testing import FakeServer

from .helpers import press_when

FAULTS = [
    ("drop", TransportError, True),
    ("close_without_done", ProviderProtocolError, True),
    ("malformed_frame", ProviderProtocolError, True),
    ("error_on_200", ProviderAPIError, True),
    ("invalid_utf8", ProviderProtocolError, True),
    ("huge_line", ProviderProtocolError, True),
    ("redirect", ProviderProtocolError, False),
]


@pytest.mark.parametrize(("fault", "error", "partial"), FAULTS, ids=[f[0] for f in FAULTS])
def test_stream_faults_are_typed_and_keep_partial_text(
    server: FakeServer, llm: LLM, fault: str, error: type, partial: bool
) -> None:
    server.behavior.fail_after_tokens = 3
    server.inject(fault)
    with pytest.raises(error) as info:
        list(llm.stream("x", max_tokens=20))
    assert type(info.value) is error
    if partial:
        assert info.value.partial_text == "tok0 tok1 tok2 "
        assert info.value.generated_tokens == 3
    assert info.value.request_id and info.value.provider == llm.provider_name
    assert llm.in_flight == []
    assert llm.generate("again", max_tokens=2).content == "tok0 tok1 "  # nothing left broken


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("error_on_200", ProviderAPIError),
        ("malformed_frame", ProviderProtocolError),
        ("redirect", ProviderProtocolError),
    ],
)
def test_non_streaming_faults(server: FakeServer, llm: LLM, fault: str, error: type) -> None:
    server.inject(fault)
    with pytest.raises(error):
        llm.generate("x", max_tokens=3)


def test_failure_while_stop_is_set_is_reported_as_the_stop(server: FakeServer, llm: LLM) -> None:
    """The server drops the connection at the same moment the user stops: the user sees their
    stop (with the drop chained), never a transport error."""
    server.behavior.fail_after_tokens = 3
    server.inject("drop")
    stream = llm.stream("x", max_tokens=20)
    with pytest.raises(GenerationCancelledError) as info:
        for i, _ in enumerate(stream):
            if i == 2:
                # stop without our own sever: mark the token the way a racing stop would
                stream._inner._call.token.stop("user")
    assert info.value.reason == "user"


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "generate"])
def test_json_error_body_under_200_keeps_the_servers_message(server: FakeServer, llm: LLM, streaming: bool) -> None:
    """LM Studio answers some errors as ``application/json`` under HTTP 200, even to a streaming
    request: the server's own message arrives as a typed error, never as an SSE decoding error."""
    server.inject("json_error_200")
    with pytest.raises(ProviderError) as info:
        if streaming:
            list(llm.stream("x", max_tokens=5))
        else:
            llm.generate("x", max_tokens=5)
    assert "Model unloaded" in str(info.value)
    assert not isinstance(info.value, ProviderProtocolError)
    assert llm.in_flight == []


def test_a_stop_is_translated_once_and_chains_the_transport_failure(server: FakeServer, llm: LLM) -> None:
    """A stop during a non-streaming body: ONE GenerationCancelledError whose cause is the
    failure the sever produced (the severed read, an httpx error), never another
    GenerationCancelledError."""
    server.behavior.token_delay = 0.05
    controller = AbortController()
    press = press_when(lambda: server.last.tokens_sent >= 2, controller.abort)  # mid-body, by the server's record
    with pytest.raises(GenerationCancelledError) as info:
        llm.generate("x", max_tokens=1000, signal=controller.signal)
    press.wait()
    # Rule 4 as documented: the cause is the failure that ended the wait, if one did; a sync
    # caller is normally woken by the stop before anything fails (no cause; pinned with the
    # loop held in test_stop_mechanism), unless the loop already had the failed read in hand.
    cause = info.value.__cause__
    assert cause is None or isinstance(cause, httpx.HTTPError), repr(cause)


@pytest.mark.anyio
async def test_translation_happens_once(anyio_backend: str) -> None:
    """Rule 4 as a unit: a failure while the stop is set becomes the stop; the stop itself passes
    through unchanged (so retries and outer scopes never wrap a stop in a stop)."""
    from abstract_client.contract import Call, CallSpec, translate
    from abstract_client.contract.retry import RetryPolicy
    from abstract_client.providers.openai_compatible import OpenAICompatibleProvider
    from abstract_client.stopping.token import InflightRegistry, StopToken
    from abstract_client.testing import FakeOpenAIServer
    from abstract_client.types import GenerationRequest, Timeout

    with FakeOpenAIServer() as srv:
        provider = OpenAICompatibleProvider(base_url=srv.base_url)
        spec = CallSpec(provider, GenerationRequest(messages=[], model="m"), Timeout(), RetryPolicy())
        call = Call(spec, StopToken("r1"), InflightRegistry())
        call.token.stop("user")
        read_error = httpx.ReadError("severed")
        stop = translate(call, read_error)
        assert isinstance(stop, GenerationCancelledError)
        assert stop.reason == "user" and stop.request_id == "r1" and stop.provider == provider.name
        assert translate(call, stop) is stop


def test_the_error_categories_a_caller_catches(server: FakeServer, llm: LLM, lane: str) -> None:
    """ "The network failed" (``NetworkError``, also the builtin ``ConnectionError``) apart from
    "the server refused" (``ProviderError``) and a deadline (``GenerationTimeoutError``, also a
    ``TimeoutError``), each on a real socket."""
    from abstract_client import (
        ConnectionFailedError,
        GenerationTimeoutError,
        NetworkError,
        ServerUnavailableError,
        create_llm,
    )

    with socket.socket() as unused:  # a port nothing listens on: the connection is refused
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with create_llm(lane, "fake-model", base_url=f"http://127.0.0.1:{port}", max_retries=0) as refused:
        with pytest.raises(ConnectionFailedError) as info:
            refused.generate("x", max_tokens=3)
    err = info.value
    assert isinstance(err, NetworkError) and isinstance(err, ConnectionError)
    assert isinstance(err, ServerUnavailableError) and err.retryable  # nothing was sent

    server.inject("drop")  # the connection dies mid-answer
    with pytest.raises(ConnectionError) as dropped:
        for _ in llm.stream("x", max_tokens=50):
            pass
    assert isinstance(dropped.value, TransportError) and not isinstance(dropped.value, ProviderError)
    assert not dropped.value.retryable  # the server may have acted on it

    server.inject("no_answer")
    with pytest.raises(TimeoutError) as stalled:
        llm.generate("x", max_tokens=50, timeout=0.5)
    assert isinstance(stalled.value, GenerationTimeoutError)

    server.inject("loading_503")
    with pytest.raises(ProviderError) as refused_by_server:
        llm.generate("x", max_tokens=3)
    assert not isinstance(refused_by_server.value, NetworkError)
