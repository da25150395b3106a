"""Leases, fencing and the reaper, through the queue service's HTTP API on real PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from services.queue.app import create_app
from services.queue.background import Reaper
from services.queue.metrics import QueueMetrics
from services.queue.repository import JobRepository
from services.queue.settings import QueueSettings
from tests.conftest import serving
from tests.helpers import wait_past


@pytest.fixture
async def client(clean_database: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = QueueSettings(
        database_url=clean_database,
        redis_url=redis_url,
        # The test runs the reaper itself, at the moment it chooses.
        queue_reaper_interval=3600,
    )
    async with serving(create_app(settings)) as client:
        yield client


async def submit(client: httpx.AsyncClient, **fields: Any) -> str:
    body = {"taskType": "noop", "payload": {"x": 1}, **fields}
    response = await client.post("/jobs", json=body)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["jobId"]
    return job_id


async def claim(client: httpx.AsyncClient, **fields: Any) -> list[dict[str, Any]]:
    body = {"worker": "w", "queues": ["default"], **fields}
    response = await client.post("/jobs/next", json=body)
    if response.status_code == 204:
        return []
    assert response.status_code == 200, response.text
    jobs: list[dict[str, Any]] = response.json()["jobs"]
    return jobs


async def test_expired_lease_is_fenced_and_the_new_owner_wins(
    client: httpx.AsyncClient, repository: JobRepository
) -> None:
    job_id = await submit(client)
    [first] = await claim(client, visibilityTimeout=1)
    await wait_past(repository, first["visibleAt"])

    reaped = await Reaper(repository, QueueMetrics(CollectorRegistry())).sweep()
    assert reaped == 1
    [second] = await claim(client)
    assert second["id"] == job_id
    assert second["receiptHandle"] != first["receiptHandle"]

    stale = await client.post(f"/jobs/{job_id}/ack", json={"receiptHandle": first["receiptHandle"]})
    assert stale.status_code == 409
    assert stale.headers["content-type"].startswith("application/problem+json")
    assert stale.json()["type"] == "urn:jobq:problem:stale-receipt-handle"

    acked = await client.post(
        f"/jobs/{job_id}/ack", json={"receiptHandle": second["receiptHandle"], "result": {"ok": 1}}
    )
    assert acked.status_code == 200, acked.text
    view = acked.json()
    assert view["status"] == "COMPLETED"
    assert view["attempts"] == 2
    assert view["result"] == {"ok": 1}

    replay = await client.post(
        f"/jobs/{job_id}/ack", json={"receiptHandle": second["receiptHandle"], "result": {"ok": 2}}
    )
    assert replay.status_code == 200
    assert replay.json() == view, "a replayed ack must change nothing"


async def test_ack_between_expiry_and_reap_still_succeeds(
    client: httpx.AsyncClient, repository: JobRepository
) -> None:
    job_id = await submit(client)
    [job] = await claim(client, visibilityTimeout=1)
    await wait_past(repository, job["visibleAt"])

    acked = await client.post(f"/jobs/{job_id}/ack", json={"receiptHandle": job["receiptHandle"]})

    assert acked.status_code == 200
    assert await Reaper(repository, QueueMetrics(CollectorRegistry())).sweep() == 0


async def test_reaper_dead_letters_a_job_out_of_attempts(
    client: httpx.AsyncClient, repository: JobRepository
) -> None:
    job_id = await submit(client, maxAttempts=1)
    [job] = await claim(client, visibilityTimeout=1)
    await wait_past(repository, job["visibleAt"])

    assert await Reaper(repository, QueueMetrics(CollectorRegistry())).sweep() == 1

    view = (await client.get(f"/jobs/{job_id}")).json()
    assert view["status"] == "DEAD_LETTER"
    assert "lease expired" in view["lastError"]
    late = await client.post(f"/jobs/{job_id}/ack", json={"receiptHandle": job["receiptHandle"]})
    assert late.status_code == 409


async def test_fail_retries_with_backoff_then_dead_letters(client: httpx.AsyncClient) -> None:
    job_id = await submit(client, maxAttempts=2)
    [job] = await claim(client)

    failed = await client.post(
        f"/jobs/{job_id}/fail", json={"receiptHandle": job["receiptHandle"], "error": "boom"}
    )
    assert failed.status_code == 200
    view = failed.json()
    assert view["status"] == "SCHEDULED"
    assert view["visibleAt"] > view["updatedAt"]
    assert view["errors"][0]["error"] == "boom" and view["errors"][0]["attempt"] == 1

    replay = await client.post(
        f"/jobs/{job_id}/fail", json={"receiptHandle": job["receiptHandle"], "error": "boom"}
    )
    assert replay.status_code == 200 and replay.json() == view


async def test_non_retryable_fail_dead_letters_at_once(client: httpx.AsyncClient) -> None:
    job_id = await submit(client)
    [job] = await claim(client)

    failed = await client.post(
        f"/jobs/{job_id}/fail",
        json={
            "receiptHandle": job["receiptHandle"],
            "error": "bad \u0000 input",
            "retryable": False,
        },
    )

    assert failed.status_code == 200
    assert failed.json()["status"] == "DEAD_LETTER"
    assert failed.json()["lastError"] == "bad \ufffd input"
