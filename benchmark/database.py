"""Databases for the benchmarks: fresh ones migrated by alembic, pre-inserted jobs, and the
checks and figures read back from the `job` table.

Every benchmark database is named `jobq_bench_<what>` on the server `infra.servers` finds, and is
made from one migrated template per suite run, so a fresh database costs a file copy, not a
migration.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg

from common.contracts import SubmitJobRequest
from common.enqueue import ENQUEUE_ASYNCPG, JobRow, encode_rows, job_row
from common.ids import new_job_id
from infra.stack import ROOT

TEMPLATE = "jobq_bench_template"
DEFAULT_MAX_ATTEMPTS = 5
"""`QUEUE_MAX_ATTEMPTS`'s default, stored on pre-inserted jobs."""
INSERT_BATCH = 5_000
"""Jobs per enqueue statement when pre-inserting a backlog."""


async def admin_execute(base_url: str, *statements: str) -> None:
    """Run `statements` on the server's `postgres` database (CREATE/DROP DATABASE)."""
    connection = await asyncpg.connect(f"{base_url}/postgres")
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


async def drop_database(base_url: str, name: str) -> None:
    """Drop `name` if it exists, disconnecting its sessions."""
    await admin_execute(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def migrated_database(base_url: str, name: str, root: Path = ROOT) -> str:
    """(Re)create database `name` and migrate it (`alembic upgrade head`, as production does)
    with the migrations of the checkout at `root` (default this one); its URL.
    subprocess.CalledProcessError with alembic's output when the migration fails."""
    await drop_database(base_url, name)
    await admin_execute(base_url, f'CREATE DATABASE "{name}"')
    url = f"{base_url}/{name}"
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=root,
        env={
            **os.environ,
            "DATABASE_URL": url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
        },
        check=True,
        capture_output=True,
    )
    return url


async def make_template(base_url: str) -> None:
    """(Re)create the migrated template database the suite copies."""
    await migrated_database(base_url, TEMPLATE)


async def fresh_database(base_url: str, name: str, migrated: bool = True) -> str:
    """A new, empty database `name` (dropped first if it exists): a copy of the migrated
    template, or a bare one for a peer (`migrated=False`). Returns its URL."""
    await drop_database(base_url, name)
    template = f' TEMPLATE "{TEMPLATE}"' if migrated else ""
    await admin_execute(base_url, f'CREATE DATABASE "{name}"{template}')
    return f"{base_url}/{name}"


def job_rows(
    count: int,
    task_type: str = "noop",
    payload: dict[str, Any] | None = None,
    queue: str = "default",
    delay: float = 0.0,
) -> list[JobRow]:
    """`count` jobs as the queue service makes them from `{"taskType", "payload"}` (same id
    kind, request hash and defaults); an empty payload unless one is given."""
    request = SubmitJobRequest(
        task_type=task_type, payload=payload or {}, queue=queue, delay_seconds=delay
    )
    template = job_row(request, new_job_id(), DEFAULT_MAX_ATTEMPTS)
    return [dataclasses.replace(template, id=new_job_id()) for _ in range(count)]


ENQUEUE_BEFORE_HISTORY = """
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
           -- A delayed job's ready time is set again when it is promoted.
           statement_timestamp() + make_interval(secs => delay),
           idempotency_key, request_hash, statement_timestamp(), statement_timestamp(),
           trace_context
    FROM incoming
    -- One global order for the unique-index entries: concurrent batches sharing keys then
    -- wait for each other instead of deadlocking.
    ORDER BY tenant, idempotency_key, id
    -- No conflict target: a collision on the id (a replayed forward) or on the tenant's
    -- idempotency key both mean "this job may exist already", which the caller resolves by
    -- reading it.
    ON CONFLICT DO NOTHING
    RETURNING id, queue, task_type, status
), woken AS (
    -- One notification per queue per statement, never one per row.
    SELECT pg_notify('jobq_ready', queue || ':' || count(*)) FROM inserted
    WHERE status = 'PENDING' GROUP BY queue
)
SELECT id, queue, task_type, status, (SELECT count(*) FROM woken) AS notified FROM inserted
"""
"""The enqueue statement of the revisions before the history and the idempotency-key table
(issue 20), frozen here: bench-compare fills an earlier revision's database with this
checkout's code, and this checkout's statement names tables that schema lacks."""


def _without_trace_context(statement: str) -> str:
    """The enqueue statement as a revision before `job.trace_context` wrote it (bench-compare
    fills an earlier revision's database with this checkout's code)."""
    parts = (", trace_context jsonb)", ", trace_context)", ",\n           trace_context\n")
    replacements = (")", ")", "\n")
    for part, replacement in zip(parts, replacements, strict=True):
        if part not in statement:
            raise RuntimeError(f"the enqueue statement changed: {part!r} not found")
        statement = statement.replace(part, replacement)
    return statement


ENQUEUE_PREVIOUS = _without_trace_context(ENQUEUE_BEFORE_HISTORY)


