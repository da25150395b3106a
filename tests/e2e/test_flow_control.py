"""Pause and resume through the producer with real worker processes busy (issue 18): no claim
after the pause returned, running jobs finish, claims resume within a poll interval."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime

import asyncpg
import httpx
import pytest

from infra.stack import LocalStack
from tests.e2e.conftest import E2E_SETTINGS

JOBS = 200
SLEEP_MS = 200


@pytest.fixture(scope="module")
async def busy_stack(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalStack]:
    """Queue service, producer and four worker replicas of two slots each."""
    stack = LocalStack(
        database_url,
        redis_url,
        tmp_path_factory.mktemp("flow"),
        workers=4,
        smtp_enabled=False,
        environment={**E2E_SETTINGS, "WORKER_CONCURRENCY": "2"},
    )
    await stack.start()
    try:
        yield stack
    finally:
        stack.stop()


async def counts(connection: asyncpg.Connection) -> dict[str, int]:
    rows = await connection.fetch("SELECT status, count(*) AS n FROM job_all GROUP BY status")
    return {row["status"]: row["n"] for row in rows}


async def wait_for(
    connection: asyncpg.Connection,
    accept: Callable[[dict[str, int]], bool],
    within: float,
    what: str,
) -> dict[str, int]:
    """Sample the job counts every 10 ms until `accept` takes them; returns them."""
    deadline = time.monotonic() + within
    while True:
        seen = await counts(connection)
        if accept(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within}s: {seen}")
        await asyncio.sleep(0.01)


async def database_now(connection: asyncpg.Connection) -> datetime:
    now: datetime = await connection.fetchval("SELECT clock_timestamp()")
    return now


async def test_pause_with_busy_workers_stops_claims_and_resume_restarts_them(
    busy_stack: LocalStack,
) -> None:
    connection = await asyncpg.connect(busy_stack.database_url)
    try:
        await connection.execute("TRUNCATE job, job_history, queue_control, rate_bucket")
        async with httpx.AsyncClient(base_url=busy_stack.producer, timeout=10) as producer:
            batch = [{"taskType": "sleep", "payload": {"ms": SLEEP_MS}} for _ in range(JOBS // 2)]
            for _ in range(2):
                reply = await producer.post("/jobs/batch", json={"jobs": batch})
                assert reply.status_code == 200, reply.text
            await wait_for(
                connection, lambda c: c.get("PROCESSING", 0) >= 6, 30, "the workers busy"
            )

            paused = await producer.post("/queues/default/pause")
            assert paused.status_code == 200, paused.text
            assert paused.json()["lastChange"]["by"] == "open-access"
            returned = await database_now(connection)

            # The jobs running at the pause finish and complete; nothing else starts.
            settled = await wait_for(
                connection, lambda c: c.get("PROCESSING", 0) == 0, 15, "running jobs finished"
            )
            await asyncio.sleep(1.5)  # six poll intervals, and the workers' long polls
            after = await counts(connection)
            assert after == settled, "nothing was claimed while paused"
            assert set(after) <= {"PENDING", "COMPLETED"}, after
            assert after.get("PENDING", 0) > 0 and after.get("COMPLETED", 0) > 0
            late = await connection.fetchval(
                "SELECT count(*) FROM job_all WHERE claimed_at > $1", returned
            )
            assert late == 0, "a job was claimed after the pause returned"

            # Read before the resume is sent: the woken claims may begin before its reply
            # arrives here.
            resumed_at = await database_now(connection)
            resumed = await producer.post("/queues/default/resume")
            assert resumed.status_code == 200, resumed.text
            await wait_for(
                connection, lambda c: c.get("PENDING", 0) < after["PENDING"], 5, "claims again"
            )
            first = await connection.fetchval(
                "SELECT min(claimed_at) FROM job_all WHERE claimed_at > $1", resumed_at
            )
            # Woken by the resume's NOTIFY: within the resume's own round trip plus
            # QUEUE_POLL_INTERVAL (250 ms), far from the workers' 2 s long-poll timeout.
            assert first is not None
            assert (first - resumed_at).total_seconds() < 0.75
            await wait_for(
                connection, lambda c: c.get("COMPLETED", 0) == JOBS, 60, "every job completed"
            )
    finally:
        await connection.close()
