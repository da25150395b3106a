"""The worker's span for each attempt, when tracing is on (docs/architecture.md#tracing).

Each attempt is the root of a trace of its own that *links* to the job's submit context
(awa #110; adonisjs: "use span links, not parent-child"), so a job retried for hours makes one
short trace per attempt, each findable from the submit. The processor runs inside the span:
its outbound calls (webhook, SMTP) are child spans."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from common.contracts import JobMessage
from common.web import tracing


def start_attempt(tracer: Tracer, job: JobMessage, worker: str) -> Span:
    """Start the CONSUMER span `process <task type>` of one attempt of `job` by `worker`: a new
    trace, linked to the submit (when the job has its context), with the job's id, queue
    (`messaging.destination.name`), tenant, task type and attempt as attributes."""
    link = tracing.link(job.trace_context, {"messaging.message.id": str(job.id)})
    attributes: dict[str, str | int] = {
        "messaging.system": tracing.MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.message.id": str(job.id),
        "jobq.task_type": job.task_type,
        "jobq.attempt": job.attempts,
        "jobq.max_attempts": job.max_attempts,
        "jobq.worker": worker,
    }
    # Both come with every claim from a queue service of this release (not from older ones).
    if job.queue is not None:
        attributes["messaging.destination.name"] = job.queue
    if job.tenant is not None:
        attributes["jobq.tenant"] = job.tenant
    return tracer.start_span(
        f"process {job.task_type}",
        context=otel_context.Context(),  # a new trace, whatever is current
        kind=SpanKind.CONSUMER,
        links=[] if link is None else [link],
        attributes=attributes,
    )


def end_attempt(span: Span, outcome: str, error: str | None = None) -> None:
    """End an attempt's span with `jobq.outcome` (`succeeded`, `failed`, `cancel requested`,
    `lease lost`, `shutdown`) and, for a failure, an ERROR status carrying `error`."""
    span.set_attribute("jobq.outcome", outcome)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()
