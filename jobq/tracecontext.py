"""The caller's trace context, carried by the client library when the application traces
with OpenTelemetry (docs/architecture.md#tracing).

`opentelemetry-api` is optional for the client distribution (`pip install
'./clients/python[otel]'`): without it, or without a span current, nothing is added. With it,
`Client`/`AsyncClient` requests carry the current span's W3C `traceparent` (the producer's
submit span continues it) and `enqueue()` stores it with the job, so a web request that
submits a job shows the job's attempts linked under it.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import msgspec

from common.contracts import TraceContext

try:
    from opentelemetry.propagate import inject as _inject
except ImportError:  # tracing is optional: without the API there is no context to carry
    _inject = None  # type: ignore[assignment]


def add_caller_context(headers: MutableMapping[str, str]) -> None:
    """Add the current span's propagation headers (`traceparent`, …; the application's
    configured propagators) to `headers`; nothing without the API or a current span."""
    if _inject is not None:
        _inject(headers)


def caller_trace_context() -> TraceContext | None:
    """The current span's W3C context as a job stores it, validated (`TraceContext`); None
    without the API, without a current span, or with a context that is not W3C's."""
    if _inject is None:
        return None
    carrier: dict[str, str] = {}
    _inject(carrier)
    if "traceparent" not in carrier:
        return None
    fields = {"traceparent": carrier["traceparent"], "tracestate": carrier.get("tracestate")}
    try:
        return msgspec.convert(fields, TraceContext)
    except msgspec.ValidationError:
        # A tracestate past the bound is optional context: keep the traceparent alone.
        try:
            return msgspec.convert({"traceparent": fields["traceparent"]}, TraceContext)
        except msgspec.ValidationError:
            return None
