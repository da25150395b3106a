"""Delivery guarantees on real PostgreSQL: fencing races, releases, backoff, cancel, retry,
redrive and retention."""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from common.contracts import JobStatus
from services.queue.app import create_app
from services.queue.background import Reaper
from services.queue.history import History
from services.queue.metrics import QueueMetrics
from services.queue.repository import FailEntry, JobRepository
from services.queue.retry import BACKOFF_CEILING_SQL, Backoff
from services.queue.settings import QueueSettings
from tests.conftest import serving
from tests.helpers import new_job


@pytest.fixture
async def client(clean_database: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = QueueSettings(
        database_url=clean_database, redis_url=redis_url, queue_reaper_interval=3600
    )
    async with serving(create_app(settings)) as client:
        yield client


async def submit(client: httpx.AsyncClient, **fields: Any) -> str:
    response = await client.post("/jobs", json={"taskType": "noop", "payload": {}, **fields})
    assert response.status_code == 202, response.text
    job_id: str = response.json()["jobId"]
    return job_id


async def claim_one(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any] | None:
    response = await client.post(
        "/jobs/next", json={"worker": "w", "queues": ["default"], **fields}
    )
    if response.status_code == 204:
        return None
    jobs: list[dict[str, Any]] = response.json()["jobs"]
    return jobs[0]


async def expire_leases(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE job SET visible_at = now() - interval '1 second'"
                " WHERE status = 'PROCESSING'"
            )
        )


async def test_a_job_released_on_every_shutdown_still_ends(client: httpx.AsyncClient) -> None:
    job_id = await submit(client, maxAttempts=2)
    claims = 0
    while (job := await claim_one(client)) is not None:
        claims += 1
        assert claims <= 20, "the job kept coming back"
        reply = await client.post(
            f"/jobs/{job_id}/heartbeat",
            json={"receiptHandle": job["receiptHandle"], "visibilityTimeout": 0},
        )
        assert reply.status_code == 200, reply.text

    view = (await client.get(f"/jobs/{job_id}")).json()
    assert view["status"] == "DEAD_LETTER"
    assert claims == 7 and view["releases"] == 7, "dead-lettered when releases exceed 3 x 2"
    assert "released too often" in view["lastError"]


async def test_a_release_records_why_in_errors_and_a_counter(client: httpx.AsyncClient) -> None:
    job_id = await submit(client)
    job = await claim_one(client)
    assert job is not None
    handle = job["receiptHandle"]
    refused = await client.post(
        f"/jobs/{job_id}/heartbeat",
        json={"receiptHandle": handle, "visibilityTimeout": 30, "reason": "shutdown"},
    )
    assert refused.status_code == 422, "a reason belongs to a release (visibilityTimeout 0)"
    assert refused.json()["errors"][0]["pointer"] == "/reason"

    released = await client.post(
        f"/jobs/{job_id}/heartbeat",
        json={"receiptHandle": handle, "visibilityTimeout": 0, "reason": "shutdown"},
    )
    assert released.status_code == 200 and released.json()["status"] == "PENDING"
    again = await claim_one(client)
    assert again is not None
    await client.post(
        f"/jobs/{job_id}/heartbeat",
        json={"receiptHandle": again["receiptHandle"], "visibilityTimeout": 0},
    )

    view = (await client.get(f"/jobs/{job_id}")).json()
    assert [(e["attempt"], e["error"]) for e in view["errors"]] == [
        (1, "released: shutdown"),
        (2, "released: requested"),
    ]
    assert view["lastError"] is None, "a release is not a failure"
    metrics = (await client.get("/metrics")).text
    assert 'jobq_released_total{queue="default",reason="shutdown"} 1.0' in metrics
    assert 'jobq_released_total{queue="default",reason="requested"} 1.0' in metrics


async def test_release_returns_the_job_at_once_without_consuming_an_attempt(
    client: httpx.AsyncClient,
) -> None:
    job_id = await submit(client, maxAttempts=1)
    first = await claim_one(client)
    assert first is not None
    released = await client.post(
        f"/jobs/{job_id}/heartbeat",
        json={"receiptHandle": first["receiptHandle"], "visibilityTimeout": 0},
    )
    assert released.json()["status"] == "PENDING"

    second = await claim_one(client)
    assert second is not None and second["attempts"] == 2
    done = await client.post(f"/jobs/{job_id}/ack", json={"receiptHandle": second["receiptHandle"]})
    assert done.json()["status"] == "COMPLETED", "a release must not use up maxAttempts"
    stale = await client.post(
        f"/jobs/{job_id}/heartbeat",
        json={"receiptHandle": first["receiptHandle"], "visibilityTimeout": 0},
    )
    assert stale.status_code == 409


