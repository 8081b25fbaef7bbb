"""The gateway under hostile or careless input: a typed 4xx with an OpenAI error body, never a
500/502, and nothing sent upstream."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from abstract_client.gateway import BackendConfig, GatewayConfig
from abstract_client.gateway.http.reading import MAX_JSON_DEPTH, json_depth
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway

from .helpers import wait_until

HELLO = json.dumps([{"role": "user", "content": "hi"}])


def chat(extra: str) -> str:
    """A chat body with ``extra`` (raw JSON members, so that NaN and the like stay as written)."""
    return '{"model":"m","messages":' + HELLO + extra + "}"


def tool(parameters: str) -> str:
    return '{"type":"function","function":{"name":"f","parameters":' + parameters + "}}"


def schema_format(schema: str) -> str:
    return ',"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":' + schema + "}}"


BODIES: dict[str, str] = {
    "messages [1]": '{"model":"m","messages":[1]}',
    "messages [[null,null]]": '{"model":"m","messages":[[null,null]]}',
    "temperature NaN": chat(',"temperature":NaN'),
    "temperature Infinity": chat(',"temperature":Infinity'),
    "a lone surrogate": '{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}',
    "stream_options x": chat(',"stream":true,"stream_options":"x"'),
    "stream_options [1]": chat(',"stream":true,"stream_options":[1]'),
    "chat_template_kwargs x": chat(',"chat_template_kwargs":"x"'),
    "nested 1,000": chat(',"x":' + "[" * 1000 + "]" * 1000),
    "nested 100,000": chat(',"x":' + "[" * 100_000 + "]" * 100_000),
    "max_tokens -1": chat(',"max_tokens":-1'),
    "max_tokens 0": chat(',"max_tokens":0'),
    'max_tokens "100"': chat(',"max_tokens":"100"'),
    "max_tokens 1e30": chat(',"max_tokens":1e30'),
    "max_tokens true": chat(',"max_tokens":true'),
    "temperature hot": chat(',"temperature":"hot"'),
    "seed x": chat(',"seed":"x"'),
    'stream "false"': chat(',"stream":"false"'),
    "response_format $ref nowhere": chat(schema_format('{"$ref":"#/nope"}')),
    "response_format type 5": chat(schema_format('{"type":5}')),
    "tool parameters type 12": chat(',"tools":[' + tool('{"type":12}') + "]"),
    "duplicate tool names": chat(',"tools":[' + tool('{"type":"object"}') + "," + tool('{"type":"object"}') + "]"),
    "not JSON": "{nope",
    "not an object": "[1, 2]",
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: FakeOpenAIServer) -> Iterator[InProcessGateway]:
    backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=upstream.base_url)
    with InProcessGateway(GatewayConfig(backends=[backend])) as gw:
        yield gw


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text[:300]
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    return dict(error)


@pytest.mark.parametrize("case", list(BODIES))
def test_hostile_bodies_are_a_400_and_nothing_is_sent(
    gateway: InProcessGateway, upstream: FakeOpenAIServer, case: str
) -> None:
    before = len(upstream.requests())
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=BODIES[case],
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert_openai_error(response, 400)
    assert len(upstream.requests()) == before


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/nope", 404), ("DELETE", "/v1/chat/completions", 405)])
def test_unknown_routes_and_wrong_methods_answer_an_openai_body(
    gateway: InProcessGateway, method: str, path: str, status: int
) -> None:
    assert_openai_error(httpx.request(method, gateway.url + path, timeout=30), status)


def test_unloading_a_model_by_a_wrong_name_is_a_404_and_stops_nobody(
    gateway: InProcessGateway, upstream: FakeOpenAIServer
) -> None:
    upstream.behavior.token_delay = 0.01
    outcome: list[int] = []

    def other_client() -> None:
        body = {"model": "m", "messages": json.loads(HELLO), "max_tokens": 60, "stream": True}
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=30) as r:
            outcome.append(sum(1 for line in r.iter_lines() if line.startswith("data: ") and "tok" in line))

    thread = threading.Thread(target=other_client)
    thread.start()
    try:
        upstream.wait_for_request()
        response = httpx.post(gateway.url + "/v1/models/unload", json={"model": "typo"}, timeout=30)
        assert_openai_error(response, 404)
    finally:
        thread.join(30)
        upstream.behavior.token_delay = 0.005
    assert outcome == [60]  # the other client's answer ran to its end


def test_json_depth_is_measured_in_one_pass_without_parsing() -> None:
    assert json_depth(b'{"a":[1,{"b":"[[[\\"]]"}]}') == 3
    assert json_depth(b'"[[[["') == 0
    assert json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000
    assert MAX_JSON_DEPTH >= 16  # deep enough for any real schema or message


def test_a_body_over_the_limit_is_a_413_before_it_is_read(upstream: FakeOpenAIServer) -> None:
    backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=upstream.base_url)
    config = GatewayConfig(backends=[backend], max_body_bytes=1 << 20)
    with InProcessGateway(config) as gw:
        before = len(upstream.requests())
        big = chat(',"pad":"' + "x" * (2 << 20) + '"')
        declared = httpx.post(gw.url + "/v1/chat/completions", content=big, timeout=30)
        assert_openai_error(declared, 413)

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            for i in range(0, len(big), 65536):
                yield big[i : i + 65536].encode()

        chunked = httpx.post(gw.url + "/v1/chat/completions", content=chunks(), timeout=30)
        assert_openai_error(chunked, 413)
        small = httpx.post(gw.url + "/v1/chat/completions", content=chat(',"max_tokens":2'), timeout=30)
        assert small.status_code == 200
        assert len(upstream.requests()) == before + 1  # only the small one went upstream


def test_a_200_mb_upload_leaves_the_gateway_process_small(upstream: FakeOpenAIServer, tmp_path: Any) -> None:
    import psutil

    from abstract_client.testing.gateway import GatewayProcess

    gw = GatewayProcess.launch(
        ["-p", "openai-compatible", "-u", upstream.base_url, "-m", "fake-model"], log_path=tmp_path / "gw.log"
    )
    try:
        rss = psutil.Process(gw.pid).memory_info().rss
        block = b"x" * (1 << 20)

        def upload() -> Iterator[bytes]:
            for _ in range(200):
                yield block

        response = httpx.post(gw.url + "/v1/chat/completions", content=upload(), timeout=60)
        assert_openai_error(response, 413)
        grown = psutil.Process(gw.pid).memory_info().rss - rss
        assert grown < 128 << 20, f"the gateway grew by {grown >> 20} MiB"
    finally:
        gw.stop()


@pytest.mark.parametrize(
    ("toml", "env", "expected"),
    [
        (None, {}, "no config file"),
        ('[server]\nportt = 1\n[[backend]]\nname = "m"\nprovider = "openai-compatible"\n', {}, "unknown [server] key"),
        ('[[backend]]\nname = "m"\nprovider = "openai-compatible"\nmax_concurrent = "4"\n', {}, "max_concurrent"),
        ('[[backend]]\nname = "m"\nprovider = "openai-compatible"\nbogus = 1\n', {}, "unknown [[backend]] key"),
        ("[server\n", {}, "not valid TOML"),
        ('[server]\naccess_log = "yes"\n[[backend]]\nname = "m"\nprovider = "openai-compatible"\n', {}, "access_log"),
        (
            '[server]\napi_key_env = "AC_TEST_KEY"\n[[backend]]\nname = "m"\nprovider = "openai-compatible"\n',
            {},
            "unset",
        ),
        (
            '[server]\napi_key_env = "AC_TEST_KEY"\n[[backend]]\nname = "m"\nprovider = "openai-compatible"\n',
            {"AC_TEST_KEY": " "},
            "empty",
        ),
    ],
)
def test_config_errors_are_one_line_and_exit_2(
    tmp_path: Any, toml: str | None, env: dict[str, str], expected: str
) -> None:
    import os
    import subprocess
    import sys

    path = tmp_path / "gateway.toml"
    if toml is not None:
        path.write_text(toml)
    environ = {k: v for k, v in os.environ.items() if k != "AC_TEST_KEY"} | env
    proc = subprocess.run(
        [sys.executable, "-m", "abstract_client", "serve", "--config", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
    )
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_api_key_env_unset_on_the_command_line_refuses_to_start(upstream: FakeOpenAIServer) -> None:
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items() if k != "AC_TEST_KEY"}
    argv = [sys.executable, "-m", "abstract_client", "serve", "-p", "openai-compatible", "-u", upstream.base_url]
    proc = subprocess.run(
        [*argv, "--api-key-env", "AC_TEST_KEY", "--port", "0"], capture_output=True, text=True, timeout=60, env=environ
    )
    assert proc.returncode == 2 and "AC_TEST_KEY is unset or empty" in proc.stderr and "Traceback" not in proc.stderr


def test_the_bundled_fake_generates_lazily_reads_linearly_and_exits_on_sigterm() -> None:
    """Users run the fake in their own CI: a huge max_tokens costs nothing up front, a large
    upload is read in linear time, and SIGTERM ends it at once even mid-answer."""
    import signal
    import time

    import psutil

    from abstract_client.testing import SubprocessFake

    fake = SubprocessFake().start()
    assert fake.proc is not None
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9, "stream": True}
        t0 = time.monotonic()
        with httpx.stream("POST", fake.base_url + "/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
        assert time.monotonic() - t0 < 10 and any("tok1" in line for line in got)
        assert psutil.Process(fake.proc.pid).memory_info().rss < 300 << 20
        t0 = time.monotonic()
        upload = b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"' + b"x" * (100 << 20) + b'"}]}'
        assert httpx.post(fake.base_url + "/chat/completions", content=upload, timeout=60).status_code == 200
        assert time.monotonic() - t0 < 30  # linear: ~1 s here; the old quadratic read took minutes
        with httpx.stream("POST", fake.base_url + "/chat/completions", json=body, timeout=30) as r:
            next(r.iter_lines())
            t0 = time.monotonic()
            fake.proc.send_signal(signal.SIGTERM)
            assert fake.proc.wait(10) == 0
        assert time.monotonic() - t0 < 5
    finally:
        fake.stop()


def test_sigterm_stops_every_stream_with_an_error_frame_and_exits_promptly(tmp_path: Any) -> None:
    import signal
    import time

    from abstract_client.testing.gateway import GatewayProcess

    with FakeOpenAIServer(token_delay=0.01) as upstream:
        gw = GatewayProcess.launch(
            ["-p", "openai-compatible", "-u", upstream.base_url, "-m", "fake-model"], log_path=tmp_path / "gw.log"
        )
        try:
            body = {"model": "m", "messages": json.loads(HELLO), "max_tokens": 100_000, "stream": True}
            frames: list[str] = []
            with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        frames.append(line[6:])
                    if len(frames) == 5:
                        t0 = time.monotonic()
                        assert gw.proc is not None
                        gw.proc.send_signal(signal.SIGTERM)
                assert gw.proc is not None and gw.proc.wait(15) in (0, -signal.SIGTERM)  # uvicorn re-raises it
            exited = time.monotonic() - t0
            last = json.loads(frames[-1])
            assert last["error"]["message"].endswith("(shutdown)"), last  # an error frame, not a silent EOF
            assert upstream.wait_for_disconnect(upstream.last) > 0  # the upstream was severed
            assert upstream.last.tokens_sent < 100_000
            assert exited < 5, f"exited {exited:.1f} s after SIGTERM"
            assert "Traceback" not in gw.log_text()
        finally:
            gw.stop()


def _endless_stream(sock: Any) -> None:
    """Ask for a stream that never ends on ``sock``, and read none of it."""
    payload = json.dumps({"model": "m", "messages": json.loads(HELLO), "max_tokens": 10**8, "stream": True})
    sock.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n{payload}".encode()
    )


def test_a_client_that_stops_reading_is_stopped_and_frees_its_slot() -> None:
    """A stalled reader: the gateway's writes wait (flow control) past ``write_timeout``, the
    generation stops (reason ``client_stalled``), the upstream is severed, and the one slot
    serves the next request."""
    import socket
    import time

    with FakeOpenAIServer(token_delay=0.0) as up:
        backend = BackendConfig(
            name="m", provider="openai-compatible", model="fake-model", base_url=up.base_url, max_concurrent=1
        )
        with InProcessGateway(GatewayConfig(backends=[backend], write_timeout=1.0)) as gw:
            stalled = socket.socket()
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(("127.0.0.1", gw.port))
            _endless_stream(stalled)
            try:
                record = up.wait_for_request(timeout=10)
                seen = up.wait_for_disconnect(record, timeout=30)  # stopped although it never left
                assert record.tokens_sent < 10**8 and seen > 0
                t0 = time.monotonic()
                answer = httpx.post(
                    gw.url + "/v1/chat/completions",
                    json={"model": "m", "messages": json.loads(HELLO), "max_tokens": 2},
                    timeout=60,
                )
                assert answer.status_code == 200 and time.monotonic() - t0 < 20  # the slot was freed
                stops = gw.gateway.metrics.stops
                assert stops[("m", "client_stalled")] == 1, dict(stops)
            finally:
                stalled.close()


def test_a_reader_that_takes_nothing_is_stalled_whatever_its_buffers_hold() -> None:
    """A client that stops reading, with the kernel's default (megabytes) buffers: the gateway's
    writes never wait, so the write timeout alone saw it only once megabytes were queued (29.8 s
    with a 5 s timeout). Its unsent bytes not moving for ``write_timeout`` is the stall; the
    upstream's disconnect record is the evidence, long before the buffers could fill."""
    import socket
    import time

    with FakeOpenAIServer(token_delay=0.002) as up:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=up.base_url)
        with InProcessGateway(GatewayConfig(backends=[backend], write_timeout=2.0)) as gw:
            stalled = socket.create_connection(("127.0.0.1", gw.port))
            _endless_stream(stalled)
            try:
                record = up.wait_for_request(timeout=10)
                began = time.monotonic()
                up.wait_for_disconnect(record, timeout=30)
                took = time.monotonic() - began
                assert took < 20, f"stopped {took:.1f} s after its first token"
                stops = gw.gateway.metrics.stops
                assert wait_until(lambda: stops[("m", "client_stalled")] == 1, 10), dict(stops)
            finally:
                stalled.close()


