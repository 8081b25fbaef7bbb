"""OpenTelemetry spans and metrics (GenAI semantic conventions), and request ids in log lines.

One span per generation or embedding call, started at admission and ended at release — the two
places every exit path of the contract passes (complete, error, stop, ``break``, a dropped
stream, a cancelled task, an eject), so a stopped call is never missing from a trace. A stop ends
its span with status ERROR, ``error.type`` = ``GenerationCancelledError``,
``gen_ai.response.status`` = ``cancelled``, the stop's reason, who stopped it, stop → release
latency and the partial usage. HTTP lanes send the span's context upstream (W3C
``traceparent``).

Only the OpenTelemetry *API* is used (extra ``otel``). With no API installed, or no tracer or
meter provider configured (the API's defaults), nothing is created and a call pays one attribute
lookup. :func:`use` gives this library its own providers without touching the global ones.
Message content is recorded only when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is
``true`` (the conventions' opt-in).

:class:`RequestIdFilter`: a ``logging.Filter`` that sets ``record.request_id`` (``"-"`` outside a
call), so a log format can show which call a line belongs to; attach it to a handler. Lines
logged inside a call get it from the call's context; the library's lines about a call logged
from elsewhere (a stop from a UI thread, a retry) carry it themselves (``extra``).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from .contract.lifecycle import FINAL, Phase, observe
from .provider import HttpProvider, Provider, RoutingProvider, engine_record, http_clients, served_by

if TYPE_CHECKING:
    from .stopping.token import StopToken
    from .types import GenerationRequest


class TracedCall(Protocol):
    """What telemetry reads of a call (``contract.call.Call`` is one). Telemetry observes the
    call's lifecycle (``contract/lifecycle.py``): the contract never calls it; its own per-call
    data (the span, the log context's token) lives in ``call.extensions``."""

    kind: str | None
    streaming: bool
    extensions: dict[str, Any]
    error_type: str | None
    t0: float
    token: StopToken
    progress: Any
    sent_request: GenerationRequest

    @property
    def provider(self) -> Provider: ...

    @property
    def request_id(self) -> str: ...

    @property
    def generated_tokens(self) -> int: ...


__all__ = ["RequestIdFilter", "current_request_id", "server_span", "use"]

log = logging.getLogger(__name__)

_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("abstract_client_request_id", default="-")
_providers: dict[str, Any] = {}  # "trace"/"meter": providers given to use(); "content": the opt-in
_instruments: dict[int, dict[str, Any]] = {}  # per meter provider: the instruments, made once
_tracers: dict[int, tuple[Any, Any]] = {}  # per tracer provider: (provider, its tracer)
_NO_PROVIDER = ("ProxyTracerProvider", "NoOpTracerProvider", "_ProxyMeterProvider", "NoOpMeterProvider")

try:  # the API only; absent → every function below returns at its first line
    from opentelemetry import metrics as _otel_metrics
    from opentelemetry import propagate as _otel_propagate
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - the extra is installed in the test environment
    _otel_trace = None  # type: ignore[assignment]


def current_request_id() -> str:
    """The request id of the call this code runs in (``"-"`` outside a call)."""
    return _request_id.get()


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` to every record (attach it to a handler, then use
    ``%(request_id)s`` in the format). Never adds content or keys."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        return True


def use(*, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Give this library its own tracer and meter providers (``None``: back to the global ones).
    Also reads ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` again."""
    _providers.pop("content", None)
    for key, value in (("trace", tracer_provider), ("meter", meter_provider)):
        if value is None:
            _providers.pop(key, None)
        else:
            _providers[key] = value


def _tracer() -> Any:
    if _otel_trace is None:
        return None
    provider = _providers.get("trace") or _otel_trace.get_tracer_provider()
    if type(provider).__name__ in _NO_PROVIDER:
        return None
    cached = _tracers.get(id(provider))
    if cached is None or cached[0] is not provider:  # get_tracer costs ~35 µs: once per provider
        cached = _tracers[id(provider)] = (provider, provider.get_tracer("abstract_client"))
    return cached[1]


def _meter_instruments() -> dict[str, Any] | None:
    if _otel_trace is None:
        return None
    provider = _providers.get("meter") or _otel_metrics.get_meter_provider()
    if type(provider).__name__ in _NO_PROVIDER:
        return None
    made = _instruments.get(id(provider))
    if made is None:
        meter = provider.get_meter("abstract_client")
        made = _instruments[id(provider)] = {
            "duration": meter.create_histogram("gen_ai.client.operation.duration", unit="s"),
            "tokens": meter.create_histogram("gen_ai.client.token.usage", unit="{token}"),
            "ttfc": meter.create_histogram("gen_ai.client.operation.time_to_first_chunk", unit="s"),
            "stops": meter.create_counter("abstract_client.stops", unit="{stop}"),
            "stop_latency": meter.create_histogram("abstract_client.stop.duration", unit="s"),
        }
    return made


def _capture_content() -> bool:
    if "content" not in _providers:  # read once (use() reads it again)
        _providers["content"] = (
            os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").lower() == "true"
        )
    return bool(_providers["content"])


# -- watching the contract -------------------------------------------------------------------------


_ENDS = frozenset(phase.value for phase in FINAL)


def _watch(call: TracedCall, what: str, info: Mapping[str, Any]) -> None:
    """The lifecycle observer: a span from admission to release, a retry as its event."""
    if what == "admitted":
        start(call)
    elif what in _ENDS and info["from"] is not Phase.BUILT:  # a call never admitted held nothing
        end(call, clean=info["clean"])
    elif what == "retry":
        retried(call, info["error"], info["attempt"], info["delay"])


observe(_watch)


def start(call: TracedCall) -> None:
    """At admission (rule 2): the request id for log lines; the span, when tracing is on."""
    call.extensions["telemetry.log_token"] = _request_id.set(call.request_id)
    if call.kind is None:
        return
    tracer = _tracer()
    if tracer is None:
        return
    request = call.sent_request
    model = request.model or call.provider.model or "unknown"
    attributes = {**_static(call.provider), "gen_ai.operation.name": call.kind, "gen_ai.request.model": model}
    attributes["abstract_client.request_id"] = call.request_id
    if call.kind != "embeddings":
        attributes["gen_ai.request.stream"] = call.streaming
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        if request.temperature is not None:
            attributes["gen_ai.request.temperature"] = request.temperature
        if request.seed is not None:
            attributes["gen_ai.request.seed"] = request.seed
        if _capture_content():
            attributes["gen_ai.input.messages"] = json.dumps(request.messages or request.prompt, default=str)
    # a fleet passes the trace on to its members' servers (its own provider has no clients)
    remote = isinstance(call.provider, HttpProvider | RoutingProvider)
    kind = _otel_trace.SpanKind.CLIENT if remote else _otel_trace.SpanKind.INTERNAL
    span = tracer.start_span(f"{call.kind} {model}", kind=kind, attributes=attributes)
    call.extensions["telemetry.span"] = span
    call.extensions["span_event"] = span.add_event  # a fleet's attempts, as events of this one span
    if remote:  # W3C traceparent upstream: the server's spans join this trace
        headers: dict[str, str] = {}
        _otel_propagate.inject(headers, context=_otel_trace.set_span_in_context(span))
        call.extensions["trace_headers"] = headers or None


_STATIC: weakref.WeakKeyDictionary[Provider, dict[str, Any]] = weakref.WeakKeyDictionary()


def _static(provider: Provider) -> dict[str, Any]:
    """The attributes a provider gives every span, computed once per provider."""
    static = _STATIC.get(provider)
    if static is None:
        static = {"gen_ai.provider.name": provider.name}
        clients = http_clients(provider)
        if clients is not None:
            url = urlsplit(clients.base_url)
            static["server.address"] = url.hostname or ""
            static["server.port"] = url.port or (443 if url.scheme == "https" else 80)
        _STATIC[provider] = static
    return static


def retried(call: TracedCall, error: BaseException, attempt: int, delay: float) -> None:
    """A retry of the call: an event on its span (attempts are not separate spans)."""
    span = call.extensions.get("telemetry.span")
    if span is not None:
        span.add_event("retry", {"attempt": attempt, "error.type": type(error).__name__, "delay_s": delay})


def end(call: TracedCall, *, clean: bool) -> None:
    """At release (rule 2), on every exit path: end the span with the outcome; record metrics."""
    log_token = call.extensions.pop("telemetry.log_token", None)
    if log_token is not None:
        try:
            _request_id.reset(log_token)
        except ValueError:  # released from another context (a dropped stream's __del__)
            pass
    if call.kind is None:
        return
    call.extensions.pop("span_event", None)  # the span's own method: it goes with the span
    span, instruments = call.extensions.pop("telemetry.span", None), _meter_instruments()
    if span is None and instruments is None:
        return
    now = time.perf_counter()
    progress, token = call.progress, call.token
    usage = progress.usage
    outcome: dict[str, Any] = {}
    if progress.model:
        outcome["gen_ai.response.model"] = progress.model
    if progress.response_id:
        outcome["gen_ai.response.id"] = progress.response_id
    if progress.finish_reason:
        outcome["gen_ai.response.finish_reasons"] = [progress.finish_reason]
    if usage is not None and usage.prompt_tokens is not None:
        outcome["gen_ai.usage.input_tokens"] = usage.prompt_tokens
    if token.is_set and call.kind != "embeddings":  # a stop: an in-process engine's own count
        record = engine_record(call.provider, call.request_id)
        engine = record.usage_at_stop() if record is not None else None
        if engine is not None:
            usage = engine
            outcome["gen_ai.usage.input_tokens"] = engine.prompt_tokens
    if call.kind != "embeddings":
        outcome["gen_ai.usage.output_tokens"] = (
            usage.completion_tokens
            if usage is not None and usage.completion_tokens is not None
            else call.generated_tokens
        )
        if usage is not None and usage.cached_tokens is not None:
            outcome["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
    if progress.first_chunk_at is not None:
        outcome["gen_ai.response.time_to_first_chunk"] = progress.first_chunk_at - call.t0
    member = served_by(call.provider, call.request_id)
    if member is not None:  # a fleet: the member that served (or last tried) the call
        outcome["abstract_client.fleet.member"] = member
    error_type: str | None = None
    if clean and not token.is_set:
        outcome["gen_ai.response.status"] = "completed"
        if span is not None and _capture_content() and call.kind != "embeddings":
            outcome["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "content": progress.text}])
    elif token.is_set:
        error_type = "GenerationCancelledError"
        stop_s = now - (token.stopped_at or now)
        outcome.update(
            {
                "gen_ai.response.status": "cancelled",
                "abstract_client.stop.reason": token.reason or "user",
                "abstract_client.stop.by_caller": token.stopped_by_caller,
                "abstract_client.stop.to_release_ms": stop_s * 1000,
            }
        )
    else:
        error_type = call.error_type or "_OTHER"
        outcome["gen_ai.response.status"] = "error"
    if error_type is not None:
        outcome["error.type"] = error_type
    if span is not None:
        span.set_attributes(outcome)
        if error_type is not None:
            span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, error_type))
        span.end()
    if instruments is not None:
        _record(call, instruments, outcome, error_type, now)


def _record(
    call: TracedCall, instruments: dict[str, Any], outcome: dict[str, Any], error_type: str | None, now: float
) -> None:
    common = {
        "gen_ai.operation.name": call.kind,
        "gen_ai.provider.name": call.provider.name,
        "gen_ai.request.model": call.sent_request.model or call.provider.model or "unknown",
    }
    with_error = {**common, "error.type": error_type} if error_type else common
    instruments["duration"].record(now - call.t0, with_error)
    if "gen_ai.usage.input_tokens" in outcome:
        instruments["tokens"].record(outcome["gen_ai.usage.input_tokens"], {**common, "gen_ai.token.type": "input"})
    if "gen_ai.usage.output_tokens" in outcome:
        instruments["tokens"].record(outcome["gen_ai.usage.output_tokens"], {**common, "gen_ai.token.type": "output"})
    if call.streaming and "gen_ai.response.time_to_first_chunk" in outcome:  # a streaming metric
        instruments["ttfc"].record(outcome["gen_ai.response.time_to_first_chunk"], common)
    if "abstract_client.stop.reason" in outcome:
        reason = {**common, "abstract_client.stop.reason": outcome["abstract_client.stop.reason"]}
        instruments["stops"].add(1, reason)
        instruments["stop_latency"].record(outcome["abstract_client.stop.to_release_ms"] / 1000, reason)


# -- the gateway ----------------------------------------------------------------------------------


@contextmanager
def server_span(name: str, raw_headers: list[tuple[bytes, bytes]], request_id: str, path: str) -> Iterator[Any]:
    """A SERVER span for one gateway request, continuing the caller's trace (W3C
    ``traceparent`` among the ASGI ``raw_headers``), current for the block: the calls made inside
    it are its children. ``None`` when tracing is off (the headers are not even decoded)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers}
    with tracer.start_as_current_span(
        name,
        context=_otel_propagate.extract(headers),
        kind=_otel_trace.SpanKind.SERVER,
        attributes={"http.request.method": "POST", "url.path": path, "abstract_client.request_id": request_id},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span
