"""Waiting for a job's outcome: `GET /jobs/{id}?waitSeconds=N` on both services, woken by the
`jobq_settled` notification across replicas, and `wait()` in the client library."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from jobq.client import AsyncClient, Client
from jobq.errors import InvalidInput, JobNotFound
from services.queue.settings import plain_database_url
from tests.conftest import guarded_services

WAITERS = 500
ACME, GLOBEX = "acme-key-0123456789abcdef", "globex-key-0123456789abcdef"
KEYS = f"submit:acme:{ACME},submit:globex:{GLOBEX}"


async def _awaited(database_url: str) -> int:
    """How many jobs a waiter flagged."""
    connection = await asyncpg.connect(plain_database_url(database_url))
    try:
        count: int = await connection.fetchval("SELECT count(*) FROM job WHERE awaited")
        return count
    finally:
        await connection.close()


async def _until_awaited(database_url: str, count: int) -> None:
    """Until `count` jobs are flagged (every waiter started waiting); no timing asserted."""
    for _ in range(600):
        if await _awaited(database_url) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"only {await _awaited(database_url)} of {count} waiters started")


async def _claim_all(queue: httpx.AsyncClient, count: int) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    while len(jobs) < count:
        reply = await queue.post(
            "/jobs/next",
            json={"worker": "test-worker", "queues": ["default"], "max": 100, "waitSeconds": 1},
        )
        assert reply.status_code == 200, reply.text
        jobs.extend(reply.json()["jobs"])
    return jobs


async def test_many_waiters_on_two_replicas_all_get_their_jobs_outcome(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient], clean_database: str
) -> None:
    first, second = replicas
    batch = [{"taskType": "noop", "payload": {"n": i}} for i in range(WAITERS)]
    reply = await first.post("/jobs/batch", json={"jobs": batch})
    ids = [entry["jobId"] for entry in reply.json()["results"]]
    assert len(ids) == WAITERS

    limits = httpx.Limits(max_connections=WAITERS)
    async with (
        httpx.AsyncClient(base_url=first.base_url, limits=limits, timeout=60) as one,
        httpx.AsyncClient(base_url=second.base_url, limits=limits, timeout=60) as two,
    ):
        waiters = [
            asyncio.create_task((one if i % 2 else two).get(f"/jobs/{job_id}?waitSeconds=20"))
            for i, job_id in enumerate(ids)
        ]
        await _until_awaited(clean_database, WAITERS)
        assert not any(waiter.done() for waiter in waiters)

        # A tenth is cancelled while waiting, the rest claimed: a tenth of those fails for
        # good (dead-lettered), the others complete, through either replica.
        cancelled = set(ids[: WAITERS // 10])
        for job_id in cancelled:
            assert (await second.post(f"/jobs/{job_id}/cancel")).status_code == 200
        claimed = await _claim_all(first, WAITERS - len(cancelled))
        dead = {job["id"] for job in claimed[: len(claimed) // 10]}
        fails = [
            {"id": j["id"], "receiptHandle": j["receiptHandle"], "error": "no", "retryable": False}
            for j in claimed
            if j["id"] in dead
        ]
        assert (await second.post("/jobs/fail", json={"entries": fails})).status_code == 200
        acks = [
            {"id": j["id"], "receiptHandle": j["receiptHandle"], "result": {"ok": j["id"]}}
            for j in claimed
            if j["id"] not in dead
        ]
        for start in range(0, len(acks), 100):
            entries = acks[start : start + 100]
            replica = first if start % 200 else second
            assert (await replica.post("/jobs/ack", json={"entries": entries})).status_code == 200

        answers = await asyncio.gather(*waiters)

    expected = {
        job_id: "CANCELLED"
        if job_id in cancelled
        else "DEAD_LETTER"
        if job_id in dead
        else "COMPLETED"
        for job_id in ids
    }
    for job_id, answer in zip(ids, answers, strict=True):
        assert answer.status_code == 200
        view = answer.json()
        assert view["id"] == job_id and view["status"] == expected[job_id]
        if view["status"] == "COMPLETED":
            assert view["result"] == {"ok": job_id}


async def test_a_wait_answers_with_the_job_as_it_is_when_the_time_is_up(
    door: httpx.AsyncClient,
) -> None:
    job_id = (await door.post("/jobs", json={"taskType": "noop", "payload": {}})).json()["jobId"]
    answer = await door.get(f"/jobs/{job_id}", params={"waitSeconds": "0.3"})
    assert answer.status_code == 200 and answer.json()["status"] == "PENDING"
    cancelled = await door.post(f"/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200
    # A finished job is answered at once, whatever the wait asked for.
    answer = await door.get(f"/jobs/{job_id}", params={"waitSeconds": "20"})
    assert answer.json()["status"] == "CANCELLED"


@pytest.mark.parametrize("bad", ["21", "-1", "nan", "soon", "1e9"])
async def test_a_bad_wait_is_refused_with_problem_details(
    door: httpx.AsyncClient, bad: str
) -> None:
    answer = await door.get(f"/jobs/{uuid.uuid4()}", params={"waitSeconds": bad})
    assert answer.status_code == 422
    assert answer.headers["content-type"].startswith("application/problem+json")


async def test_waiting_on_a_missing_job_is_a_404(door: httpx.AsyncClient) -> None:
    answer = await door.get(f"/jobs/{uuid.uuid4()}", params={"waitSeconds": "5"})
    assert answer.status_code == 404


@pytest.fixture
async def producer(
    clean_database: str, redis_url: str
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """A producer (its base URL) with two tenants' keys, and the queue service's client."""
    async with guarded_services(clean_database, redis_url, KEYS) as (front, queue):
        from tests.conftest import INTERNAL_TOKEN

        queue.headers["Authorization"] = f"Bearer {INTERNAL_TOKEN}"
        yield str(front.base_url), queue


async def test_client_wait_returns_the_outcome_and_keeps_tenants_apart(
    producer: tuple[str, httpx.AsyncClient],
) -> None:
    url, queue = producer
    async with AsyncClient(url, api_key=ACME) as acme:
        job = await acme.submit("noop", {"a": 1})
        waiting = asyncio.create_task(acme.wait(job.job_id, timeout=30))
        [claimed] = await _claim_all(queue, 1)
        ack = {"receiptHandle": claimed["receiptHandle"], "result": {"done": True}}
        assert (await queue.post(f"/jobs/{claimed['id']}/ack", json=ack)).status_code == 200
        view = await waiting
        assert view.status == "COMPLETED" and view.result == {"done": True}

        with pytest.raises(InvalidInput):
            await acme.wait(job.job_id, timeout=-1)

        other = await acme.submit("noop", {"a": 2})
    await asyncio.to_thread(_sync_waits, url, other.job_id)


def _sync_waits(url: str, job_id: uuid.UUID) -> None:
    """`Client.wait`, in a thread (the services run on the test's event loop)."""
    with Client(url, api_key=GLOBEX) as globex, pytest.raises(JobNotFound):
        # Another tenant's job is a 404, as for any read.
        globex.wait(job_id, timeout=1)
    with Client(url, api_key=ACME) as acme:
        assert acme.wait(job_id, timeout=0.3).status == "PENDING"