def test_only_the_same_key_or_the_admin_key_cancels_a_request() -> None:
    with FakeOpenAIServer(token_delay=0.01) as up:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=up.base_url)
        config = GatewayConfig(backends=[backend], api_keys=["alice-key", "bob-key"], admin_key="root-key")
        with InProcessGateway(config) as gw:

            def auth(key: str, **headers: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {key}", **headers}

            body = {"model": "m", "messages": json.loads(HELLO), "max_tokens": 100_000, "stream": True}
            results: dict[str, int] = {}

            def stream(rid: str) -> None:
                with httpx.stream(
                    "POST",
                    gw.url + "/v1/chat/completions",
                    json=body,
                    headers=auth("alice-key", **{"X-Request-Id": rid}),
                ) as r:
                    results[rid] = sum(1 for line in r.iter_lines() if line.startswith("data: "))

            threads = [threading.Thread(target=stream, args=(rid,)) for rid in ("a-1", "a-2")]
            for t in threads:
                t.start()
            up.wait_for_request(2, timeout=10)
            cancel = gw.url + "/v1/requests/{}/cancel"
            assert httpx.post(cancel.format("a-1"), headers=auth("bob-key")).status_code == 404  # not bob's
            assert httpx.post(cancel.format("a-1"), headers=auth("nope")).status_code == 401
            assert any(f.request_id == "a-1" for f in gw.gateway.flights.values())  # still running
            assert httpx.post(cancel.format("a-1"), headers=auth("alice-key")).status_code == 200  # hers
            assert httpx.post(cancel.format("a-2"), headers=auth("root-key")).status_code == 200  # the admin's
            for t in threads:
                t.join(30)
            assert set(results) == {"a-1", "a-2"} and all(n < 100_000 for n in results.values())
            for record in up.requests("/v1/chat/completions"):
                up.wait_for_disconnect(record, timeout=10)  # both upstreams were severed
            unload = gw.url + "/v1/models/unload"
            assert_openai_error(httpx.post(unload, json={"model": "m"}, headers=auth("alice-key")), 403)
            assert httpx.post(unload, json={"model": "m"}, headers=auth("root-key")).status_code == 200


def test_request_ids_are_scoped_to_their_key() -> None:
    """While key A's ``X-Request-Id: same`` runs, key B neither learns it exists (no 409) nor
    cancels it; B's own ``same`` runs beside it; each key's stop record is its own (B's never
    overwrites A's); the admin key reaches both."""
    with FakeOpenAIServer(token_delay=0.01) as up:
        backend = BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=up.base_url)
        config = GatewayConfig(backends=[backend], api_keys=["alice-key", "bob-key"], admin_key="root-key")
        with InProcessGateway(config) as gw:
            body = {"model": "m", "messages": json.loads(HELLO), "max_tokens": 100_000, "stream": True}
            done: dict[str, int] = {}

            def stream(key: str) -> None:
                headers = {"Authorization": f"Bearer {key}", "X-Request-Id": "same"}
                with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
                    done[key] = r.status_code
                    for _ in r.iter_lines():
                        pass

            alice = threading.Thread(target=stream, args=("alice-key",))
            alice.start()
            up.wait_for_request(1, timeout=10)
            bob = threading.Thread(target=stream, args=("bob-key",))
            bob.start()
            up.wait_for_request(2, timeout=10)  # bob's "same" runs beside alice's: no 409
            cancel = gw.url + "/v1/requests/same/cancel"
            assert httpx.post(cancel, headers={"Authorization": "Bearer bob-key"}).status_code == 200  # his own
            bob.join(30)
            first, second = up.requests("/v1/chat/completions")
            up.wait_for_disconnect(second, timeout=10)
            assert first.disconnected_at is None and not first.completed  # alice's still runs
            record = gw.url + "/v1/requests/same"
            assert httpx.get(record, headers={"Authorization": "Bearer alice-key"}).status_code == 404  # not hers
            bobs = {"Authorization": "Bearer bob-key"}
            assert wait_until(lambda: httpx.get(record, headers=bobs).status_code == 200, 10)
            assert httpx.post(cancel, headers={"Authorization": "Bearer alice-key"}).status_code == 200
            alice.join(30)
            up.wait_for_disconnect(first, timeout=10)
            assert done == {"alice-key": 200, "bob-key": 200}
            alices = {"Authorization": "Bearer alice-key"}
            assert wait_until(lambda: httpx.get(record, headers=alices).status_code == 200, 10)
            assert httpx.get(record, headers=alices).json()["reason"] == "cancel_endpoint"
            assert httpx.get(record, headers={"Authorization": "Bearer root-key"}).status_code == 200


def test_the_subprocess_fakes_records_survive_an_image_and_deep_json() -> None:
    """``SubprocessFake.records()`` after a request that carried an image, and after one nested
    900 deep (its route answered nothing: bytes are not JSON, and ``asdict`` recursed)."""
    import base64
    import hashlib

    from abstract_client.testing import SubprocessFake

    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}
    deep: Any = "x"
    for _ in range(900):
        deep = [deep]
    with SubprocessFake() as fake:
        for content in ([{"type": "text", "text": "what is it?"}, image], "hi"):
            body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": content}], "deep": deep}
            assert httpx.post(fake.base_url + "/chat/completions", json=body, timeout=30).status_code == 200
        records = fake.records()
    assert records[0]["images"] == [{"bytes": len(png), "sha256": hashlib.sha256(png).hexdigest()}]
    assert len(records) == 2 and all(r["completed"] for r in records)
