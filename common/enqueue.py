"""The enqueue statement, shared by the queue service and the client library's
`enqueue(connection, …)` (docs/architecture.md#client-library: the one documented exception
to "only the queue service touches PostgreSQL").

One statement inserts any number of jobs from a JSON array (`jsonb_to_recordset`) and sends one
`pg_notify` per queue that received ready jobs, in the caller's transaction: a job committed
with the caller's writes wakes long-polling workers, a rolled-back one never existed. It works
through asyncpg (`$1`) and SQLAlchemy (`:rows`) alike, because its only parameter is text.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import msgspec

from common.contracts import JobStatus, SubmitJobRequest
from common.hashing import request_hash

WAKEUP_CHANNEL = "jobq_ready"
"""LISTEN/NOTIFY channel; the payload is `<queue>:<number of jobs made ready>`."""

_ENQUEUE = """
WITH incoming AS (
    SELECT * FROM jsonb_to_recordset(CAST(CAST({rows} AS text) AS jsonb)) AS j(
        id uuid, queue text, task_type text, payload jsonb, priority int, delay float8,
        max_attempts int, timeout_seconds int, idempotency_key text, request_hash text,
        tenant text)
), inserted AS (
    INSERT INTO job (id, tenant, queue, task_type, payload, status, priority, max_attempts,
                     timeout_seconds, visible_at, ready_at, idempotency_key, request_hash,
                     created_at, updated_at)
    SELECT id, COALESCE(tenant, 'default'), queue, task_type, payload,
           CASE WHEN delay > 0 THEN 'SCHEDULED' ELSE 'PENDING' END,
           priority, max_attempts, timeout_seconds,
           statement_timestamp() + make_interval(secs => delay),
           -- A delayed job's ready time is set again when it is promoted.
           statement_timestamp() + make_interval(secs => delay),
           idempotency_key, request_hash, statement_timestamp(), statement_timestamp()
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
    SELECT pg_notify('{channel}', queue || ':' || count(*)) FROM inserted
    WHERE status = 'PENDING' GROUP BY queue
)
SELECT id, queue, task_type, status, (SELECT count(*) FROM woken) AS notified FROM inserted
"""

ENQUEUE_ASYNCPG = _ENQUEUE.format(rows="$1", channel=WAKEUP_CHANNEL)
"""The enqueue statement with asyncpg's positional parameter."""

ENQUEUE_NAMED = _ENQUEUE.format(rows=":rows", channel=WAKEUP_CHANNEL)
"""The enqueue statement with a named `:rows` parameter (SQLAlchemy `text()`)."""

# Idempotency keys are unique per tenant: only the same tenant's key is a collision.
_FIND_EXISTING = """
SELECT id, status, request_hash, tenant FROM job
WHERE id = {id} OR ({key} IS NOT NULL AND tenant = {tenant} AND idempotency_key = {key})
ORDER BY (id = {id}) DESC
LIMIT 1
"""

FIND_EXISTING_ASYNCPG = _FIND_EXISTING.format(id="$1::uuid", key="$2::text", tenant="$3::text")
FIND_EXISTING_NAMED = _FIND_EXISTING.format(
    id="CAST(:id AS uuid)", key="CAST(:key AS text)", tenant="CAST(:tenant AS text)"
)


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as the enqueue statement takes it; `delay` in seconds; `tenant` owns it."""

    id: uuid.UUID
    queue: str
    task_type: str
    payload: dict[str, Any]
    priority: int
    delay: float
    max_attempts: int
    timeout_seconds: int | None
    idempotency_key: str | None
    request_hash: str
    tenant: str = "default"


def job_row(
    request: SubmitJobRequest,
    job_id: uuid.UUID,
    default_max_attempts: int,
    tenant: str = "default",
) -> JobRow:
    """The row for a validated request, owned by `tenant`; `default_max_attempts` fills an
    omitted maxAttempts (the hash still treats it as omitted)."""
    return JobRow(
        id=job_id,
        queue=request.queue,
        task_type=request.task_type,
        payload=request.payload,
        priority=request.priority,
        delay=float(request.delay_seconds),
        max_attempts=request.max_attempts or default_max_attempts,
        timeout_seconds=request.timeout_seconds,
        idempotency_key=request.idempotency_key,
        request_hash=request_hash(request),
        tenant=tenant,
    )


def encode_rows(rows: list[JobRow]) -> str:
    """The statement's single parameter: the rows as a JSON array (text)."""
    return msgspec.json.encode(rows).decode()


@dataclass(frozen=True, slots=True)
class Inserted:
    """A job the statement created."""

    id: uuid.UUID
    queue: str
    task_type: str
    status: JobStatus


@dataclass(frozen=True, slots=True)
class Existing:
    """The job an insert collided with (same id, or the same tenant's idempotency key)."""

    id: uuid.UUID
    status: JobStatus
    request_hash: str | None
    tenant: str
