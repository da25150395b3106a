"""The queue service's spans, when tracing is on (docs/architecture.md#tracing): one per
enqueue statement, per claim that handed out jobs, and per settle statement, each *linking* to
the submit context of every job it touched (at most the SDK's link limit, 128 by default), with
the job's id and what happened to it as the link's attributes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
from opentelemetry.trace import Span, SpanKind, Tracer

from common.contracts import EnqueueRequest, TraceContext
from common.web import tracing
from services.queue.repository import Claimed, Settled

_BASE = {"messaging.system": tracing.MESSAGING_SYSTEM}


def _stored(raw: bytes | str | None) -> TraceContext | None:
    """A job's stored trace context (JSON), or None when it has none or it is unreadable."""
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=TraceContext)
    except msgspec.DecodeError:
        return None


@contextlib.contextmanager
def enqueue_span(tracer: Tracer, requests: Sequence[EnqueueRequest]) -> Iterator[None]:
    """The span of one enqueue statement (`messaging.operation.type` `send`)."""
    links = tracing.links(
        (r.trace_context, {"messaging.message.id": str(r.job_id), "jobq.tenant": r.tenant})
        for r in requests
    )
    attributes: dict[str, Any] = {
        **_BASE,
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.batch.message_count": len(requests),
    }
    with tracer.start_as_current_span(
        "enqueue", kind=SpanKind.PRODUCER, links=links, attributes=attributes
    ):
        yield


def claim_span(
    tracer: Tracer, jobs: Sequence[Claimed], queues: Sequence[str], worker: str, began_ns: int
) -> None:
    """Record the span of a claim that handed out `jobs` from `queues` to `worker`, from
    `began_ns` (epoch nanoseconds) to now."""
    links = tracing.links(
        (
            _stored(None if job.trace_context is None else bytes(job.trace_context)),
            {"messaging.message.id": str(job.id), "jobq.attempt": job.attempts},
        )
        for job in jobs
    )
    attributes: dict[str, Any] = {
        **_BASE,
        "messaging.operation.type": "receive",
        "messaging.operation.name": "claim",
        "messaging.destination.name": ",".join(queues),
        "messaging.batch.message_count": len(jobs),
        "jobq.worker": worker,
    }
    span = tracer.start_span(
        f"claim {','.join(queues)}",
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        start_time=began_ns,
    )
    span.end()


def settle_span(tracer: Tracer, settled: Sequence[Settled]) -> Span:
    """Start the span of a settle statement that changed `settled` (`jobq.outcome` of each on
    its link: COMPLETED, SCHEDULED for a retry, DEAD_LETTER, CANCELLED, PENDING); the caller
    ends it."""
    links = tracing.links(
        (
            _stored(job.trace_json),
            {
                "messaging.message.id": str(job.id),
                "messaging.destination.name": job.queue,
                "jobq.task_type": job.task_type,
                "jobq.attempt": job.attempts,
                "jobq.outcome": job.status.value,
            },
        )
        for job in settled
    )
    attributes: dict[str, Any] = {
        **_BASE,
        "messaging.operation.type": "settle",
        "messaging.operation.name": "settle",
        "messaging.batch.message_count": len(settled),
    }
    return tracer.start_span("settle", kind=SpanKind.INTERNAL, links=links, attributes=attributes)
