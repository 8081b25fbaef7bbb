"""OpenTelemetry spans and metrics: exactly one ended span per call on every exit path (complete,
error, stop, ``break``, a dropped stream, a cancelled task, an eject), with the GenAI attributes
and, on a stop, who stopped it and what it had cost; the W3C trace context sent upstream; the
gateway continuing a client's trace; request ids in log lines. The OpenTelemetry SDK's in-memory
exporters read what was recorded (given to this library with ``telemetry.use``, so no global
provider is touched)."""

from __future__ import annotations

import gc
import logging
import random
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from abstract_client import (
    AbortController,
    GenerationCancelledError,
    RequestIdFilter,
    ServerUnavailableError,
    create_llm,
    telemetry,
)
from abstract_client.gateway import BackendConfig, GatewayConfig
from abstract_client.testing import FakeOpenAIServer
from abstract_client.testing.gateway import InProcessGateway

from .helpers import launch_llama_server, needs_mlx, wait_until

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402


class Recorded:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = sdk_trace.TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, name_prefix: str = "") -> list[Any]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(name_prefix)]

    def metric_points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        points: list[Any] = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        points.extend(metric.data.data_points)
        return points


@pytest.fixture
def otel() -> Iterator[Recorded]:
    recorded = Recorded()
    telemetry.use(tracer_provider=recorded.tracer_provider, meter_provider=recorded.meter_provider)
    yield recorded
    telemetry.use()


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay=0.002) as srv:
        yield srv


def only(spans: list[Any]) -> Any:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def test_a_complete_generation_is_one_span_with_the_genai_attributes(otel: Recorded, server: FakeOpenAIServer) -> None:
    with create_llm("openai-compatible", "fake-model", base_url=server.base_url) as llm:
        result = llm.generate("hello", max_tokens=5, temperature=0.2)
    span = only(otel.spans())
    a = span.attributes
    assert span.name == "chat fake-model" and span.kind == SpanKind.CLIENT
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai-compatible"
    assert a["gen_ai.request.model"] == "fake-model" and a["gen_ai.request.max_tokens"] == 5
    assert a["gen_ai.request.temperature"] == 0.2 and a["gen_ai.request.stream"] is False
    assert a["gen_ai.response.status"] == "completed" and a["gen_ai.response.finish_reasons"] == ("length",)
    assert a["gen_ai.usage.output_tokens"] == 5 == result.usage.completion_tokens  # type: ignore[union-attr]
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == int(
        server.base_url.rsplit(":", 1)[1].split("/")[0]
    )
    assert a["abstract_client.request_id"] == result.request_id
    assert a["gen_ai.response.id"].startswith("chatcmpl-")  # the server's own id for the answer
    assert "gen_ai.input.messages" not in a  # content only when the user opts in
    assert span.status.status_code == StatusCode.UNSET
    # the server received this span's context
    traceparent = server.records[-1].headers.get("traceparent", "")
    assert traceparent.split("-")[1:3] == [f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"]
    assert otel.metric_points("gen_ai.client.operation.duration")
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in otel.metric_points("gen_ai.client.token.usage")}
    assert tokens["output"] == 5


def test_a_stop_ends_the_span_as_cancelled_with_who_and_what_it_cost(otel: Recorded, server: FakeOpenAIServer) -> None:
    event = threading.Event()
    with create_llm("openai-compatible", "fake-model", base_url=server.base_url) as llm:
        with pytest.raises(GenerationCancelledError) as info:
            for i, _ in enumerate(llm.stream("hello", max_tokens=500, cancel_event=event)):
                if i == 4:
                    event.set()
    span = only(otel.spans())
    a = span.attributes
    assert span.status.status_code == StatusCode.ERROR
    assert a["error.type"] == "GenerationCancelledError" and a["gen_ai.response.status"] == "cancelled"
    assert a["abstract_client.stop.reason"] == "user" and a["abstract_client.stop.by_caller"] is True
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.usage.output_tokens"] == info.value.generated_tokens >= 4
    assert 0 <= a["abstract_client.stop.to_release_ms"] < 5000
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    stops = otel.metric_points("abstract_client.stops")
    assert [p.value for p in stops] == [1] and stops[0].attributes["abstract_client.stop.reason"] == "user"


