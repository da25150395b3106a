"""OpenTelemetry tracing, opt-in with the standard `OTEL_*` environment variables
(docs/architecture.md#tracing).

Off by default: `tracer` stays None, and every traced place in jobq checks it (`if tracing.tracer
is not None`) before doing anything, so a deployment without tracing pays one None check per
job and imports no SDK. `setup_tracing(service)` turns it on when the environment asks for an
exporter: `OTEL_TRACES_EXPORTER=otlp`, or an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) without `OTEL_TRACES_EXPORTER=none`; `OTEL_SDK_DISABLED=true`
wins over both. Everything else is the SDK's own reading of the standard variables: the
protocol (`OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`, `http/protobuf` or `grpc`), headers, the
sampler (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), the batch processor's delays and
`OTEL_SERVICE_NAME`/`OTEL_RESOURCE_ATTRIBUTES`.

Jobs carry the W3C context of the span that submitted them (`TraceContext`); the spans of the
queue service and of each attempt are new traces that *link* to it (awa #110, adonisjs: "use
span links, not parent-child"), so a retry hours later does not stretch one endless trace.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from common.contracts import TRACESTATE_MAX_CHARS, TraceContext
from common.errors import JobqError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Tracer

tracer: Tracer | None = None
"""The process's tracer when tracing is on, else None (the check every traced place makes)."""

MESSAGING_SYSTEM = "jobq"
"""`messaging.system` of jobq's spans (OpenTelemetry semantic conventions for messaging)."""

STANDARD_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_TRACES_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_SERVICE_NAME",
    "OTEL_SDK_DISABLED",
)
"""The OpenTelemetry variables `.env.example` and the README name (the SDK reads the rest of
the standard set too: headers, timeouts, the batch processor's limits)."""

_EXPORTERS = {"otlp", "none", ""}
_PROTOCOLS = {"http/protobuf", "grpc"}


class TracingMisconfigured(JobqError):
    """An `OTEL_*` variable jobq reads has a value it cannot use."""


def tracing_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment turns tracing on (see the module). Raises TracingMisconfigured
    for an `OTEL_TRACES_EXPORTER` other than `otlp` or `none`, or an OTLP protocol other than
    `http/protobuf` or `grpc`, naming the variable."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter not in _EXPORTERS:
        raise TracingMisconfigured(
            f"OTEL_TRACES_EXPORTER={exporter!r}: jobq exports traces with otlp (or none)"
        )
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = environ.get(name, "").strip()
        if protocol and protocol not in _PROTOCOLS:
            raise TracingMisconfigured(f"{name}={protocol!r}: use http/protobuf or grpc")
    if exporter == "none":
        return False
    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    return exporter == "otlp" or bool(endpoint)


def setup_tracing(service: str) -> Tracer | None:
    """Turn tracing on for this process when the environment asks for it (`tracing_requested`):
    a `TracerProvider` with the resource `service.name` = `service` (unless
    `OTEL_SERVICE_NAME` names one), the standard sampler, a batch processor and the OTLP
    exporter of the configured protocol. Sets and returns the module's `tracer`; None when
    tracing stays off. Raises TracingMisconfigured (see `tracing_requested`). (The queue
    service's database statements become spans through its pool's connection class,
    `services.queue.statements`, which reads `tracer`: call this before creating the pool.)"""
    global tracer
    if not tracing_requested():
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(_exporter()))
    trace.set_tracer_provider(provider)
    tracer = provider.get_tracer("jobq")
    from common import logging as jobq_logging

    jobq_logging.span_ids = current_span_ids
    return tracer


def start(service: str) -> None:
    """`setup_tracing` at a service's start; a misconfigured `OTEL_*` variable stops the
    process with a message naming it (SystemExit)."""
    try:
        setup_tracing(service)
    except TracingMisconfigured as exc:
        raise SystemExit(f"{service}: {exc}") from None


def shutdown_tracing() -> None:
    """Export the spans still buffered and stop (at a service's shutdown); no-op when off."""
    if tracer is None:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()


def _exporter() -> Any:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter()


def current_span_ids() -> dict[str, str] | None:
    """`{"trace_id", "span_id"}` (hex) of the current span, for log lines; None without one."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def incoming(headers: Mapping[str, str]) -> Context:
    """The context a request's W3C `traceparent`/`tracestate` headers continue (an empty one
    when they are missing or malformed: the propagator ignores what it cannot parse)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(headers)


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to outgoing `headers`."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(headers)


def current_trace_context() -> TraceContext | None:
    """The current span's context as a job stores it; None without a valid span. A
    `tracestate` longer than `TRACESTATE_MAX_CHARS` is left out (it is optional)."""
    carrier: dict[str, str] = {}
    inject(carrier)
    traceparent = carrier.get("traceparent")
    if traceparent is None:
        return None
    state = carrier.get("tracestate") or None
    if state is not None and len(state) > TRACESTATE_MAX_CHARS:
        state = None
    return TraceContext(traceparent=traceparent, tracestate=state)


def link(context: TraceContext | None, attributes: Mapping[str, Any] | None = None) -> Link | None:
    """A span link to a job's stored submit context, with `attributes`; None without one."""
    if context is None:
        return None
    from opentelemetry import trace

    carrier = {"traceparent": context.traceparent}
    if context.tracestate:
        carrier["tracestate"] = context.tracestate
    span_context = trace.get_current_span(incoming(carrier)).get_span_context()
    if not span_context.is_valid:
        return None
    return trace.Link(span_context, dict(attributes or {}))


def links(pairs: Iterable[tuple[TraceContext | None, Mapping[str, Any]]]) -> list[Link]:
    """`link` of each (context, attributes), leaving out jobs without a context."""
    made = (link(context, attributes) for context, attributes in pairs)
    return [made_link for made_link in made if made_link is not None]
