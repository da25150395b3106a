"""A job's trace context: `enqueue()` stores the caller's, the queue service validates the one a
forward carries, and a claim hands it to the worker."""

from __future__ import annotations

import asyncpg
import pytest
from opentelemetry.sdk.trace import TracerProvider

from jobq import enqueue
from services.queue.app import create_app
from services.queue.settings import QueueSettings, plain_database_url
from tests.conftest import guarded_services, serving

KEY = "submit-key-0123456789abcdef"
TRACEPARENT = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


async def test_enqueue_stores_the_callers_context_and_a_claim_hands_it_out(
    clean_database: str,
) -> None:
    tracer = TracerProvider().get_tracer("app")
    connection = await asyncpg.connect(plain_database_url(clean_database))
    try:
        with tracer.start_as_current_span("handle order") as span:
            async with connection.transaction():
                await enqueue(connection, "noop", {"n": 1})
        untraced = await enqueue(connection, "noop", {"n": 2})
    finally:
        await connection.close()
    ids = span.get_span_context()
    async with serving(create_app(QueueSettings(database_url=clean_database))) as http:
        reply = await http.post("/jobs/next", json={"worker": "w", "queues": ["default"], "max": 2})
    jobs = {job["payload"]["n"]: job for job in reply.json()["jobs"]}
    assert jobs[1]["traceContext"]["traceparent"].startswith(
        f"00-{ids.trace_id:032x}-{ids.span_id:016x}-"
    )
    # A job without one has no field at all in the claim.
    assert "traceContext" not in jobs[2] and jobs[2]["id"] == str(untraced.job_id)


@pytest.mark.parametrize(
    "context",
    [
        {"traceparent": "not-a-traceparent"},
        {"traceparent": TRACEPARENT, "tracestate": "k=" + "v" * 600},
        {"traceparent": TRACEPARENT, "baggage": "x"},
    ],
)
async def test_a_forward_with_a_bad_trace_context_is_refused(
    clean_database: str, context: dict[str, str]
) -> None:
    async with serving(create_app(QueueSettings(database_url=clean_database))) as http:
        body = {"taskType": "noop", "payload": {}, "traceContext": context}
        reply = await http.post("/jobs", json=body)
        assert reply.status_code == 422, reply.text
        assert reply.headers["content-type"].startswith("application/problem+json")
        listed = await http.get("/jobs")
        assert listed.json()["items"] == []


async def test_a_producer_submit_cannot_set_a_trace_context(
    clean_database: str, redis_url: str
) -> None:
    """The public API takes the context from the `traceparent` header only (when tracing is
    on): in a body it is an unknown field."""
    async with guarded_services(clean_database, redis_url, f"submit:{KEY}") as (producer, _):
        body = {"taskType": "noop", "payload": {}, "traceContext": {"traceparent": TRACEPARENT}}
        reply = await producer.post("/jobs", json=body, headers={"Authorization": f"Bearer {KEY}"})
        assert reply.status_code == 422
        assert "traceContext" in reply.text