async def test_slow_worker_ack_after_reclaim_is_refused_and_the_new_outcome_stands(
    client: httpx.AsyncClient, engine: AsyncEngine, repository: JobRepository
) -> None:
    job_id = await submit(client)
    slow = await claim_one(client)
    assert slow is not None
    await expire_leases(engine)
    await Reaper(repository, QueueMetrics(CollectorRegistry())).sweep()
    fast = await claim_one(client)
    assert fast is not None
    failed = await client.post(
        f"/jobs/{job_id}/fail", json={"receiptHandle": fast["receiptHandle"], "error": "new owner"}
    )
    assert failed.json()["status"] == "SCHEDULED"

    late = await client.post(f"/jobs/{job_id}/ack", json={"receiptHandle": slow["receiptHandle"]})

    assert late.status_code == 409
    view = (await client.get(f"/jobs/{job_id}")).json()
    assert view["status"] == "SCHEDULED" and view["lastError"] == "new owner"


async def test_reaper_racing_acks_never_requeues_an_acked_job(
    engine: AsyncEngine, repository: JobRepository
) -> None:
    reaper = Reaper(repository, QueueMetrics(CollectorRegistry()))
    outcomes = {"acked": 0, "reaped": 0}
    for _ in range(150):
        job = await repository.insert(new_job())
        assert job is not None
        [claimed] = await repository.claim(["default"], "w", 1, 30)
        await expire_leases(engine)

        acked, reaped = await asyncio.gather(
            repository.ack_many([(claimed.id, claimed.receipt_handle, None)]), reaper.sweep()
        )

        found = await repository.get(claimed.id)
        assert found is not None
        view = found[0]
        if acked:
            outcomes["acked"] += 1
            assert reaped == 0 and view.status is JobStatus.COMPLETED
        else:
            outcomes["reaped"] += 1
            assert reaped == 1 and view.status is JobStatus.PENDING
        await repository.claim(["default"], "cleanup", 10, 30)
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM job"))
    assert outcomes["acked"] + outcomes["reaped"] == 150


async def test_backoff_expression_stays_within_its_cap_for_every_attempt(
    clean_database: str,
) -> None:
    ceiling = BACKOFF_CEILING_SQL.format(
        attempt="attempt", max_delay="$2", base_delay="$3", multiplier="$4"
    )
    query = (
        f"SELECT min($1 * {ceiling}), max($1 * {ceiling}),"
        f" bool_and($1 * {ceiling} > 0) FROM generate_series(1, 10000) AS attempt"
    )
    connection = await asyncpg.connect(clean_database)
    try:
        for jitter in (1e-12, 0.001, 0.5, 1.0):
            for base, multiplier, cap in (
                (5.0, 2.0, 300.0),
                (0.1, 10.0, 43_200.0),
                (1.0, 1.0, 1.0),
            ):
                low, high, positive = await connection.fetchrow(
                    query, jitter, cap, base, multiplier
                )
                assert positive and 0 < low <= high <= cap * jitter
    finally:
        await connection.close()


async def test_two_hundred_jobs_failing_together_spread_their_retries(
    client: httpx.AsyncClient, repository: JobRepository
) -> None:
    for _ in range(200):
        await repository.insert(new_job())
    claimed = await repository.claim(["default"], "w", 100, 30)
    claimed += await repository.claim(["default"], "w", 100, 30)
    assert len(claimed) == 200

    due = []
    for job in claimed:
        reply = await client.post(
            f"/jobs/{job.id}/fail", json={"receiptHandle": str(job.receipt_handle), "error": "x"}
        )
        view = reply.json()
        assert view["status"] == "SCHEDULED"
        due.append((view["visibleAt"], view["updatedAt"]))
    from datetime import datetime

    delays = [
        (datetime.fromisoformat(v) - datetime.fromisoformat(u)).total_seconds() for v, u in due
    ]
    assert all(0 < d <= 5.0 for d in delays), "attempt 1 waits in (0, base]"
    assert statistics.pstdev(delays) > 0.8, "full jitter spreads the retries"
    assert len({round(d, 1) for d in delays}) > 30, "retries are not in lockstep"


