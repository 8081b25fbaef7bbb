"""Careless and hostile inputs from #40 that used to pass or reach a 5xx: each a typed refusal
now (a 4xx with an OpenAI body and nothing sent upstream, a one-line ConfigError at start-up, or
a TypeError/ValueError at the library's call)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from abstract_client import create_llm
from abstract_client.gateway import BackendConfig, ConfigError, GatewayConfig
from abstract_client.gateway.config import key_from_env
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway

from .helpers import wait_until

BODY = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


@pytest.fixture
def upstream() -> FakeOpenAIServer:
    with FakeOpenAIServer(token_delay=0.0) as server:
        yield server  # type: ignore[misc]


def gateway_of(upstream: FakeOpenAIServer) -> InProcessGateway:
    backend = BackendConfig(name="fake-model", provider="vllm", model="fake-model", base_url=upstream.base_url)
    return InProcessGateway(GatewayConfig(backends=[backend]))


def test_content_length_with_transfer_encoding_is_refused_and_the_connection_closed(upstream: FakeOpenAIServer) -> None:
    """A smuggled second request behind an ambiguous first one gets no answer of its own."""
    with gateway_of(upstream) as gw, socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        smuggled = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n{BODY}"
        )
        first = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        sock.sendall((first + smuggled).encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1 and b"ambiguous_length" in answer
    assert upstream.requests() == []


def test_an_empty_request_id_and_a_wrong_method_are_clear_4xx(upstream: FakeOpenAIServer) -> None:
    with gateway_of(upstream) as gw, httpx.Client(base_url=gw.url) as client:
        empty = client.post(
            "/v1/chat/completions", content=BODY, headers={"X-Request-Id": "", "Content-Type": "application/json"}
        )
        assert empty.status_code == 400 and "X-Request-Id" in empty.json()["error"]["message"]
        wrong = client.get("/v1/chat/completions")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert upstream.requests() == []


def test_start_up_settings_that_cannot_work_are_one_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="queue_timeout"):
        BackendConfig(name="b", provider="vllm", queue_timeout=float("nan"))
    monkeypatch.setenv("GW_KEY", "s3cret\n")  # as `export GW_KEY="$(cat key.txt)"` leaves it
    assert key_from_env("GW_KEY") == "s3cret"
    backend = BackendConfig(name="b", provider="vllm")
    with pytest.raises(ConfigError, match="whitespace"):
        GatewayConfig(backends=[backend], api_key="s3cret\n")


def test_library_arguments_of_the_wrong_kind_fail_at_the_call(upstream: FakeOpenAIServer) -> None:
    with pytest.raises(TypeError, match="max_retries"):
        create_llm("openai-compatible", "m", base_url=upstream.base_url, max_retries="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="base_url is empty"):
        create_llm("openai-compatible", "m", base_url="")
    with create_llm("openai-compatible", "fake-model", base_url=upstream.base_url) as llm:
        for bad in ({"a": 1}, None, 5):
            with pytest.raises(TypeError, match="embed"):
                llm.embed(bad)  # type: ignore[arg-type]
        user = {"role": "user", "content": "hi"}
        with pytest.raises(TypeError, match="tool_call_id"):
            llm.generate(messages=[user, {"role": "tool", "content": "x", "tool_call_id": 5}])
        with pytest.raises(TypeError, match="tool_calls"):
            llm.generate(messages=[user, {"role": "assistant", "tool_calls": [{"id": "a", "type": "function"}]}, user])
        for function in ({"name": "f", "parameters": False}, {"name": "f", "description": 5}):
            with pytest.raises(TypeError, match=r"parameters|description"):
                llm.generate(messages=[user], tools=[{"type": "function", "function": function}])
    assert upstream.requests() == []


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-32-be"])
def test_a_body_in_another_encoding_is_refused_not_parsed(encoding: str, upstream: FakeOpenAIServer) -> None:
    """UTF-16/32 hid a 900-deep field from the depth check (a 500 and a RecursionError): the check
    reads bytes, and "\u2200" is a quote byte (0x22) and a NUL in UTF-16, so the brackets after it
    looked to be inside a string."""
    deep = "[" * 900 + "]" * 900
    text = '{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "a": "\u2200", "x": ' + deep + "}"
    with gateway_of(upstream) as gw, httpx.Client(base_url=gw.url) as client:
        answer = client.post(
            "/v1/chat/completions", content=text.encode(encoding), headers={"Content-Type": "application/json"}
        )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert upstream.requests() == []


@pytest.mark.parametrize(
    "args",
    [
        ["--config", "{toml}"],
        ["-p", "vllm", "-u", "ftp://x"],
        ["-p", "vllm", "-u", "http://127.0.0.1:9", "-o", "timeout=nope"],
        ["-p", "vllm", "-u", "http://127.0.0.1:9", "-o", "verfy=false"],
    ],
    ids=["provider", "base_url", "timeout", "unknown-option"],
)
def test_a_backend_that_cannot_be_made_is_one_line_and_exit_2(args: list[str], tmp_path: Path) -> None:
    import subprocess
    import sys

    toml = tmp_path / "gateway.toml"
    toml.write_text('[[backend]]\nname = "b"\nprovider = "nope"\n')  # an unknown lane
    args = [a.replace("{toml}", str(toml)) for a in args]

    done = subprocess.run(
        [sys.executable, "-m", "abstract_client", "serve", *args, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: backend"), done.stderr


def test_workers_die_with_their_parent_even_by_sigkill(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    """``kill -9`` of the ``--workers 2`` parent used to leave both workers serving the port."""
    import os
    import signal

    import psutil

    from abstract_client.testing.gateway import GatewayProcess

    args = ["-p", "vllm", "-u", upstream.base_url, "-m", "fake-model", "--workers", "2"]
    gw = GatewayProcess.launch(args, log_path=tmp_path / "gateway.log")
    workers: list[psutil.Process] = []
    try:
        parent = psutil.Process(gw.pid)
        assert wait_until(lambda: len(parent.children()) == 2, 30)
        workers = parent.children()
        os.kill(gw.pid, signal.SIGKILL)
        assert wait_until(lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers), 30)
    finally:
        gw.stop()
        for worker in workers:  # (orphans, if the test failed: never left behind)
            with contextlib.suppress(psutil.Error):
                worker.kill()


HOSTILE_FIELDS = {
    "lone surrogate in name": '"messages": [{"role": "user", "content": "hi", "name": "\\ud800"}]',
    "NaN in min_p": '"messages": [{"role": "user", "content": "hi"}], "min_p": NaN',
    "min_tokens {}": '"messages": [{"role": "user", "content": "hi"}], "min_tokens": {}',
    "ignore_eos x": '"messages": [{"role": "user", "content": "hi"}], "ignore_eos": "x"',
    "text part 5": '"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]',
    "4000-digit seed": '"messages": [{"role": "user", "content": "hi"}], "seed": ' + "9" * 4000,
    "$ref loop": '"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", '
    '"json_schema": {"name": "a", "schema": {"$ref": "#"}}}',
    # found by schemathesis --checks all: accepted though the document refuses them
    "model {}": '"messages": [{"role": "user", "content": "hi"}], "model": {}',
    "reasoning_effort AAA": '"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "AAA"',
    "max_tokens past the limit beside max_completion_tokens": '"messages": [{"role": "user", "content": "hi"}], '
    '"max_completion_tokens": 2, "max_tokens": 99999999999',
    "tool_call_id {}": '"messages": [{"role": "tool", "content": "x", "tool_call_id": {}}]',
    "tool call without a function": '"messages": [{"role": "assistant", "tool_calls": [{"id": "a"}]}]',
    "tool call of type 5": '"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": 5, '
    '"function": {"name": "f", "arguments": "{}"}}]}]',
    "tool parameters false": '"messages": [{"role": "user", "content": "hi"}], '
    '"tools": [{"type": "function", "function": {"name": "f", "parameters": false}}]',
    "tool description 5": '"messages": [{"role": "user", "content": "hi"}], '
    '"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]',
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("field", list(HOSTILE_FIELDS))
def test_a_hostile_field_is_a_400_with_nothing_sent_upstream(
    field: str, stream: bool, upstream: FakeOpenAIServer
) -> None:
    fields = HOSTILE_FIELDS[field]
    defaults = ('"model": "fake-model", ' if '"model"' not in fields else "") + (
        '"max_tokens": 2, ' if "max_tokens" not in fields else ""
    )
    body = "{" + defaults + '"stream": ' + json.dumps(stream) + ", " + fields + "}"
    with gateway_of(upstream) as gw, httpx.Client(base_url=gw.url) as client:
        answer = client.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert upstream.requests() == []


def test_an_embedding_of_a_model_that_is_not_a_name_is_a_400(upstream: FakeOpenAIServer) -> None:
    with gateway_of(upstream) as gw:
        answer = httpx.post(gw.url + "/v1/embeddings", json={"model": {}, "input": "hi"})
    assert answer.status_code == 400 and "model must be a string" in answer.json()["error"]["message"]
    assert upstream.requests() == []


def test_a_null_field_is_an_absent_one(upstream: FakeOpenAIServer) -> None:
    """As OpenAI takes them (and as the document says): a null max_completion_tokens leaves
    max_tokens to speak; a null tool_call_id, parameters or description are not there."""
    body = {
        "model": None,
        "messages": [{"role": "user", "content": "hi", "tool_call_id": None}],
        "max_completion_tokens": None,
        "max_tokens": 3,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": None, "description": None}}],
        "tool_choice": "none",
        "n": None,
    }
    with gateway_of(upstream) as gw:
        answer = httpx.post(gw.url + "/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert upstream.requests("/v1/chat/completions")[0].body["max_tokens"] == 3


def test_an_integral_number_is_an_integer_as_the_schema_says(upstream: FakeOpenAIServer) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.0, "seed": 7.0}
    with gateway_of(upstream) as gw:
        answer = httpx.post(gw.url + "/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        refused = httpx.post(gw.url + "/v1/chat/completions", json={**body, "max_tokens": 2.5})
        assert refused.status_code == 400
        embedded = httpx.post(gw.url + "/v1/embeddings", json={"model": "fake-model", "input": "hi", "dimensions": 4.0})
        assert embedded.status_code == 200 and len(embedded.json()["data"][0]["embedding"]) == 4
    sent = upstream.requests("/v1/chat/completions")[0].body
    assert sent["max_tokens"] == 2 and isinstance(sent["max_tokens"], int) and sent["seed"] == 7


@contextlib.contextmanager
def uvicorn_records() -> Iterator[list[logging.LogRecord]]:
    """What uvicorn logs at WARNING and above. Its loggers do not propagate to the root logger,
    where ``caplog`` listens: an assertion on ``caplog`` about uvicorn's lines could not fail."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def test_no_error_is_logged_for_a_client_that_leaves_mid_answer(upstream: FakeOpenAIServer) -> None:
    """#48: a client closing its stream mid-answer (openai-python's ``close()``, ``curl
    --max-time``), or giving up on a whole answer, logged ``ERROR: ASGI callable returned without
    completing response`` beside the stop's INFO line: the departure thread saw the departure
    before uvicorn did. A departure is normal; nothing at ERROR."""
    upstream.behavior.token_delay = 0.02
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000}
    with gateway_of(upstream) as gw, uvicorn_records() as logged:
        for _ in range(6):
            with (
                httpx.Client() as client,
                client.stream("POST", gw.url + "/v1/chat/completions", json={**body, "stream": True}) as answer,
            ):
                for n, _line in enumerate(answer.iter_lines()):
                    if n > 6:
                        break
        for _ in range(3):
            before = len(upstream.requests())
            with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as sock:
                raw = json.dumps(body)
                sock.sendall(
                    (
                        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n{raw}"
                    ).encode()
                )
                upstream.wait_for_request(before + 1, timeout=30)
        for record in upstream.requests("/v1/chat/completions"):
            upstream.wait_for_disconnect(record, timeout=10)  # every one stopped
        assert wait_until(lambda: not gw.gateway.flights, 10)
    assert not logged, [r.getMessage() for r in logged]