def test_break_a_dropped_stream_and_an_error_each_end_their_span(otel: Recorded, server: FakeOpenAIServer) -> None:
    with create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0) as llm:
        for i, _ in enumerate(llm.stream("hello", max_tokens=500)):
            if i == 2:
                break
        stream = llm.stream("hello", max_tokens=500)
        next(iter(stream))
        del stream
        gc.collect()
        server.behavior.fault = "loading_503"
        with pytest.raises(ServerUnavailableError):
            llm.generate("hello", max_tokens=5)
    spans = otel.spans()
    assert len(spans) == 3
    broke, dropped, failed = spans
    assert broke.attributes["gen_ai.response.status"] == "cancelled"
    assert broke.attributes["abstract_client.stop.by_caller"] is False  # the consumer left
    assert dropped.attributes["gen_ai.response.status"] == "cancelled"
    assert failed.attributes["error.type"] == "ServerUnavailableError"
    assert failed.attributes["gen_ai.response.status"] == "error"


async def test_a_cancelled_task_and_an_abort_signal_end_their_spans(
    otel: Recorded, server: FakeOpenAIServer, anyio_backend: str
) -> None:
    llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url)
    controller = AbortController()
    with pytest.raises(GenerationCancelledError):
        async with llm.astream("hello", max_tokens=500, signal=controller.signal) as stream:
            async for i, _ in _aenumerate(stream):
                if i == 3:
                    controller.abort()
    with anyio.move_on_after(0.05):
        await llm.agenerate("hello", max_tokens=5_000)
    await llm.aclose()
    spans = otel.spans()
    assert len(spans) == 2
    assert all(s.attributes["gen_ai.response.status"] == "cancelled" for s in spans)
    assert [s.attributes["abstract_client.stop.by_caller"] for s in spans] == [True, False]


async def _aenumerate(stream: Any) -> Any:
    i = 0
    async for item in stream:
        i += 1
        yield i, item


@needs_mlx
def test_embeddings_and_an_in_process_eject(otel: Recorded, server: FakeOpenAIServer, tiny_dir: Any) -> None:
    with create_llm("openai-compatible", "fake-model", base_url=server.base_url) as llm:
        llm.embed(["a", "b"])
    span = only(otel.spans("embeddings"))
    assert span.attributes["gen_ai.operation.name"] == "embeddings"
    assert span.attributes["gen_ai.response.status"] == "completed"
    pytest.importorskip("mlx.core")
    llm = create_llm("mlx", str(tiny_dir))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            llm.generate("hello", max_tokens=100_000, extra={"logit_bias": {1: -1e9}}, request_id="ej-1")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    provider: Any = llm.provider
    assert wait_until(lambda: (s := provider.stats("ej-1")) is not None and s.tokens >= 3, 20)
    llm.unload_model(drain_timeout=10)
    thread.join(10)
    span = only(otel.spans("chat"))
    assert span.kind == SpanKind.INTERNAL and "server.address" not in span.attributes
    assert span.attributes["abstract_client.stop.reason"] == "model_eject"
    # exact usage on a stop: the engine's own counts, not the chunks that reached the caller
    stats = llm.provider.stats(span.attributes["abstract_client.request_id"])  # type: ignore[attr-defined]
    assert stats is not None and stats.tokens > 0
    assert span.attributes["gen_ai.usage.output_tokens"] == stats.tokens
    assert span.attributes["gen_ai.usage.input_tokens"] == stats.prompt_tokens
    [err] = errors
    assert isinstance(err, GenerationCancelledError) and err.usage is not None
    assert err.usage.completion_tokens == stats.tokens and err.usage.prompt_tokens == stats.prompt_tokens
    llm.close()


def test_a_thousand_random_stops_leave_no_span_open(otel: Recorded, server: FakeOpenAIServer) -> None:
    rng = random.Random(7)
    calls = 0
    with create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0) as llm:
        for n in range(1000):
            event = threading.Event()
            stop_at = rng.randrange(0, 6)
            calls += 1
            try:
                for i, _ in enumerate(llm.stream("x", max_tokens=8, cancel_event=event, request_id=f"r{n}")):
                    if i == stop_at:
                        if rng.random() < 0.5:
                            event.set()
                        else:
                            break
            except GenerationCancelledError:
                pass
    spans = otel.spans()
    assert len(spans) == calls == 1000
    assert all(s.end_time is not None for s in spans)
    assert len({s.attributes["abstract_client.request_id"] for s in spans}) == 1000


def test_the_gateway_continues_the_clients_trace(otel: Recorded, server: FakeOpenAIServer) -> None:
    config = GatewayConfig(
        backends=[BackendConfig(name="m", provider="openai-compatible", model="fake-model", base_url=server.base_url)]
    )
    trace_id = f"{random.getrandbits(128):032x}"
    parent = f"{random.getrandbits(64):016x}"
    with InProcessGateway(config) as gw:
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            headers={"traceparent": f"00-{trace_id}-{parent}-01"},
        )
        assert r.status_code == 200
        assert wait_until(lambda: len(otel.spans()) == 2, 5)
    gateway_span = only(otel.spans("POST"))
    call_span = only(otel.spans("chat"))
    assert f"{gateway_span.context.trace_id:032x}" == trace_id
    assert gateway_span.parent is not None and f"{gateway_span.parent.span_id:016x}" == parent
    assert gateway_span.kind == SpanKind.SERVER
    assert call_span.parent is not None and call_span.parent.span_id == gateway_span.context.span_id
    upstream = server.records[-1].headers.get("traceparent", "")
    assert upstream.split("-")[1:3] == [trace_id, f"{call_span.context.span_id:016x}"]


