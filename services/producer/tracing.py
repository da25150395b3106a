"""The producer's submit span (when tracing is on; docs/architecture.md#tracing)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
from litestar import Request
from opentelemetry.trace import SpanKind, Tracer

from common.contracts import EnqueueRequest
from common.web import tracing


@contextlib.contextmanager
def submit_span(
    tracer: Tracer, request: Request[Any, Any, Any], jobs: Sequence[EnqueueRequest]
) -> Iterator[list[EnqueueRequest]]:
    """A PRODUCER span `submit <queue>` for `jobs` (one request's), continuing the caller's
    W3C `traceparent`/`tracestate` (a new trace without one); yields the jobs carrying the
    span's context, so each attempt's span can link to it. Attributes follow the messaging
    semantic conventions (`messaging.system`, `messaging.destination.name`,
    `messaging.message.id` for a single job, `messaging.batch.message_count`), plus
    `jobq.task_type` and `jobq.tenant`."""
    first = jobs[0]
    attributes: dict[str, Any] = {
        "messaging.system": tracing.MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "submit",
        "messaging.destination.name": first.queue,
        "jobq.task_type": first.task_type,
        "jobq.tenant": first.tenant,
    }
    if len(jobs) == 1:
        attributes["messaging.message.id"] = str(first.job_id)
    else:
        attributes["messaging.batch.message_count"] = len(jobs)
    with tracer.start_as_current_span(
        f"submit {first.queue}",
        context=tracing.incoming(request.headers),
        kind=SpanKind.PRODUCER,
        attributes=attributes,
    ):
        context = tracing.current_trace_context()
        yield [msgspec.structs.replace(job, trace_context=context) for job in jobs]