def test_a_client_that_leaves_before_the_answer_gets_a_499_and_no_error_is_logged(upstream: FakeOpenAIServer) -> None:
    """A non-streaming client that half-closes (``shutdown(SHUT_WR)``, as some proxies do) got a
    500 from uvicorn, and every client leaving before the response logged "ASGI callable
    returned without starting response" at ERROR. TCP cannot tell a half-close from a close
    until it is written to: it is a stop, answered as one."""

    upstream.behavior.token_delay = 0.05
    with gateway_of(upstream) as gw, uvicorn_records() as logged:
        for n in range(3):
            with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as sock:
                sock.sendall(
                    (
                        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(BODY.replace('2}', '400}'))}\r\n\r\n{BODY.replace('2}', '400}')}"
                    ).encode()
                )
                # Half-closed once the upstream holds the request: the gateway's loop then reads
                # the EOF at once (with uvicorn's default, a close before any answer), whatever
                # the machine's load. A half-close sent with the request raced the disconnect
                # thread's 499 against that read, and a closing protocol could pass.
                upstream.wait_for_request(n + 1, timeout=30, path="/v1/chat/completions")
                sock.shutdown(socket.SHUT_WR)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 499"), answer[:200]
    assert not [r for r in logged if "without starting response" in r.getMessage()]
    for record in upstream.requests("/v1/chat/completions"):
        upstream.wait_for_disconnect(record, timeout=10)  # each stopped upstream


