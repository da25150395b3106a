"""Idempotency keys across the rollout of their table (migration c5e2b7d91f04), and their
removal without bloat.

The release before `idempotency_key` writes a key only into `job` (its unique index
`uq_job_tenant_idempotency_key` makes it unique); c5e2b7d91f04 copied the keys once. The
trigger `job_idempotency_key_held` (migration f2a9c4e7b315) copies every key such a release
inserts afterwards, so once the job leaves `job` (settled into the history by the new
release, or swept there) its key still blocks: a replay or a `409`, never a second job.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import asyncpg
import pytest

from benchmark.database import admin_execute
from common.contracts import DEFAULT_MAX_ATTEMPTS
from common.drivers import executor_for
from common.enqueue import ENQUEUE_ASYNCPG, Submitted, encode_rows, insert_jobs, job_row
from common.errors import IdempotencyConflict
from common.ids import new_job_id
from jobq.request import build_request
from services.queue.app import create_app
from services.queue.history import History
from services.queue.repository import JobRepository, archive, create_pool, revive
from services.queue.settings import QueueSettings
from tests.conftest import migrate, serving

PREVIOUS_HEAD = "a7f3c91e5d42"
"""The last revision before `idempotency_key` (c5e2b7d91f04): the previous release's schema."""

PREVIOUS_ENQUEUE = """
WITH incoming AS (
    SELECT * FROM jsonb_to_recordset(CAST(CAST($1 AS text) AS jsonb)) AS j(
        id uuid, queue text, task_type text, payload jsonb, priority int, delay float8,
        max_attempts int, timeout_seconds int, idempotency_key text, request_hash text,
        tenant text, trace_context jsonb)
), inserted AS (
    INSERT INTO job (id, tenant, queue, task_type, payload, status, priority, max_attempts,
                     timeout_seconds, visible_at, ready_at, idempotency_key, request_hash,
                     created_at, updated_at, trace_context)
    SELECT id, COALESCE(tenant, 'default'), queue, task_type, payload,
           CASE WHEN delay > 0 THEN 'SCHEDULED' ELSE 'PENDING' END,
           priority, max_attempts, timeout_seconds,
           statement_timestamp() + make_interval(secs => delay),
           statement_timestamp() + make_interval(secs => delay),
           idempotency_key, request_hash, statement_timestamp(), statement_timestamp(),
           trace_context
    FROM incoming
    WHERE NOT EXISTS (SELECT FROM job_history AS h WHERE h.id = incoming.id)
      AND (incoming.idempotency_key IS NULL
           OR NOT EXISTS (SELECT FROM job_history AS h
                          WHERE h.tenant = COALESCE(incoming.tenant, 'default')
                            AND h.idempotency_key = incoming.idempotency_key))
    ORDER BY tenant, idempotency_key, id
    ON CONFLICT DO NOTHING
    RETURNING id, queue, task_type, status
), woken AS (
    SELECT pg_notify('jobq_ready', queue || ':' || count(*)) FROM inserted
    WHERE status = 'PENDING' GROUP BY queue
)
SELECT id, queue, task_type, status, (SELECT count(*) FROM woken) AS notified FROM inserted
"""
"""The previous release's enqueue statement (common/enqueue.py before c5e2b7d91f04), frozen:
it writes the key into `job` only."""

# How the previous release completes a job: in place, leaving it in `job` for the sweep.
_PREVIOUS_COMPLETE = """
UPDATE job SET status = 'COMPLETED', finished_at = now(), updated_at = now(), locked_by = NULL
WHERE id = $1
"""


async def _previous_submit(connection: asyncpg.Connection, key: str) -> str:
    """Submit `{"taskType": "noop", "payload": {}, "idempotencyKey": key}` as the previous
    release does; the new job's id (text)."""
    row = job_row(
        build_request("noop", {}, idempotency_key=key), new_job_id(), DEFAULT_MAX_ATTEMPTS
    )
    [inserted] = await connection.fetch(PREVIOUS_ENQUEUE, encode_rows([row]))
    return str(inserted["id"])


