"""The claim against real PostgreSQL: SKIP LOCKED under concurrency, ordering, the plan."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.queue.repository import JobRepository
from tests.helpers import new_job


async def test_eight_concurrent_claimers_share_200_jobs_without_duplicates(
    repository: JobRepository,
) -> None:
    created = {(await repository.insert(new_job())).id for _ in range(200)}  # type: ignore[union-attr]
    start = asyncio.Event()

    async def claimer(name: str) -> list[uuid.UUID]:
        received: list[uuid.UUID] = []
        await start.wait()
        while True:
            jobs = await repository.claim(["default"], name, 3, 30)
            if not jobs:
                return received
            received.extend(job.id for job in jobs)

    tasks = [asyncio.create_task(claimer(f"claimer-{i}")) for i in range(8)]
    start.set()
    results = await asyncio.gather(*tasks)
    everything = [job_id for received in results for job_id in received]

    assert len(everything) == len(set(everything)), "a job was handed to two claimers"
    assert set(everything) == created
    assert sum(1 for received in results if received) > 1, "claims did not run concurrently"


async def test_claim_orders_by_priority_then_submission(repository: JobRepository) -> None:
    low_first = await repository.insert(new_job(priority=0))
    high = await repository.insert(new_job(priority=10))
    low_second = await repository.insert(new_job(priority=0))
    other_queue = await repository.insert(new_job(queue="other", priority=100))
    assert low_first and high and low_second and other_queue

    jobs = await repository.claim(["default"], "w", 10, 30)

    assert [job.id for job in jobs] == [high.id, low_first.id, low_second.id]
    assert all(job.attempts == 1 for job in jobs)
    assert len({job.receipt_handle for job in jobs}) == 3


async def test_delayed_job_is_not_claimable_until_promoted(repository: JobRepository) -> None:
    job = await repository.insert(new_job(delay=3600))
    assert job is not None and job.status == "SCHEDULED"

    assert await repository.claim(["default"], "w", 10, 30) == []
    assert await repository.promote_due() == {}


async def test_claim_uses_the_partial_claim_index(
    engine: AsyncEngine, repository: JobRepository
) -> None:
    for _ in range(50):
        await repository.insert(new_job())
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO job (id, queue, task_type, payload, status, max_attempts, visible_at,"
                " finished_at) SELECT gen_random_uuid(), 'default', 'noop', '{}', 'COMPLETED', 5,"
                " now(), now() FROM generate_series(1, 20000)"
            )
        )
        await conn.execute(text("ANALYZE job"))
        plan = (
            (
                await conn.execute(
                    text(
                        "EXPLAIN SELECT id FROM job WHERE status = 'PENDING' AND queue = ANY(:q)"
                        " ORDER BY priority DESC, id LIMIT 10 FOR UPDATE SKIP LOCKED"
                    ),
                    {"q": ["default"]},
                )
            )
            .scalars()
            .all()
        )
    plan_text = "\n".join(plan)
    assert "ix_job_claim" in plan_text, plan_text
    assert "Seq Scan" not in plan_text, plan_text