async def test_fail_report_with_nul_and_lone_surrogate_is_recorded(
    client: httpx.AsyncClient,
) -> None:
    job_id = await submit(client)
    job = await claim_one(client)
    assert job is not None
    error = r"bad\u0000byte \ud800 and \\ud800 and \ud83d\ude00"
    raw = f'{{"receiptHandle": "{job["receiptHandle"]}", "error": "{error}"}}'.encode()

    reply = await client.post(
        f"/jobs/{job_id}/fail", content=raw, headers={"content-type": "application/json"}
    )

    assert reply.status_code == 200, reply.text
    view = reply.json()
    assert view["status"] == "SCHEDULED"
    assert view["lastError"] == "bad\ufffdbyte \ufffd and \\ud800 and \U0001f600"


async def test_huge_error_and_result_are_truncated_not_refused(client: httpx.AsyncClient) -> None:
    job_id = await submit(client)
    job = await claim_one(client)
    assert job is not None
    reply = await client.post(
        f"/jobs/{job_id}/fail",
        json={"receiptHandle": job["receiptHandle"], "error": "e" * 3_000_000},
    )
    assert reply.status_code == 200
    assert len(reply.json()["lastError"].encode()) <= 8 * 1024


@pytest.mark.parametrize("state", ["PENDING", "SCHEDULED", "PROCESSING", "COMPLETED"])
async def test_retry_of_a_live_or_completed_job_is_refused(
    client: httpx.AsyncClient, state: str
) -> None:
    job_id = await submit(client, delaySeconds=600 if state == "SCHEDULED" else 0)
    if state in ("PROCESSING", "COMPLETED"):
        job = await claim_one(client)
        assert job is not None
        if state == "COMPLETED":
            await client.post(f"/jobs/{job_id}/ack", json={"receiptHandle": job["receiptHandle"]})

    reply = await client.post(f"/jobs/{job_id}/retry")

    assert reply.status_code == 409
    assert reply.json()["type"] == "urn:jobq:problem:invalid-state"
    assert (await client.get(f"/jobs/{job_id}")).json()["status"] == state


async def test_dead_lettered_job_retried_runs_again(client: httpx.AsyncClient) -> None:
    job_id = await submit(client)
    job = await claim_one(client)
    assert job is not None
    await client.post(
        f"/jobs/{job_id}/fail",
        json={"receiptHandle": job["receiptHandle"], "error": "no", "retryable": False},
    )

    retried = await client.post(f"/jobs/{job_id}/retry")

    assert retried.status_code == 200
    assert retried.json()["status"] == "PENDING" and retried.json()["attempts"] == 0
    again = await claim_one(client)
    assert again is not None and again["id"] == job_id and again["attempts"] == 1
    done = await client.post(f"/jobs/{job_id}/ack", json={"receiptHandle": again["receiptHandle"]})
    assert done.json()["status"] == "COMPLETED"


