"""The rollout of the history on a live system (expand/contract): the migration adds the
history without moving a row; the previous release keeps working on `job`; the new release's
background loop moves a million finished rows in bounded batches while it serves, and no
job is unreadable or seen twice meanwhile."""

from __future__ import annotations

import asyncio
import os

import asyncpg
import httpx

from services.queue.app import create_app
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

# How the previous release completes a job: in place, leaving it in `job`.
_OLD_ACK = """
UPDATE job SET status = 'COMPLETED', finished_at = now(), updated_at = now(), locked_by = NULL
WHERE id = (SELECT id FROM job WHERE status = 'PENDING' ORDER BY id LIMIT 1) RETURNING id
"""


async def test_a_million_finished_rows_move_to_the_history_while_the_services_run(
    postgres_base: str, fresh_database_name: str, redis_url: str
) -> None:
    name = fresh_database_name
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
            probe = await connection.fetchval(
                "SELECT id FROM job WHERE status = 'COMPLETED' ORDER BY finished_at LIMIT 1"
            )
            old_dead = await connection.fetchval(
                "SELECT id FROM job WHERE status = 'DEAD_LETTER' ORDER BY id LIMIT 1"
            )

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
                reads, served = await asyncio.gather(
                    _read_while_moving(client, connection, probe),
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

            assert reads > 0 and served == 50
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
    client: httpx.AsyncClient, connection: asyncpg.Connection, probe: object
) -> int:
    """Read one old finished job over HTTP until every finished row left `job`: every read
    finds it (never a 404 while it moves). Returns how many reads were made."""
    for reads in range(1, 6001):
        reply = await client.get(f"/jobs/{probe}")
        assert reply.status_code == 200, reply.text
        assert reply.json()["status"] == "COMPLETED"
        left = await connection.fetchval(
            "SELECT count(*) FROM (SELECT FROM job WHERE status = 'COMPLETED' LIMIT 1) AS one"
        )
        if not left:
            return reads
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
