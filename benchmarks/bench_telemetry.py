"""What tracing costs a call: a 3-token generation against a loopback fake server (its own
process), p50/p99 per call, with

* the OpenTelemetry API treated as absent (the floor);
* the API installed and no provider configured (the default for most users: must cost nothing);
* the SDK with an in-memory span exporter and a metric reader (every span and metric recorded).

Usage: python benchmarks/bench_telemetry.py [-n 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tables import pct, print_table, timed

from abstract_client import create_llm, telemetry
from abstract_client.testing import SubprocessFake


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    api = telemetry._otel_trace

    def absent() -> None:
        telemetry.use()
        telemetry._otel_trace = None  # type: ignore[assignment]

    def no_provider() -> None:
        telemetry._otel_trace = api
        telemetry.use()

    def sdk() -> None:
        telemetry._otel_trace = api
        telemetry.use(tracer_provider=tracer_provider, meter_provider=meter_provider)

    def spans_only() -> None:
        telemetry._otel_trace = api
        telemetry.use(tracer_provider=tracer_provider)

    def metrics_only() -> None:
        telemetry._otel_trace = api
        telemetry.use(meter_provider=meter_provider)

    def ours_only() -> None:  # our instrumentation's own work: every SDK object a no-op stub
        telemetry._otel_trace = api
        telemetry.use(tracer_provider=_StubTracerProvider(), meter_provider=_StubMeterProvider())

    modes = {
        "API absent (floor)": absent,
        "ours alone (SDK calls stubbed out)": ours_only,
        "API, no provider configured": no_provider,
        "SDK: spans only (in-memory exporter)": spans_only,
        "SDK: metrics only (in-memory reader)": metrics_only,
        "SDK: spans + metrics": sdk,
    }
    samples: dict[str, list[float]] = {name: [] for name in modes}
    with SubprocessFake("openai", token_delay=0.0) as server:
        llm = create_llm("openai-compatible", "fake-model", base_url=server.base_url, max_retries=0)
        for _ in range(args.rounds):  # interleaved rounds: each mode sees the same machine state
            for name, switch in modes.items():
                switch()
                samples[name] += timed(lambda: llm.generate("x", max_tokens=3), args.n // args.rounds, warm=10)
                exporter.clear()
        no_provider()
        llm.close()
    floor = statistics.median(samples["API absent (floor)"])
    rows: list[dict[str, Any]] = []
    for name, values in samples.items():
        p50 = statistics.median(values)
        rows.append(
            {
                "tracing": name,
                "n": len(values),
                "p50_ms": p50,
                "p99_ms": pct(values, 99),
                "vs floor": f"{p50 / floor - 1:+.1%}",
            }
        )
    print_table("Per call, a 3-token generation on loopback", rows)
    sdk_us = sdk_alone(tracer_provider, meter_provider, exporter)
    print(
        f"\nThe SDK's own work for one call's telemetry, alone (the same span with its attributes, the "
        f"traceparent header, three histogram records; no call around it): {sdk_us:.1f} µs = "
        f"{sdk_us / 1000 / floor:.1%} of the floor call"
    )


class _Stub:
    """Accepts every call the instrumentation makes of the SDK, and does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return _Stub

    def get_span_context(self) -> Any:
        from opentelemetry import trace

        return trace.INVALID_SPAN_CONTEXT

    def is_recording(self) -> bool:
        return False


class _StubTracerProvider:
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return _StubTracer()


class _StubTracer:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        return _Stub()


class _StubMeterProvider:
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return _Stub()


def sdk_alone(tracer_provider: Any, meter_provider: Any, exporter: Any) -> float:
    """Microseconds per call of exactly the SDK operations a traced call asks for: what no
    instrumentation of this call can go below."""
    import timeit

    from opentelemetry import propagate, trace

    tracer = tracer_provider.get_tracer("floor")
    meter = meter_provider.get_meter("floor")
    duration, tokens = meter.create_histogram("floor.duration"), meter.create_histogram("floor.tokens")
    at_start = {
        "gen_ai.provider.name": "openai-compatible",
        "server.address": "127.0.0.1",
        "server.port": 8080,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "fake-model",
        "abstract_client.request_id": "0123456789abcdef0123456789abcdef",
        "gen_ai.request.stream": False,
        "gen_ai.request.max_tokens": 3,
    }
    at_end = {
        "gen_ai.response.model": "fake-model",
        "gen_ai.response.id": "chatcmpl-0",
        "gen_ai.response.finish_reasons": ["length"],
        "gen_ai.usage.input_tokens": 1,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.response.status": "completed",
    }
    common = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai-compatible"}

    def one() -> None:
        span = tracer.start_span("chat fake-model", kind=trace.SpanKind.CLIENT, attributes=at_start)
        propagate.inject({}, context=trace.set_span_in_context(span))
        span.set_attributes(at_end)
        span.end()
        duration.record(0.001, common)
        tokens.record(1, {**common, "gen_ai.token.type": "input"})
        tokens.record(3, {**common, "gen_ai.token.type": "output"})

    n = 2000
    best = min(timeit.repeat(one, number=n, repeat=5)) / n
    exporter.clear()
    return best * 1e6


if __name__ == "__main__":
    main()