@pytest.fixture
async def scratch(postgres_base: str, fresh_database_name: str) -> AsyncIterator[str]:
    """The URL of an empty database of this test's own, dropped afterwards."""
    name = fresh_database_name
    await admin_execute(
        postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'
    )
    try:
        yield f"{postgres_base}/{name}"
    finally:
        await admin_execute(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_a_key_the_previous_release_wrote_after_the_copy_blocks_once_its_job_moved(
    scratch: str, redis_url: str
) -> None:
    migrate(scratch, "upgrade", PREVIOUS_HEAD)
    connection = await asyncpg.connect(scratch)
    pool = None
    try:
        before = await _previous_submit(connection, "before")
        migrate(scratch, "upgrade", "head")  # copies "before"; the previous release runs on
        acked = await _previous_submit(connection, "acked")
        swept = await _previous_submit(connection, "swept")
        await connection.execute(_PREVIOUS_COMPLETE, swept)

        settings = QueueSettings(database_url=scratch, redis_url=redis_url)
        pool = await create_pool(scratch, size=2)
        async with serving(create_app(settings)) as client:
            # The new release settles one job (moved to the history by its ack) and sweeps
            # the one the previous release completed in place.
            claimed = await client.post(
                "/jobs/next", json={"worker": "w", "queues": ["default"], "max": 10}
            )
            [job] = [j for j in claimed.json()["jobs"] if j["id"] == acked]
            reply = await client.post(
                f"/jobs/{acked}/ack", json={"receiptHandle": job["receiptHandle"]}
            )
            assert reply.status_code == 200, reply.text
            await History(JobRepository(pool), 86400, 7 * 86400, 14 * 86400).sweep()
            moved = await connection.fetchval(
                "SELECT count(*) FROM job_history WHERE id = ANY($1::uuid[])", [acked, swept]
            )
            assert moved == 2

            for key, job_id in (("before", before), ("acked", acked), ("swept", swept)):
                replay = await client.post(
                    "/jobs", json={"taskType": "noop", "payload": {}, "idempotencyKey": key}
                )
                assert replay.status_code == 200, (key, replay.text)
                assert replay.json()["jobId"] == job_id
                conflict = await client.post(
                    "/jobs", json={"taskType": "noop", "payload": {"n": 1}, "idempotencyKey": key}
                )
                assert conflict.status_code == 409, (key, conflict.text)
                jobs = await connection.fetchval(
                    "SELECT count(*) FROM job_all WHERE idempotency_key = $1", key
                )
                assert jobs == 1, f"a second job under {key!r}"
    finally:
        if pool is not None:
            await pool.close()
        await connection.close()


_CALLS = "SELECT pg_stat_get_xact_function_calls('jobq_hold_idempotency_key'::regproc)"
"""How many times this transaction called the trigger's function (NULL: never; counted with
track_functions = 'pl')."""


async def test_the_trigger_leaves_the_new_release_s_keys_and_keyless_submits_alone(
    clean_database: str,
) -> None:
    connection = await asyncpg.connect(clean_database)
    try:
        await connection.execute("SET track_functions = 'pl'")
        async with connection.transaction():
            rows = [
                job_row(build_request("noop", {"n": n}), new_job_id(), DEFAULT_MAX_ATTEMPTS)
                for n in range(3)
            ]
            await connection.fetch(ENQUEUE_ASYNCPG, encode_rows(rows))
            assert await connection.fetchval(_CALLS) is None, "a keyless submit fired it"

        # The new release's own keyed submit calls it, and the key is held for the submit's
        # window (300 s), not the trigger's 7 days: it found the row taken and did nothing.
        request = build_request("noop", {}, idempotency_key="k", idempotency_window_seconds=300)
        row = job_row(request, new_job_id(), DEFAULT_MAX_ATTEMPTS)
        async with connection.transaction():
            [outcome] = await insert_jobs(executor_for(connection), [row])
            assert await connection.fetchval(_CALLS) == 1
        assert isinstance(outcome, Submitted) and outcome.created
        window = await connection.fetchval(
            "SELECT EXTRACT(EPOCH FROM expires_at - now())::float8 FROM idempotency_key"
            " WHERE key = 'k'"
        )
        assert 290 < window <= 300
        held = await connection.fetchval("SELECT job_id FROM idempotency_key WHERE key = 'k'")
        assert held == row.id
        # A replay and a conflict are answered as before.
        [replay] = await insert_jobs(executor_for(connection), [replace(row, id=new_job_id())])
        assert isinstance(replay, Submitted) and not replay.created
        assert replay.response.job_id == row.id
        other = job_row(
            build_request("noop", {"n": 1}, idempotency_key="k"), new_job_id(), DEFAULT_MAX_ATTEMPTS
        )
        [conflict] = await insert_jobs(executor_for(connection), [other])
        assert isinstance(conflict, IdempotencyConflict)

        # A job brought back from the history (retry, redrive) keeps its created_at: once its
        # window was over and its key removed, the trigger does not hold the key again.
        await connection.execute(
            "WITH moved AS (DELETE FROM job WHERE id = $1 RETURNING job.*) "
            + archive("moved", status="'COMPLETED'", finished_at="statement_timestamp()"),
            row.id,
        )
        await connection.execute("DELETE FROM idempotency_key WHERE key = 'k'")
        revived = await connection.execute(
            "WITH moved AS (DELETE FROM job_history WHERE id = $1 RETURNING job_history.*) "
            + revive("moved"),
            row.id,
        )
        assert revived == "INSERT 0 1"
        key = await connection.fetchval("SELECT idempotency_key FROM job WHERE id = $1", row.id)
        assert key == "k"
        assert await connection.fetchval("SELECT count(*) FROM idempotency_key") == 0
    finally:
        await connection.close()


ROUNDS = 6
"""Cycles of the key-removal test."""
KEYS = 2500
"""Keys taken per cycle, each with a WINDOW-second window."""
WINDOW = 3
"""Seconds a cycle's keys are held: past the cycle's removal, over by the next one's."""
PAUSE = 2.0
"""Seconds between taking a cycle's keys and the removal pass."""
LIVE = 20000
"""Keys held throughout (an hour): what a window holds is many passes' worth of keys."""

_ADD_KEYS = """
INSERT INTO idempotency_key (tenant, key, job_id, request_hash, expires_at)
SELECT 'default', md5($1 || ':' || i), gen_random_uuid(), repeat('0', 64),
       statement_timestamp() + make_interval(secs => $3)
FROM generate_series(1, $2) AS i
"""
"""$2 random keys (md5 of `$1:i`) held for $3 seconds, as the enqueue statement takes them."""


async def _size(connection: asyncpg.Connection) -> int:
    """Bytes of `idempotency_key`: its heap and every index."""
    return int(
        await connection.fetchval(
            "SELECT pg_relation_size('idempotency_key') + pg_indexes_size('idempotency_key')"
        )
    )


async def _vacuum_alone(connection: asyncpg.Connection) -> None:
    """VACUUM `idempotency_key` once no other session of this database holds a snapshot (an
    autovacuum's ANALYZE of another table, say; at most 10 s): a snapshot older than the
    removals would keep their rows and the emptied index pages until a later pass."""
    for _ in range(100):
        others = await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL"
        )
        if not others:
            break
        await asyncio.sleep(0.1)
    await connection.execute("VACUUM idempotency_key")


