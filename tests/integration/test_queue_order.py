"""Claim order on real PostgreSQL: a job returned to PENDING queues behind the work already
waiting (docs/architecture.md#claim), and no row, whatever its columns hold within their SQL
types, can make a transition fail for the rest of its queue."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from services.queue.background import Reaper, Scheduler
from services.queue.metrics import QueueMetrics
from services.queue.repository import ALL_COLUMNS, FailEntry, JobRepository
from services.queue.retry import Backoff
from tests.helpers import new_job


async def _insert(repository: JobRepository, count: int, **fields: object) -> list[uuid.UUID]:
    ids = []
    for _ in range(count):
        job = await repository.insert(new_job(**fields))  # type: ignore[arg-type]
        assert job is not None
        ids.append(job.id)
    return ids


async def _claim_all_one_at_a_time(repository: JobRepository) -> list[uuid.UUID]:
    order = []
    while jobs := await repository.claim(["default"], "w", 1, 30):
        order.append(jobs[0].id)
    return order


async def _dead_letter(repository: JobRepository, job_id: uuid.UUID) -> None:
    [job] = await repository.claim(["default"], "w", 1, 30)
    assert job.id == job_id
    entry = FailEntry(job.id, job.receipt_handle, "boom", False, None, 1.0)
    [settled] = await repository.fail_many([entry], Backoff(1, 2, 1))
    assert settled.status == "DEAD_LETTER"


async def test_a_retried_dead_letter_queues_behind_newer_waiting_jobs(
    repository: JobRepository,
) -> None:
    [old] = await _insert(repository, 1)
    await _dead_letter(repository, old)
    newer = await _insert(repository, 3)

    assert await repository.retry(old) is not None

    assert await _claim_all_one_at_a_time(repository) == [*newer, old]


async def test_a_redrive_of_old_dead_letters_runs_behind_fresh_work(
    repository: JobRepository,
) -> None:
    old = await _insert(repository, 2)
    for job_id in old:
        await _dead_letter(repository, job_id)
    fresh = await _insert(repository, 2)

    assert await repository.redrive(None, None, 10) == 2

    assert await _claim_all_one_at_a_time(repository) == [*fresh, *old]


async def test_released_and_expired_jobs_queue_behind_waiting_work(
    repository: JobRepository, clean_database: str
) -> None:
    released, expired = await _insert(repository, 2)
    claimed = {job.id: job for job in await repository.claim(["default"], "w", 2, 30)}
    waiting = await _insert(repository, 2)

    await repository.heartbeat_many([(released, claimed[released].receipt_handle, 0, "shutdown")])
    connection = await asyncpg.connect(clean_database)
    try:
        await connection.execute(
            "UPDATE job SET visible_at = now() - interval '1 second' WHERE id = $1", expired
        )
    finally:
        await connection.close()
    assert await Reaper(repository, QueueMetrics(CollectorRegistry())).sweep() == 1

    assert await _claim_all_one_at_a_time(repository) == [*waiting, released, expired]


async def test_a_promoted_job_queues_by_the_time_it_came_due(
    repository: JobRepository, clean_database: str
) -> None:
    [due] = await _insert(repository, 1, delay=3600)
    before, after = await _insert(repository, 2)
    connection = await asyncpg.connect(clean_database)
    try:
        # It came due between the two others became ready.
        await connection.execute(
            "UPDATE job SET visible_at = (SELECT ready_at FROM job WHERE id = $2)"
            " + interval '1 microsecond' WHERE id = $1",
            due,
            before,
        )
        await connection.execute(
            "UPDATE job SET ready_at = ready_at + interval '1 second' WHERE id = $1", after
        )
    finally:
        await connection.close()
    assert await Scheduler(repository).promote() == 1

    assert await _claim_all_one_at_a_time(repository) == [before, due, after]


async def test_priority_still_comes_first(repository: JobRepository) -> None:
    [old] = await _insert(repository, 1, priority=5)
    await _dead_letter(repository, old)
    [low] = await _insert(repository, 1, priority=0)
    assert await repository.retry(old) is not None

    assert await _claim_all_one_at_a_time(repository) == [old, low]


async def _back_from_history(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    """Move the jobs of `ids` a settle finished (dead-lettered: out of attempts or released
    too often) back from the history to `job`, by hand, for the next transition."""
    columns = ", ".join(ALL_COLUMNS)
    await connection.execute(
        f"WITH back AS (DELETE FROM job_history WHERE id = ANY($1) RETURNING {columns})"
        f" INSERT INTO job ({columns}) SELECT {columns} FROM back",
        ids,
    )


EXTREMES = {
    "attempts": "2147483647",
    "releases": "2147483647",
    "max_attempts": "2147483647",
    "priority": "2147483647",
    "timeout_seconds": "2147483647",
    "claimed_at": "'294276-12-31 00:00:00+00'",
    "ready_at": "'-infinity'",
}


@pytest.mark.parametrize("column", sorted(EXTREMES))
async def test_no_row_can_jam_its_queue(
    repository: JobRepository, clean_database: str, column: str
) -> None:
    """A row holding an extreme value (set by hand, a bug or an old release) is claimed,
    heartbeated, failed, released and reaped like any other, and the jobs behind it too."""
    [odd, *others] = await _insert(repository, 3)
    connection = await asyncpg.connect(clean_database)
    try:
        await connection.execute(f"UPDATE job SET {column} = {EXTREMES[column]} WHERE id = $1", odd)
        # Every transition, twice round: claim, extend, release, claim, fail, and expiry.
        claimed = await repository.claim(["default"], "w", 3, 30)
        assert {job.id for job in claimed} == {odd, *others}
        entries = [(job.id, job.receipt_handle, 30, "requested") for job in claimed]
        assert len(await repository.heartbeat_many(entries)) == 3
        released = [(job.id, job.receipt_handle, 0, "shutdown") for job in claimed]
        assert len(await repository.heartbeat_many(released)) == 3
        await _back_from_history(connection, [odd, *others])
        await connection.execute(
            "UPDATE job SET status = 'PENDING' WHERE id = ANY($1)", [odd, *others]
        )
        claimed = await repository.claim(["default"], "w", 3, 30)
        assert len(claimed) == 3
        fails = [FailEntry(job.id, job.receipt_handle, "x", True, None, 1.0) for job in claimed]
        assert len(await repository.fail_many(fails, Backoff(5, 2, 300))) == 3
        await _back_from_history(connection, [odd, *others])
        await connection.execute(
            "UPDATE job SET status = 'PROCESSING', visible_at = now() - interval '1 second'"
            " WHERE id = ANY($1)",
            [odd, *others],
        )
        assert await Reaper(repository, QueueMetrics(CollectorRegistry())).sweep() == 3
    finally:
        await connection.close()
