"""The rollout of the history on a live system (expand/contract): the migration adds the
history without moving a row; the previous release keeps working on `job`; the new release's
background loop moves a million finished rows in bounded batches while it serves, and no
job is unreadable or seen twice meanwhile."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from services.queue import history
from services.queue.app import create_app
from services.queue.repository import SWEEP_STATEMENT, JobRepository
from services.queue.settings import QueueSettings
from tests.conftest import _admin, migrate, serving

ROWS = int(os.environ.get("JOBQ_ROLLOUT_ROWS", "1000000"))
"""Finished rows the previous release left in `job` (1,000,000 by default)."""

PREVIOUS_HEAD = "6c2b8f4d9e13"
"""The last revision before the history (a7f3c91e5d42)."""

_FILL = """
INSERT INTO job (id, tenant, queue, task_type, payload, status, max_attempts, attempts,
                 visible_at, ready_at, created_at, updated_at, finished_at, idempotency_key,
                 request_hash)
SELECT gen_random_uuid(), 'default', 'default', 'noop', '{"n": 1}',
       CASE WHEN i % 50 = 0 THEN 'DEAD_LETTER' WHEN i % 97 = 0 THEN 'CANCELLED'
            ELSE 'COMPLETED' END,
       5, 1, now(), now(), now() - make_interval(secs => i % 500000 + 10),
       now() - make_interval(secs => i % 500000 + 5), now() - make_interval(secs => i % 500000),
       CASE WHEN i = 1 THEN 'old-key' END, CASE WHEN i = 1 THEN repeat('0', 64) END
FROM generate_series(1, $1) AS i
"""

# Probes spread over the sweep's order (oldest `finished_at` first, by ix_job_retention): the
# first and second rows (the first batch), a quarter, the middle, three quarters, and the
# last rows but the dead letter set aside (the last batch; OFFSET counts from 0).
_PROBE = """
SELECT id, status FROM job WHERE status IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER')
  AND id <> $2 ORDER BY finished_at OFFSET $1 LIMIT 1
