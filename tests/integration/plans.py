"""Shared by the plan-regression tests (test_claims, test_history): the generic plan of a
statement as the queue service's sessions cache it, and tables shaped like a busy system's
(a live backlog, a history of finished jobs, idempotency keys)."""

from __future__ import annotations

import itertools
from typing import Any

import asyncpg

from common.enqueue import ENQUEUE_ASYNCPG, encode_rows
from tests.helpers import new_job

_PREPARED = itertools.count()


async def generic_plan(connection: asyncpg.Connection, statement: str, args: str) -> str:
    """EXPLAIN of the plan PostgreSQL caches for `statement` (generic, as the queue service's
    sessions use: `plan_cache_mode = force_generic_plan`), executed with `args` (SQL
    literals; empty for a statement without parameters)."""
    name = f"under_test_{next(_PREPARED)}"
    await connection.execute("SET plan_cache_mode = force_generic_plan")
    await connection.execute(f"PREPARE {name} AS {statement}")
    rows = await connection.fetch(f"EXPLAIN EXECUTE {name}" + (f"({args})" if args else ""))
    return "\n".join(row[0] for row in rows)


def literals(*values: Any) -> str:
    """`values` (None, bool, int, float, str, or a list of those) as SQL literals for
    `generic_plan`'s `args`; a text or list literal is left untyped, so the prepared
    statement's own parameter types apply."""

    def one(value: Any) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return repr(value)
        if isinstance(value, (list, tuple)):
            inner = ",".join('"' + str(v).replace('"', '\\"') + '"' for v in value)
            return "'{" + inner.replace("'", "''") + "}'"
        return "'" + str(value).replace("'", "''") + "'"

    return ", ".join(one(value) for value in values)


async def fill_history(connection: asyncpg.Connection, analyze: bool = True) -> None:
    """A live table of 10,100 jobs and a history of 40,000 (half dead letters) finished in
    the last minute; statistics taken unless not `analyze` (a server without autovacuum, or
    partitions filled since its last pass)."""
    await connection.fetch(ENQUEUE_ASYNCPG, encode_rows([new_job() for _ in range(100)]))
    await connection.execute(
        "INSERT INTO job (id, queue, task_type, payload, status, max_attempts, visible_at)"
        " SELECT gen_random_uuid(), 'default', 'noop', '{}', 'PENDING', 5, now()"
        " FROM generate_series(1, 10000)"
    )
    await connection.execute(
        "INSERT INTO job_history (id, tenant, queue, task_type, payload, status, priority,"
        " attempts, releases, max_attempts, visible_at, ready_at, cancel_requested, awaited,"
        " errors, created_at, updated_at, finished_at)"
        " SELECT gen_random_uuid(), 'default', 'default', 'noop', '{}',"
        " CASE WHEN i % 2 = 0 THEN 'DEAD_LETTER' ELSE 'COMPLETED' END, 0, 1, 0, 5, now(),"
        " now(), false, false, '[]', now(), now(), now() - make_interval(secs => i % 60)"
        " FROM generate_series(1, 40000) AS i"
    )
    if analyze:
        await connection.execute("ANALYZE job")
        await connection.execute("ANALYZE job_history")


async def fill_keys(connection: asyncpg.Connection) -> None:
    """20,000 idempotency keys, of jobs that may or may not exist, half of them past their
    window (a backlog of expired keys, as after the retention loop stopped for a while);
    statistics fresh."""
    await connection.execute(
        "INSERT INTO idempotency_key (tenant, key, job_id, request_hash, expires_at)"
        " SELECT 'default', 'key-' || i, gen_random_uuid(), repeat('0', 64),"
        " now() + make_interval(secs => CASE WHEN i % 2 = 0 THEN -60 ELSE 3600 END)"
        " FROM generate_series(1, 20000) AS i"
    )
    await connection.execute("ANALYZE idempotency_key")
