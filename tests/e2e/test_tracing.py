"""Tracing across real processes: the queue service, the producer and a worker export their
spans over OTLP/HTTP to a receiver in this test, decoded with the published OpenTelemetry
protobuf definitions (`opentelemetry-proto`), while a webhook receiver here fails the first
delivery and accepts the second.

One submitted webhook job that fails once and then succeeds makes: the producer's submit span,
a child of the client's own span (the client library carried its `traceparent`); two attempt
traces of the worker, each a new trace linked to the submit, each with the webhook's POST as a
child span whose `traceparent` the receiver got; the queue service's claim and settle spans
linked to the submit; database statements as spans named by their statement constants; and
log lines carrying the ids of the span they were written in. An email job's SMTP delivery is
a child span of its attempt. The attempt spans carry the job's queue and tenant.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infra.stack import LocalStack
from jobq.client import AsyncClient
from tests.e2e.conftest import E2E_SETTINGS


@dataclass(frozen=True)
class Captured:
    """One exported span, as the receiver decoded it (ids in hex)."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    links: list[tuple[str, str, dict[str, Any]]]
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class Receivers:
    """The OTLP/HTTP trace receiver and the webhook receiver, on one loopback server."""

    spans: list[Captured] = field(default_factory=list)
    traceparents: list[str] = field(default_factory=list)
    port: int = 0

    async def export(self, request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource_spans in message.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Captured(
                            service=service,
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            links=[
                                (
                                    link.trace_id.hex(),
                                    link.span_id.hex(),
                                    _attributes(link.attributes),
                                )
                                for link in span.links
                            ],
                            attributes=_attributes(span.attributes),
                        )
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def hook(self, request: web.Request) -> web.Response:
        self.traceparents.append(request.headers.get("traceparent", ""))
        # The first delivery fails (a retryable 500), the second succeeds.
        return web.Response(status=500 if len(self.traceparents) == 1 else 200)

    def named(self, service: str, name: str) -> list[Captured]:
        return [s for s in self.spans if s.service == service and s.name == name]


@pytest.fixture
async def receivers() -> AsyncIterator[Receivers]:
    captured = Receivers()
    app = web.Application()
    app.router.add_post("/v1/traces", captured.export)
    app.router.add_post("/hook", captured.hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    captured.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield captured
    finally:
        await runner.cleanup()


async def _until(what: str, check: Any, within: float = 60.0) -> None:
    """Until `check()` holds (spans are exported in batches); fails after `within` seconds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within}s")
        await asyncio.sleep(0.1)


async def test_one_webhook_job_traced_from_the_client_to_the_receiver(
    database_url: str, redis_url: str, tmp_path: Path, receivers: Receivers
) -> None:
    environment = {
        **E2E_SETTINGS,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receivers.port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    stack = LocalStack(database_url, redis_url, tmp_path, environment=environment)
    await stack.start()
    # The application's own tracing, in this process: its span is current while it submits.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        async with AsyncClient(stack.producer) as client:
            with provider.get_tracer("app").start_as_current_span("handle order") as app_span:
                job = await client.submit(
                    "webhook",
                    {"url": f"http://127.0.0.1:{receivers.port}/hook", "body": {"order": 42}},
                    max_attempts=3,
                )
            view = await client.wait(job.job_id, timeout=60)
            mail = await client.submit("email", {"to": "a@example.com", "subject": "traced"})
            mailed = await client.wait(mail.job_id, timeout=60)
        assert view.status == "COMPLETED" and view.attempts == 2
        assert mailed.status == "COMPLETED"
        await _until(
            "the spans of both attempts and their webhook calls",
            lambda: (
                len(receivers.named("jobq-worker", "process webhook")) == 2
                and len(receivers.named("jobq-worker", "POST")) == 2
                and receivers.named("jobq-producer", "submit default")
                and len(receivers.named("jobq-queue", "settle")) >= 2
                and receivers.named("jobq-worker", "smtp send")
            ),
        )
    finally:
        stack.stop()

    dump = os.environ.get("JOBQ_TRACE_DUMP")
    if dump:  # the README's picture of one job's traces is drawn from these
        spans = json.dumps([dataclasses.asdict(s) for s in receivers.spans])
        await asyncio.to_thread(Path(dump).write_text, spans)
    app_context = app_span.get_span_context()
    [submit] = [
        span
        for span in receivers.named("jobq-producer", "submit default")
        if span.attributes["messaging.message.id"] == str(job.job_id)
    ]
    # The client's own span is the submit's parent.
    assert submit.trace_id == f"{app_context.trace_id:032x}"
    assert submit.parent_span_id == f"{app_context.span_id:016x}"
    assert submit.attributes["messaging.message.id"] == str(job.job_id)
    assert submit.attributes["messaging.system"] == "jobq"
    submit_ref = (submit.trace_id, submit.span_id)

    attempts = sorted(
        receivers.named("jobq-worker", "process webhook"),
        key=lambda s: s.attributes["jobq.attempt"],
    )
    assert [a.attributes["jobq.attempt"] for a in attempts] == [1, 2]
    for attempt in attempts:  # the claim carried the job's queue and tenant
        assert attempt.attributes["messaging.destination.name"] == "default"
        assert attempt.attributes["jobq.tenant"] == "default"
        assert attempt.attributes["messaging.message.id"] == str(job.job_id)
    assert [a.attributes["jobq.outcome"] for a in attempts] == ["failed", "succeeded"]
    # Each attempt is a trace of its own, linked to the submit.
    assert len({a.trace_id for a in attempts} | {submit.trace_id}) == 3
    for attempt in attempts:
        assert attempt.parent_span_id == ""
        assert [(t, s) for t, s, _ in attempt.links] == [submit_ref]

    posts = receivers.named("jobq-worker", "POST")
    for attempt in attempts:
        [post] = [p for p in posts if p.trace_id == attempt.trace_id]
        assert post.parent_span_id == attempt.span_id
        assert post.attributes["server.address"] == "127.0.0.1"
        # The webhook receiver got the POST span's context.
        assert [post.trace_id, post.span_id] in [t.split("-")[1:3] for t in receivers.traceparents]
    assert sorted(p.attributes["http.response.status_code"] for p in posts) == [200, 500]

    # The email's SMTP delivery is a child of its attempt.
    [delivery] = receivers.named("jobq-worker", "smtp send")
    [emailing] = receivers.named("jobq-worker", "process email")
    assert (delivery.trace_id, delivery.parent_span_id) == (emailing.trace_id, emailing.span_id)
    assert delivery.attributes["network.protocol.name"] == "smtp"

    # The queue service's spans link to the submit, with the job and what happened to it.
    claims = [
        s for s in receivers.spans if s.service == "jobq-queue" and s.name.startswith("claim")
    ]
    assert len([c for c in claims if any((t, s) == submit_ref for t, s, _ in c.links)]) == 2
    outcomes = {
        attributes["jobq.outcome"]
        for span in receivers.named("jobq-queue", "settle")
        for trace_id, span_id, attributes in span.links
        if (trace_id, span_id) == submit_ref
    }
    assert outcomes == {"SCHEDULED", "COMPLETED"}
    enqueues = receivers.named("jobq-queue", "enqueue")
    assert len([s for s in enqueues if any((t, i) == submit_ref for t, i, _ in s.links)]) == 1
    # Database statements are spans too, named by the repository's statement constants
    # (`claim`, `ack_and_claim`, `fail` …), children of the span that ran them, and carrying
    # neither their SQL nor any value.
    statements = [
        s
        for s in receivers.spans
        if s.service == "jobq-queue" and s.attributes.get("db.system.name") == "postgresql"
    ]
    names = {s.name for s in statements}
    assert "enqueue" in names
    assert names & {"claim", "claim_fair", "ack_and_claim", "ack_and_claim_fair"}
    assert names & {"ack", "ack_and_claim", "ack_and_claim_fair"}
    assert "fail" in names, "the first attempt's failure"
    assert "mark_awaited" in names, "client.wait flags the job"
    for statement in statements:
        assert statement.attributes["db.operation.name"] == statement.name
        assert set(statement.attributes) == {
            "db.system.name", "db.system", "db.operation.name", "db.namespace"
        }  # fmt: skip
        # A statement without a name of its own (asyncpg's type introspection, a transaction's
        # BEGIN) is named by its first SQL word, never by anything after it.
        assert statement.name.islower() or statement.name.isupper(), statement.name
        assert str(job.job_id) not in json.dumps(statement.attributes)
    # The enqueue statement's span is a child of the queue service's enqueue span.
    [queued] = [s for s in enqueues if any((t, i) == submit_ref for t, i, _ in s.links)]
    assert any(
        s.name == "enqueue" and (s.trace_id, s.parent_span_id) == (queued.trace_id, queued.span_id)
        for s in statements
    )

    # The settle that scheduled the retry logged it inside its span.
    retry_settle = next(
        span
        for span in receivers.named("jobq-queue", "settle")
        if any(a.get("jobq.outcome") == "SCHEDULED" for _, _, a in span.links)
    )
    lines = [json.loads(line) for line in (tmp_path / "queue.log").read_text().splitlines()]
    [logged] = [
        line
        for line in lines
        if line.get("event") == "job_retry" and line.get("job_id") == str(job.job_id)
    ]
    assert (logged["trace_id"], logged["span_id"]) == (retry_settle.trace_id, retry_settle.span_id)