"""

SLOWEST_BATCH = 15.0
"""Seconds one sweep statement of at most `history.BATCH` rows may take: generous (such a
statement takes milliseconds), it says that the sweep is a series of short transactions,
never one long one over the million rows."""

# How the previous release completes a job: in place, leaving it in `job`.
_OLD_ACK = """
UPDATE job SET status = 'COMPLETED', finished_at = now(), updated_at = now(), locked_by = NULL
WHERE id = (SELECT id FROM job WHERE status = 'PENDING' ORDER BY id LIMIT 1) RETURNING id
"""


# About 60-75 s here (the fill, then 2,001 sweep statements), past half the suite's 120 s
# `timeout`: room for a slower machine, beyond the reader's own 10-minute bound.
@pytest.mark.timeout(900)
async def test_a_million_finished_rows_move_to_the_history_while_the_services_run(
    postgres_base: str, fresh_database_name: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Expand: the migration adds the history and moves nothing; the previous release keeps
    completing jobs in place. The new release's loop then sweeps the million finished rows
    (plus that one) into the history in statements of at most `history.BATCH` rows, each
    short, while it serves 50 jobs end to end; finished jobs spread over the whole sweep
    (its first, middle and last batches) are read over HTTP throughout, never a 404 and
    always with their status; afterwards no finished row is left in `job` and every job is
    in `job_all` exactly once. A dead letter the previous release left comes back as live
    work, and its idempotency key still holds."""
    name = fresh_database_name
    sweeps: list[tuple[int, int, float]] = []
    fetch = JobRepository.fetch

    async def timed(self: JobRepository, statement: str, *args: Any) -> list[asyncpg.Record]:
        # Each sweep statement of the app's loop: its limit, the rows it moved, its time.
        started = time.monotonic()
        rows = await fetch(self, statement, *args)
        if statement is SWEEP_STATEMENT:
            sweeps.append((args[0], int(rows[0]["moved"]), time.monotonic() - started))
        return rows

    monkeypatch.setattr(JobRepository, "fetch", timed)
    url = f"{postgres_base}/{name}"
    await _admin(
        postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'
    )
    try:
        migrate(url, "upgrade", PREVIOUS_HEAD)
        connection = await asyncpg.connect(url)
        try:
            await connection.execute(_FILL, ROWS)
            await connection.execute(
                "INSERT INTO job (id, queue, task_type, payload, status, max_attempts, visible_at)"
                " SELECT gen_random_uuid(), 'default', 'noop', '{}', 'PENDING', 5, now()"
                " FROM generate_series(1, 100)"
            )
            await connection.execute("ANALYZE job")
            old_dead = await connection.fetchval(
                "SELECT id FROM job WHERE status = 'DEAD_LETTER' ORDER BY id LIMIT 1"
            )
            probes: dict[uuid.UUID, str] = {}
            for offset in (0, 1, ROWS // 4, ROWS // 2, 3 * ROWS // 4, ROWS - 3, ROWS - 2):
                row = await connection.fetchrow(_PROBE, offset, old_dead)
                probes[row["id"]] = row["status"]
            assert len(probes) == 7 and len(set(probes.values())) > 1, probes
            late = [
                row["id"]
                for row in await connection.fetch(
                    "SELECT id FROM job WHERE id = ANY($1) ORDER BY finished_at DESC LIMIT 4",
                    list(probes),
                )
            ]

            # Expand: the migration adds the history and moves nothing.
            migrate(url, "upgrade", "head")
            assert await connection.fetchval("SELECT count(*) FROM job_history") == 0
            assert (
                await connection.fetchval("SELECT count(*) FROM job WHERE status <> 'PENDING'")
                == ROWS
            )
            # The previous release keeps completing jobs in place on the new schema.
            assert await connection.fetchval(_OLD_ACK) is not None

            settings = QueueSettings(
                database_url=url, redis_url=redis_url, queue_retention_interval=0.5
            )
            async with serving(create_app(settings)) as client:
                read_live, served = await asyncio.gather(
                    _read_while_moving(client, connection, probes),
                    _serve_while_moving(client, connection),
                )
                # A dead letter the previous release left comes back as live work.
                retried = await client.post(f"/jobs/{old_dead}/retry")
                assert retried.status_code == 200, retried.text
                # Its key still blocks: a different request under it is a conflict.
                conflict = await client.post(
                    "/jobs",
                    json={"taskType": "noop", "payload": {}, "idempotencyKey": "old-key"},
                )
                assert conflict.status_code == 409, conflict.text

            assert served == 50
            # The reads covered the sweep from its middle to its end: the four probes of the
            # second half were read (200, their status) while still in `job`, before their
            # batch moved them (the first batch may go before the first read).
            if ROWS >= 100_000:  # a smaller run (JOBQ_ROLLOUT_ROWS) may sweep before a read
                assert set(late) <= read_live, (late, read_live)
            # Bounded batches: every sweep statement moved at most BATCH rows, and together
            # they moved every finished row the previous release left (the million and the
            # one it completed after the migration), each in a short statement.
            assert sweeps, "the loop never swept"
            assert {limit for limit, _, _ in sweeps} == {history.BATCH}
            assert max(moved for _, moved, _ in sweeps) <= history.BATCH
            assert sum(moved for _, moved, _ in sweeps) == ROWS + 1
            assert len(sweeps) >= (ROWS + 1) / history.BATCH
            seconds = [taken for _, moved, taken in sweeps if moved]
            slowest = max(seconds)
            assert slowest < SLOWEST_BATCH, (slowest, statistics.median(seconds))
            finished_left = await connection.fetchval(
                "SELECT count(*) FROM job WHERE status <> ALL('{PENDING,SCHEDULED,PROCESSING}')"
            )
            assert finished_left == 0
            total = ROWS + 100 + 50
            assert await connection.fetchval("SELECT count(*) FROM job_all") == total
            assert await connection.fetchval("SELECT count(DISTINCT id) FROM job_all") == total
        finally:
            await connection.close()
    finally:
        await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _read_while_moving(
    client: httpx.AsyncClient, connection: asyncpg.Connection, probes: dict[uuid.UUID, str]
) -> set[uuid.UUID]:
    """Read the `probes` (finished jobs: id → status) over HTTP until every finished row
    left `job`: every read finds each with its status (never a 404 while it moves). Returns
    the probes read while still in `job` (found there after the read: the read came before
    their move)."""
    read_live: set[uuid.UUID] = set()
    for _ in range(6000):
        for probe, status in probes.items():
            reply = await client.get(f"/jobs/{probe}")
            assert reply.status_code == 200, reply.text
            assert reply.json()["status"] == status, reply.text
        still = await connection.fetch("SELECT id FROM job WHERE id = ANY($1)", list(probes))
        read_live |= {row["id"] for row in still}
        left = await connection.fetchval(
            "SELECT count(*) FROM (SELECT FROM job"
            " WHERE status IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER') LIMIT 1) AS one"
        )
        if not left:
            return read_live
        await asyncio.sleep(0.1)
    raise AssertionError("the finished rows were not moved within 10 minutes")


async def _serve_while_moving(client: httpx.AsyncClient, connection: asyncpg.Connection) -> int:
    """Submit, claim and ack 50 jobs through the new release meanwhile; how many acked."""
    ids = []
    for n in range(50):
        reply = await client.post(
            "/jobs", json={"taskType": "noop", "payload": {"n": n}, "queue": "new"}
        )
        assert reply.status_code == 202, reply.text
        ids.append(reply.json()["jobId"])
    acked = 0
    while acked < 50:
        reply = await client.post(
            "/jobs/next", json={"worker": "w", "queues": ["new"], "max": 10, "waitSeconds": 1}
        )
        if reply.status_code == 204:
            continue
        entries = [
            {"id": job["id"], "receiptHandle": job["receiptHandle"]} for job in reply.json()["jobs"]
        ]
        result = await client.post("/jobs/ack", json={"entries": entries})
        assert result.status_code == 200, result.text
        acked += len(entries)
    return acked
