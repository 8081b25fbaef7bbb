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

    modes = {
        "API absent (floor)": absent,
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


if __name__ == "__main__":
    main()