def test_a_half_close_stops_the_request_on_the_loop_without_the_disconnect_thread(
    upstream: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's own path for a half-close (the protocol's ``eof_received``), as
    ``connection_lost`` is for a close: with the departure thread away, a half-closed client
    still gets the stop, not its whole answer."""
    from abstract_client.gateway.http import departures

    monkeypatch.setattr(departures, "departure_thread", lambda: None)
    upstream.behavior.token_delay = 0.05
    body = BODY.replace("2}", "400}")
    with gateway_of(upstream) as gw, socket.create_connection(("127.0.0.1", gw.port), timeout=30) as sock:
        sock.sendall(
            (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
        )
        record = upstream.wait_for_request(1, timeout=30, path="/v1/chat/completions")
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 499"), answer[:200]
        upstream.wait_for_disconnect(record, timeout=10)
        assert record.tokens_sent < 400


def test_a_request_queued_at_shutdown_says_shutdown(upstream: FakeOpenAIServer, tmp_path: Path) -> None:
    import signal
    import threading

    from abstract_client.testing.gateway import GatewayProcess

    upstream.behavior.token_delay = 0.05
    args = ["-p", "vllm", "-u", upstream.base_url, "-m", "fake-model", "--max-concurrent", "1"]
    gw = GatewayProcess.launch(args, log_path=tmp_path / "gateway.log")
    answers: dict[str, httpx.Response] = {}
    long = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}

    def post(name: str) -> None:
        answers[name] = httpx.post(gw.url + "/v1/chat/completions", json=long, timeout=60)

    try:
        first = threading.Thread(target=post, args=("running",))
        first.start()
        upstream.wait_for_request(1, timeout=15)
        queued = threading.Thread(target=post, args=("queued",))
        queued.start()
        assert wait_until(lambda: gw.metric("abstract_client_gateway_requests_running") >= 2, 15)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        first.join(30)
        queued.join(30)
    finally:
        gw.stop()
    assert answers["queued"].status_code == 499, answers["queued"].text
    assert answers["queued"].json()["error"]["code"] == "shutdown"
    assert answers["running"].json()["error"]["code"] == "shutdown"


def test_an_unloads_stops_carry_their_reason(upstream: FakeOpenAIServer) -> None:
    import threading

    upstream.behavior.token_delay = 0.05
    with gateway_of(upstream) as gw:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}
        headers = {"X-Request-Id": "ejected-1"}
        out: dict[str, httpx.Response] = {}
        call = threading.Thread(
            target=lambda: out.setdefault(
                "r", httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
            )
        )
        call.start()
        upstream.wait_for_request(1, timeout=15)
        httpx.post(gw.url + "/v1/models/unload", json={"model": "fake-model"}, timeout=60)
        call.join(30)
        record = gw.url + "/v1/requests/ejected-1"
        assert wait_until(lambda: httpx.get(record).status_code == 200, 10)
        assert httpx.get(record).json()["reason"] == "model_eject"
