"""End to end: HTTP into the producer, real worker processes, real receivers."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from litestar import Litestar, Request, Response, post

from infra.stack import LocalStack
from tests.conftest import serving
from tests.e2e.conftest import wait_for_status


class Receiver:
    """A local webhook endpoint that records what it receives and answers `status`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200

    def app(self) -> Litestar:
        @post("/hook", status_code=200)
        async def hook(request: Request[Any, Any, Any]) -> Response[dict[str, str]]:
            self.requests.append({"body": await request.body(), "headers": dict(request.headers)})
            return Response({"seen": "yes"}, status_code=self.status)

        return Litestar([hook], logging_config=None, openapi_config=None)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    recorder = Receiver()
    async with serving(recorder.app()) as client:
        yield recorder, f"{client.base_url}/hook"


@pytest.fixture
async def producer(stack: LocalStack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.producer, timeout=10) as client:
        yield client


async def submit(producer: httpx.AsyncClient, body: dict[str, Any]) -> str:
    response = await producer.post("/jobs", json=body)
    assert response.status_code == 202, response.text
    assert response.json()["status"] in ("PENDING", "SCHEDULED")
    job_id: str = response.json()["jobId"]
    return job_id


async def test_webhook_job_delivers_its_payload_and_completes(
    stack: LocalStack, producer: httpx.AsyncClient, receiver: tuple[Receiver, str]
) -> None:
    recorder, url = receiver
    body = {"order": 42, "items": ["a", "b"], "note": "héllo"}
    job_id = await submit(producer, {"taskType": "webhook", "payload": {"url": url, "body": body}})

    view = await wait_for_status(producer, job_id, {"COMPLETED", "DEAD_LETTER"})

    assert view["status"] == "COMPLETED", stack.log_tail()
    assert view["attempts"] == 1
    assert len(recorder.requests) == 1
    assert json.loads(recorder.requests[0]["body"]) == body
    assert recorder.requests[0]["headers"]["idempotency-key"] == job_id


async def test_webhook_answered_400_is_dead_lettered(
    stack: LocalStack, producer: httpx.AsyncClient, receiver: tuple[Receiver, str]
) -> None:
    recorder, url = receiver
    recorder.status = 400
    job_id = await submit(producer, {"taskType": "webhook", "payload": {"url": url, "body": {}}})

    view = await wait_for_status(producer, job_id, {"COMPLETED", "DEAD_LETTER"})

    assert view["status"] == "DEAD_LETTER", stack.log_tail()
    assert "400" in view["lastError"]
    assert view["attempts"] == 1, "a non-retryable failure must not be retried"


async def test_email_job_lands_in_the_smtp_sink(
    stack: LocalStack, producer: httpx.AsyncClient
) -> None:
    subject = f"hi {time.time_ns()}"
    job_id = await submit(
        producer,
        {"taskType": "email", "payload": {"to": "a@example.com", "subject": subject, "body": "x"}},
    )

    view = await wait_for_status(producer, job_id, {"COMPLETED", "DEAD_LETTER"})

    assert view["status"] == "COMPLETED", stack.log_tail()
    assert view["attempts"] == 1
    mails = [json.loads(line) for line in stack.mailbox.read_text().splitlines()]
    mine = [mail for mail in mails if mail["subject"] == subject]
    assert len(mine) == 1
    assert mine[0]["to"] == ["a@example.com"]


async def test_unknown_task_type_is_retried_then_dead_lettered(
    stack: LocalStack, producer: httpx.AsyncClient
) -> None:
    job_id = await submit(producer, {"taskType": "mystery", "payload": {}, "maxAttempts": 3})

    view = await wait_for_status(producer, job_id, {"COMPLETED", "DEAD_LETTER"})

    assert view["status"] == "DEAD_LETTER", stack.log_tail()
    assert view["attempts"] == 3
    assert "no processor for task type 'mystery'" in view["lastError"]
    assert [entry["attempt"] for entry in view["errors"]] == [1, 2, 3]


async def test_producer_reports_bad_input_and_unknown_jobs_as_problems(
    producer: httpx.AsyncClient,
) -> None:
    bad = await producer.post("/jobs", json={"taskType": "email", "payload": "not an object"})
    assert bad.status_code == 422
    assert bad.headers["content-type"].startswith("application/problem+json")
    assert bad.json()["errors"][0]["pointer"] == "/payload"

    missing = await producer.get("/jobs/01a22994-cf82-7b07-9477-4ce715351173")
    assert missing.status_code == 404
    assert missing.json()["type"] == "urn:jobq:problem:job-not-found"


async def test_producer_retries_cancels_and_redrives(producer: httpx.AsyncClient) -> None:
    job_id = await submit(producer, {"taskType": "mystery", "payload": {}, "maxAttempts": 1})
    view = await wait_for_status(producer, job_id, {"DEAD_LETTER"})
    assert view["attempts"] == 1

    retried = await producer.post(f"/jobs/{job_id}/retry")
    assert retried.status_code == 200 and retried.json()["attempts"] == 0
    await wait_for_status(producer, job_id, {"DEAD_LETTER"})
    redriven = await producer.post("/dead-letter/redrive", json={"taskType": "mystery"})
    assert redriven.status_code == 200 and redriven.json()["moved"] >= 1
    redriven_view = await wait_for_status(producer, job_id, {"DEAD_LETTER"})
    assert redriven_view["attempts"] == 1, "a redrive resets attempts"

    later = await submit(producer, {"taskType": "noop", "payload": {}, "delaySeconds": 600})
    cancelled = await producer.post(f"/jobs/{later}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"
    refused = await producer.post(f"/jobs/{later}/cancel")
    assert refused.status_code == 409
    assert refused.json()["type"] == "urn:jobq:problem:invalid-state"
