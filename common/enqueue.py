"""The one enqueue path, shared by the queue service and the client library's
`enqueue(connection, …)` (docs/architecture.md#client-library: the one documented exception
to "only the queue service touches PostgreSQL").

`insert_jobs(executor, rows)` inserts, reads what each uncreated row collided with, and
decides replay or conflict (docs/architecture.md#idempotency), over an `Executor` that runs
the two statements below somewhere: the queue service's pool (`JobRepository`) or a caller's
own connection (`common.drivers`).

One statement inserts any number of jobs from a JSON array (`jsonb_to_recordset`) and sends one
`pg_notify` per queue that received ready jobs, in the caller's transaction: a job committed
with the caller's writes wakes long-polling workers, a rolled-back one never existed. It works
through asyncpg (`$1`) and SQLAlchemy (`:rows`) alike, because its only parameter is text.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from common.contracts import (
    DEFAULT_IDEMPOTENCY_WINDOW,
    JobStatus,
    SubmitJobRequest,
    SubmitJobResponse,
    TraceContext,
)
from common.errors import IdempotencyConflict, JobqError, ServiceUnavailable
from common.hashing import request_hash

WAKEUP_CHANNEL = "jobq_ready"
"""LISTEN/NOTIFY channel; the payload is `<queue>:<number of jobs made ready>`."""

SETTLED_CHANNEL = "jobq_settled"
"""LISTEN/NOTIFY channel of settles somebody waits for; the payload is the job's id. Sent by
the trigger `job_settled_awaited` only for jobs whose `awaited` flag a waiter set."""

_ENQUEUE = """
WITH incoming AS (
    SELECT * FROM jsonb_to_recordset(CAST(CAST({rows} AS text) AS jsonb)) AS j(
        id uuid, queue text, task_type text, payload jsonb, priority int, delay float8,
        max_attempts int, timeout_seconds int, idempotency_key text, request_hash text,
        tenant text, trace_context jsonb, idempotency_window float8)
), keys AS (
    -- A key is taken by inserting it, or by taking over an expired one (its window is over);
    -- a key held by another submit (committed or not: the loser waits for the winner) is not.
    -- Sorted, so concurrent batches sharing keys wait for each other instead of deadlocking.
    INSERT INTO idempotency_key AS held (tenant, key, job_id, request_hash, expires_at)
    SELECT COALESCE(tenant, 'default'), idempotency_key, id, request_hash,
           statement_timestamp() + make_interval(secs => idempotency_window)
    FROM incoming WHERE idempotency_key IS NOT NULL
    ORDER BY 1, 2
    ON CONFLICT (tenant, key) DO UPDATE
        SET job_id = EXCLUDED.job_id, request_hash = EXCLUDED.request_hash,
            expires_at = EXCLUDED.expires_at
        WHERE held.expires_at <= statement_timestamp()
    RETURNING held.job_id
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
    -- A keyed job only under a key this statement took. A finished job lives in
    -- job_history, out of the primary key's reach: its id (a retried forward) collides there.
    -- The probe is one primary-key lookup per row and partition: OFFSET 0 keeps it a
    -- subplan, never an anti join that hashes the whole history (the plan PostgreSQL chose
    -- with a history of unanalysed partitions: a 30-minute soak's enqueue slowed to 0.5 s).
    WHERE (incoming.idempotency_key IS NULL OR incoming.id IN (SELECT job_id FROM keys))
      AND NOT EXISTS (SELECT FROM job_history AS h WHERE h.id = incoming.id OFFSET 0)
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

# Idempotency keys are unique per tenant: only the same tenant's key is a collision, found in
# `idempotency_key` while its window lasts. The job may be live or finished (`job_all` is
# `job UNION ALL job_history`). The key's request hash is the one it was taken with.
_FIND_EXISTING = """
SELECT id, status, request_hash, tenant, 0 AS rank FROM job_all WHERE id = {id}
UNION ALL
SELECT job.id, job.status, held.request_hash, held.tenant, 1 FROM idempotency_key AS held
JOIN job_all AS job ON job.id = held.job_id
WHERE {key} IS NOT NULL AND held.tenant = {tenant} AND held.key = {key}
  AND held.expires_at > statement_timestamp()
UNION ALL
SELECT id, status, request_hash, tenant, 2 FROM job
WHERE {key} IS NOT NULL AND tenant = {tenant} AND idempotency_key = {key}
ORDER BY rank
LIMIT 1
"""

FIND_EXISTING_ASYNCPG = _FIND_EXISTING.format(id="$1::uuid", key="$2::text", tenant="$3::text")
FIND_EXISTING_NAMED = _FIND_EXISTING.format(
    id="CAST(:id AS uuid)", key="CAST(:key AS text)", tenant="CAST(:tenant AS text)"
)


# A key whose job is gone (deleted, or dropped by retention while its window lasted) ends
# with its job: the key's row is deleted, so the submit that found it can take the key afresh.
# `seen` pins the job the key held when this statement's snapshot was taken: were the key
# taken over meanwhile (a concurrent submit after its window), the re-check of the locked row
# finds another job_id and deletes nothing. A key's row and its job are written by one
# statement, and a job moves between `job` and `job_history` in one statement, so within one
# snapshot a visible key whose job is not in `job_all` means the job is gone.
_RELEASE_KEY = """
DELETE FROM idempotency_key AS held
USING (SELECT job_id FROM idempotency_key WHERE tenant = {tenant} AND key = {key}) AS seen
WHERE held.tenant = {tenant} AND held.key = {key} AND held.job_id = seen.job_id
  AND NOT EXISTS (SELECT FROM job_all WHERE job_all.id = held.job_id OFFSET 0)
RETURNING held.job_id
"""

RELEASE_KEY_ASYNCPG = _RELEASE_KEY.format(key="$1::text", tenant="$2::text")
RELEASE_KEY_NAMED = _RELEASE_KEY.format(key="CAST(:key AS text)", tenant="CAST(:tenant AS text)")


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
    trace_context: TraceContext | msgspec.UnsetType = msgspec.UNSET
    """Left out of the statement's JSON when the job has none (`UNSET`): the column reads
    NULL, and a submit without tracing sends no `"trace_context": null` per row."""
    idempotency_window: float = DEFAULT_IDEMPOTENCY_WINDOW
    """Seconds the key (if any) is held: the submit's idempotencyWindowSeconds, else the
    default."""


def job_row(
    request: SubmitJobRequest,
    job_id: uuid.UUID,
    default_max_attempts: int,
    tenant: str = "default",
    trace_context: TraceContext | None = None,
    default_idempotency_window: float = DEFAULT_IDEMPOTENCY_WINDOW,
) -> JobRow:
    """The row for a validated request, owned by `tenant`, carrying the submitting span's
    `trace_context`; `default_max_attempts` fills an omitted maxAttempts (the hash still
    treats it as omitted, and never includes the trace context)."""
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
        trace_context=msgspec.UNSET if trace_context is None else trace_context,
        idempotency_window=float(request.idempotency_window_seconds or default_idempotency_window),
    )


def encode_rows(rows: Sequence[JobRow]) -> str:
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


@dataclass(frozen=True, slots=True)
class Submitted:
    """A submit's answer: the response body and whether a new job was created (202 vs 200)."""

    response: SubmitJobResponse
    created: bool


class Executor(Protocol):
    """Where the enqueue's two statements run (each its own statement, in whatever
    transaction the executor's connection has open)."""

    async def insert_many(self, rows: Sequence[JobRow]) -> list[Inserted]:
        """Run the enqueue statement over `rows`; the jobs it created (a row whose id or
        tenant's idempotency key exists is skipped)."""
        ...

    async def find_existing(self, row: JobRow) -> Existing | None:
        """The job holding `row.id`, or `row.tenant`'s job holding its idempotency key (the
        id first), or None."""
        ...

    async def release_key(self, row: JobRow) -> bool:
        """Delete `row.tenant`'s idempotency key `row.idempotency_key` if the job holding it
        no longer exists (deleted, or dropped by retention); whether it did."""
        ...


INSERT_ATTEMPTS = 3
"""Inserts tried per row while the job it collided with vanishes before it can be read."""


def conflict(row: JobRow, existing: uuid.UUID) -> IdempotencyConflict:
    """The error for `row` colliding with job `existing`, which holds a different request."""
    what = f"job id {row.id}" if row.id == existing else f"idempotency key {row.idempotency_key!r}"
    return IdempotencyConflict(f"{what} is already used by job {existing} with a different request")


async def insert_jobs(
    executor: Executor, rows: Sequence[JobRow], attempts: int = INSERT_ATTEMPTS
) -> list[Submitted | JobqError]:
    """Insert `rows` with one statement (plus one read per collision); one outcome per row.

    A replay is the same job id (a retried forward) or the same tenant's idempotency key with
    the same request hash: the existing job's id and current status, `created=False`. A key
    repeated among `rows` is a replay of its first use. IdempotencyConflict when the id or key
    belongs to a different request (or another tenant's job); ServiceUnavailable when the job
    a row collided with vanished (retention) `attempts` times in a row.
    """
    outcomes: list[Submitted | JobqError | None] = [None] * len(rows)
    firsts: dict[int, JobRow] = {}
    repeats: dict[int, int] = {}
    first_use: dict[tuple[str, str], int] = {}
    for index, row in enumerate(rows):
        if row.idempotency_key is not None:
            key = (row.tenant, row.idempotency_key)
            if key in first_use:
                repeats[index] = first_use[key]
                continue
            first_use[key] = index
        firsts[index] = row
    await _insert_resolving(executor, firsts, outcomes, attempts)
    for index, first in repeats.items():
        earlier = outcomes[first]
        if isinstance(earlier, Submitted):
            row = rows[index]
            same = row.request_hash == rows[first].request_hash
            outcomes[index] = (
                Submitted(earlier.response, False)
                if same
                else conflict(row, earlier.response.job_id)
            )
        else:
            outcomes[index] = earlier
    return [o if o is not None else JobqError("no outcome") for o in outcomes]


async def _insert_resolving(
    executor: Executor,
    rows: dict[int, JobRow],
    outcomes: list[Submitted | JobqError | None],
    attempts: int,
) -> None:
    # Insert, then read collisions in new statements: a concurrent twin may commit in
    # between, and retention may delete the row we collided with, so try a few times.
    pending = dict(rows)
    for _ in range(attempts):
        if not pending:
            return
        created = {job.id: job for job in await executor.insert_many(list(pending.values()))}
        vanished: dict[int, JobRow] = {}
        for index, row in pending.items():
            job = created.get(row.id)
            if job is not None:
                outcomes[index] = Submitted(
                    SubmitJobResponse(job_id=job.id, status=job.status), True
                )
                continue
            existing = await executor.find_existing(row)
            if existing is None:
                # The job the row collided with is gone: a key it held ends with it, so the
                # next insert may take the key (or a concurrent twin's job is read then).
                if row.idempotency_key is not None:
                    await executor.release_key(row)
                vanished[index] = row
            elif existing.request_hash != row.request_hash or existing.tenant != row.tenant:
                outcomes[index] = conflict(row, existing.id)
            else:
                reply = SubmitJobResponse(job_id=existing.id, status=existing.status)
                outcomes[index] = Submitted(reply, False)
        pending = vanished
    for index in pending:
        outcomes[index] = ServiceUnavailable("could not settle a concurrent submission; retry")