async def test_cancel_waiting_and_running_jobs(client: httpx.AsyncClient) -> None:
    waiting = await submit(client, delaySeconds=600)
    cancelled = await client.post(f"/jobs/{waiting}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"
    assert (await client.post(f"/jobs/{waiting}/cancel")).status_code == 409

    running = await submit(client)
    job = await claim_one(client)
    assert job is not None
    requested = await client.post(f"/jobs/{running}/cancel")
    assert requested.json()["status"] == "PROCESSING" and requested.json()["cancelRequested"]
    beat = await client.post(
        f"/jobs/{running}/heartbeat",
        json={"receiptHandle": job["receiptHandle"], "visibilityTimeout": 30},
    )
    assert beat.json()["cancelRequested"] is True

    confirmed = await client.post(
        f"/jobs/{running}/cancelled", json={"receiptHandle": job["receiptHandle"]}
    )
    assert confirmed.status_code == 200 and confirmed.json()["status"] == "CANCELLED"
    retried = await client.post(f"/jobs/{running}/retry")
    assert retried.json()["status"] == "PENDING", "a cancelled job can be retried"


async def test_heartbeat_extends_from_now_and_caps_the_lease_at_12_hours(
    client: httpx.AsyncClient,
) -> None:
    job_id = await submit(client)
    job = await claim_one(client, visibilityTimeout=43_200)
    assert job is not None
    beat = await client.post(
        f"/jobs/{job_id}/heartbeat",
        json={"receiptHandle": job["receiptHandle"], "visibilityTimeout": 43_200},
    )
    view = (await client.get(f"/jobs/{job_id}")).json()
    from datetime import datetime, timedelta

    lease_end = datetime.fromisoformat(beat.json()["visibleAt"])
    assert lease_end == datetime.fromisoformat(view["claimedAt"]) + timedelta(hours=12)

    bad = await client.post(
        f"/jobs/{job_id}/heartbeat",
        json={"receiptHandle": str(uuid.uuid4()), "visibilityTimeout": 10},
    )
    assert bad.status_code == 409


async def test_redrive_moves_dead_letters_by_filter_and_limit(
    client: httpx.AsyncClient, repository: JobRepository
) -> None:
    async def dead(queue: str, task_type: str) -> None:
        await submit(client, queue=queue, taskType=task_type, maxAttempts=1)
        [job] = await repository.claim([queue], "w", 1, 30)
        entry = FailEntry(job.id, job.receipt_handle, "x", False, None, 1.0)
        await repository.fail_many([entry], Backoff(1, 2, 1))

    for queue, task in [("a", "t1"), ("a", "t1"), ("a", "t2"), ("b", "t1"), ("b", "t1")]:
        await dead(queue, task)

    assert (
        await client.post("/dead-letter/redrive", json={"queue": "a", "taskType": "t1"})
    ).json() == {"moved": 2}
    assert (await client.post("/dead-letter/redrive", json={"limit": 1})).json() == {"moved": 1}
    assert (await client.post("/dead-letter/redrive", json={})).json() == {"moved": 2}
    assert (await client.post("/dead-letter/redrive", json={"limit": 0})).status_code == 422


async def test_retention_deletes_only_old_finished_jobs(
    engine: AsyncEngine, repository: JobRepository
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO job (id, queue, task_type, payload, status, max_attempts, visible_at,"
                " finished_at) SELECT gen_random_uuid(), 'default', 'noop', '{}', s, 5, now(),"
                " now() - make_interval(days => d) FROM unnest("
                "ARRAY['COMPLETED','COMPLETED','CANCELLED','DEAD_LETTER','DEAD_LETTER'],"
                " ARRAY[8, 1, 8, 8, 15]) AS t(s, d)"
            )
        )
    live = await repository.insert(new_job())
    assert live is not None

    # Finished rows in `job` (as a release before the history leaves them) are swept into the
    # history; the three past retention fall outside every slot kept and are deleted from the
    # DEFAULT partitions.
    keeper = History(repository, 86400, 7 * 86400, 14 * 86400)
    first, second = await keeper.maintain(), await keeper.maintain()

    assert first.swept == 5 and second.default_deleted == 3
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM job"))).scalar_one() == 1
        left = (
            await conn.execute(text("SELECT status, count(*) FROM job_all GROUP BY status"))
        ).all()
    assert dict(left) == {"COMPLETED": 1, "DEAD_LETTER": 1, "PENDING": 1}  # type: ignore[arg-type]


async def test_batch_ack_fences_each_entry(client: httpx.AsyncClient) -> None:
    ids = [await submit(client) for _ in range(3)]
    reply = await client.post("/jobs/next", json={"worker": "w", "queues": ["default"], "max": 3})
    handles = {job["id"]: job["receiptHandle"] for job in reply.json()["jobs"]}
    entries = [
        {"id": ids[0], "receiptHandle": handles[ids[0]], "result": {"n": 0}},
        {"id": ids[1], "receiptHandle": str(uuid.uuid4())},
        {"id": str(uuid.uuid4()), "receiptHandle": str(uuid.uuid4())},
        {"id": ids[2], "receiptHandle": handles[ids[2]]},
    ]

    first = await client.post("/jobs/ack", json={"entries": entries})
    replay = await client.post("/jobs/ack", json={"entries": entries})

    assert [r["status"] for r in first.json()["results"]] == [200, 409, 404, 200]
    assert [r["status"] for r in replay.json()["results"]] == [200, 409, 404, 200]
    assert (await client.get(f"/jobs/{ids[0]}")).json()["result"] == {"n": 0}
    assert (await client.get(f"/jobs/{ids[1]}")).json()["status"] == "PROCESSING"
    repeated = await client.post("/jobs/ack", json={"entries": [entries[0], entries[0]]})
    assert repeated.status_code == 422