def test_log_lines_carry_the_request_id(server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    handler = logging.Handler()
    seen: list[str] = []
    handler.emit = lambda record: seen.append(getattr(record, "request_id", "?"))  # type: ignore[method-assign]
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("abstract_client")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with create_llm("openai-compatible", "fake-model", base_url=server.base_url) as llm:
            event = threading.Event()
            with pytest.raises(GenerationCancelledError):
                for i, _ in enumerate(llm.stream("x", max_tokens=50, cancel_event=event, request_id="req-42")):
                    if i == 1:
                        event.set()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert "req-42" in seen  # the stop's own debug line, at least
    assert telemetry.current_request_id() == "-"


@pytest.mark.llamacpp
def test_a_stop_on_real_llama_server_is_one_cancelled_span(
    otel: Recorded, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = launch_llama_server(tmp_path_factory, "llama-otel", threads=1)
    try:
        with create_llm("llamacpp", base_url=server.url) as llm:
            answer = llm.generate(messages=[{"role": "user", "content": "Say hi."}], max_tokens=8)  # type: ignore[arg-type]
            event = threading.Event()
            with pytest.raises(GenerationCancelledError):
                for i, _ in enumerate(llm.stream("Write a long story.", max_tokens=400, cancel_event=event)):
                    if i == 3:
                        event.set()
            assert wait_until(lambda: len(server.cancelled_tasks()) >= 1, 15)  # the server's own word
    finally:
        server.stop()
    done, stopped = otel.spans()
    assert done.attributes["gen_ai.provider.name"] == "llamacpp" and done.attributes["server.port"] == server.port
    assert done.attributes["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens  # type: ignore[union-attr]
    assert done.attributes["gen_ai.response.status"] == "completed"
    assert stopped.attributes["gen_ai.response.status"] == "cancelled"
    assert stopped.attributes["gen_ai.usage.output_tokens"] >= 3


def test_a_fleet_call_is_one_span_with_its_attempts_as_events(otel: Recorded) -> None:
    """A fleet call: one span (never one per attempt); each attempt an event with its member and
    outcome (a failover, a hedge that lost, the one that served); the member on the span; every
    member's request carries the span's traceparent."""
    from abstract_client import Fleet

    def fleet_call(servers: dict[str, FakeOpenAIServer], **options: Any) -> tuple[Any, list[Any]]:
        members = {n: create_llm("openai-compatible", "fake-model", base_url=s.base_url) for n, s in servers.items()}
        with Fleet(members, policy="round_robin", **options) as fleet:
            assert fleet.generate("hi", max_tokens=3).member == "fast"
        span = otel.spans("chat")[-1]
        assert span.kind == SpanKind.CLIENT and span.attributes["abstract_client.fleet.member"] == "fast"
        for server in servers.values():
            traceparent = server.requests("/v1/chat/completions")[-1].headers.get("traceparent", "")
            assert traceparent.split("-")[1] == f"{span.context.trace_id:032x}"
        return span, [(e.name, dict(e.attributes)) for e in span.events]

    with FakeOpenAIServer() as down, FakeOpenAIServer(prefill_delay=3.0) as slow, FakeOpenAIServer() as fast:
        down.behavior.fault = "loading_503"
        _, events = fleet_call({"down": down, "fast": fast})
        assert [(n, a["member"], a.get("outcome")) for n, a in events] == [
            ("fleet.attempt", "down", None),
            ("fleet.attempt_end", "down", "failed"),
            ("fleet.attempt", "fast", None),
            ("fleet.attempt_end", "fast", "served"),
        ], events
        assert events[1][1]["error.type"] == "ServerUnavailableError"
        _, events = fleet_call({"slow": slow, "fast": fast}, hedge_after=0.2)
        assert [a["hedge"] for n, a in events if n == "fleet.attempt"] == [False, True]
        ends = {a["member"]: a["outcome"] for n, a in events if n == "fleet.attempt_end"}
        assert ends == {"slow": "lost", "fast": "served"}, events
    assert len(otel.spans("chat")) == 2  # one per call, whatever its attempts
