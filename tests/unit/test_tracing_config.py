"""When tracing turns on (the standard OTEL_* variables), and what a job stores of a context:
pure logic, no exporter involved."""

from __future__ import annotations

import msgspec
import pytest
from opentelemetry.sdk.trace import TracerProvider

from common.contracts import TraceContext
from common.web import tracing
from jobq.tracecontext import caller_trace_context


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_tracing_is_off_unless_an_exporter_is_asked_for(environ: dict[str, str], on: bool) -> None:
    assert tracing.tracing_requested(environ) is on


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
    ],
)
def test_a_variable_jobq_cannot_use_is_refused_by_name(environ: dict[str, str], named: str) -> None:
    with pytest.raises(tracing.TracingMisconfigured, match=named):
        tracing.tracing_requested(environ)


def test_the_default_process_has_no_tracer() -> None:
    assert tracing.tracer is None


def test_a_job_stores_the_callers_w3c_context_and_its_spans_link_to_it() -> None:
    assert caller_trace_context() is None  # no span current
    tracer = TracerProvider().get_tracer("app")
    with tracer.start_as_current_span("handle order") as span:
        stored = caller_trace_context()
        ids = span.get_span_context()
    assert stored is not None
    assert stored.traceparent.startswith(f"00-{ids.trace_id:032x}-{ids.span_id:016x}-")
    carried = tracing.link(stored, {"messaging.message.id": "x"})
    assert carried is not None
    assert (carried.context.trace_id, carried.context.span_id) == (ids.trace_id, ids.span_id)


@pytest.mark.parametrize(
    "fields",
    [
        {"traceparent": "00-" + "0" * 32 + "-" + "1" * 16 + "-01"},  # all-zero trace id
        {"traceparent": "01-" + "a" * 32 + "-" + "1" * 16 + "-01"},  # an unknown version
        {"traceparent": "00-" + "A" * 32 + "-" + "1" * 16 + "-01"},  # upper case
        {"traceparent": "00-" + "a" * 32 + "-" + "1" * 16 + "-01", "tracestate": "k=" + "v" * 600},
        {"traceparent": "00-" + "a" * 32 + "-" + "1" * 16 + "-01", "tracestate": "k=v\n"},
        {"traceparent": "00-" + "a" * 32 + "-" + "1" * 16 + "-01\n"},
    ],
)
def test_a_trace_context_out_of_bounds_is_refused(fields: dict[str, str]) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(fields, TraceContext)