async def test_expired_keys_are_removed_without_bloat(
    repository: JobRepository, clean_database: str
) -> None:
    """A sliding window, as in production: LIVE keys held for an hour, and each of ROUNDS
    cycles takes KEYS keys for WINDOW seconds, waits PAUSE seconds, removes what expired (the
    previous cycle's keys) as the retention loop does (History.forget_keys, 500 per
    statement) and vacuums the table. No expired key survives a pass, every other key does,
    and the table with its indexes stays within 1.2x of its size after the first cycle (the
    space of removed keys is reused; without the removal it would grow by 1.5x)."""
    assert (ROUNDS - 1) * KEYS > 0.2 * (LIVE + KEYS), "a table that kept every key would pass"
    history = History(repository, 86400, 7 * 86400, 14 * 86400)
    connection = await asyncpg.connect(clean_database)
    sizes = []
    try:
        await connection.execute(_ADD_KEYS, "live", LIVE, 3600)
        for cycle in range(ROUNDS):
            await connection.execute(_ADD_KEYS, f"cycle-{cycle}", KEYS, WINDOW)
            await asyncio.sleep(PAUSE)
            assert await history.forget_keys() == (KEYS if cycle else 0)
            expired = await connection.fetchval(
                "SELECT count(*) FROM idempotency_key WHERE expires_at <= statement_timestamp()"
            )
            assert expired == 0, f"cycle {cycle}: {expired} expired key(s) survived"
            held = await connection.fetchval("SELECT count(*) FROM idempotency_key")
            assert held == LIVE + KEYS
            await _vacuum_alone(connection)
            sizes.append(await _size(connection))
    finally:
        await connection.close()
    assert sizes[-1] <= 1.2 * sizes[0], f"bytes after each cycle: {sizes}"