async def _enqueue_statement(connection: asyncpg.Connection) -> str:
    """This checkout's enqueue statement; the one before the history for a database without
    `idempotency_key`; the one before that for a database without `job.trace_context`."""
    if await connection.fetchval("SELECT to_regclass('idempotency_key') IS NOT NULL"):
        return ENQUEUE_ASYNCPG
    traced = await connection.fetchval(
        "SELECT EXISTS (SELECT FROM information_schema.columns"
        " WHERE table_name = 'job' AND column_name = 'trace_context')"
    )
    return ENQUEUE_BEFORE_HISTORY if traced else ENQUEUE_PREVIOUS


async def insert_jobs(
    connection: asyncpg.Connection,
    count: int,
    task_type: str = "noop",
    payload: dict[str, Any] | None = None,
    queue: str = "default",
    delay: float = 0.0,
) -> None:
    """Insert `count` jobs with the shared enqueue statement, `INSERT_BATCH` per statement
    (each batch its own transaction, as a producer's batches would be)."""
    statement = await _enqueue_statement(connection)
    for start in range(0, count, INSERT_BATCH):
        rows = job_rows(min(INSERT_BATCH, count - start), task_type, payload, queue, delay)
        await connection.fetch(statement, encode_rows(rows))


async def jobs_relation(connection: asyncpg.Connection) -> str:
    """The relation holding every job: `job_all` (the live table and the history) on a schema
    with the history (issue 20), else `job`, so the benchmark reads either revision."""
    found = await connection.fetchval("SELECT to_regclass('job_all') IS NOT NULL")
    return "job_all" if found else "job"


async def truncate_jobs(connection: asyncpg.Connection) -> None:
    """Empty the job table, and the history where the schema has one."""
    history = await connection.fetchval("SELECT to_regclass('job_history') IS NOT NULL")
    await connection.execute("TRUNCATE job, job_history" if history else "TRUNCATE job")


async def reset_jobs(connection: asyncpg.Connection) -> None:
    """Empty the job table and refresh its statistics (between runs on one database)."""
    await truncate_jobs(connection)
    await connection.execute("VACUUM ANALYZE job")


async def burn_window(connection: asyncpg.Connection) -> float:
    """Seconds from the first claim to the last completion of the COMPLETED jobs (0 if none)."""
    jobs = await jobs_relation(connection)
    seconds = await connection.fetchval(
        f"SELECT EXTRACT(EPOCH FROM max(finished_at) - min(claimed_at))::float8 FROM {jobs}"
        " WHERE status = 'COMPLETED'"
    )
    return float(seconds or 0.0)


async def outcome(connection: asyncpg.Connection) -> dict[str, Any]:
    """What became of the jobs: `{total, by_status: {status: n}, by_attempts: {attempts: n}}`
    (attempts counted over COMPLETED jobs only)."""
    jobs = await jobs_relation(connection)
    statuses = await connection.fetch(f"SELECT status, count(*) AS n FROM {jobs} GROUP BY status")
    attempts = await connection.fetch(
        f"SELECT attempts, count(*) AS n FROM {jobs} WHERE status = 'COMPLETED'"
        " GROUP BY attempts ORDER BY attempts"
    )
    by_status = {str(r["status"]): int(r["n"]) for r in statuses}
    return {
        "total": sum(by_status.values()),
        "by_status": by_status,
        "by_attempts": {str(r["attempts"]): int(r["n"]) for r in attempts},
    }


def verify(result: dict[str, Any], expected: int, max_attempts: int = 1) -> dict[str, Any]:
    """Check an `outcome()`: exactly `expected` jobs, all COMPLETED, none with more than
    `max_attempts` attempts. Returns `{ok, expected, completed, lost, not_completed,
    over_attempts}`; `ok` is False when any check fails (the caller records it, the smoke test
    asserts it)."""
    completed = result["by_status"].get("COMPLETED", 0)
    over = sum(n for a, n in result["by_attempts"].items() if int(a) > max_attempts)
    return {
        "ok": result["total"] == expected and completed == expected and over == 0,
        "expected": expected,
        "completed": completed,
        "lost": expected - result["total"],
        "not_completed": result["total"] - completed,
        "over_attempts": over,
    }


async def wal_position(connection: asyncpg.Connection) -> int:
    """The server's WAL insert position, in bytes from the start (`pg_current_wal_lsn()`)."""
    return int(await connection.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def completed_count(connection: asyncpg.Connection) -> int:
    """How many jobs are COMPLETED right now."""
    jobs = await jobs_relation(connection)
    return int(await connection.fetchval(f"SELECT count(*) FROM {jobs} WHERE status = 'COMPLETED'"))


async def latencies_ms(connection: asyncpg.Connection, start: str, end: str) -> list[float]:
    """`end - start` in milliseconds for every COMPLETED job; `start`/`end` are column names
    of `job` (e.g. created_at, claimed_at, finished_at)."""
    jobs = await jobs_relation(connection)
    rows = await connection.fetch(
        f"SELECT EXTRACT(EPOCH FROM {end} - {start})::float8 * 1000 AS ms FROM {jobs}"
        " WHERE status = 'COMPLETED'"
    )
    return [float(r["ms"]) for r in rows]
