"""Servers misbehaving on real sockets: each fault is a typed error, partial text kept,
connection released."""

from __future__ import annotations

import pytest

from abstract_client import (
    LLM,
    GenerationCancelledError,
    ProviderAPIError,
    ProviderProtocolError,
    TransportError,
)
from abstract_client.testing import FakeServer

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
