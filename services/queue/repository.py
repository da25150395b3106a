"""All SQL of the queue service: one method per operation, each one atomic statement.

Rules that decide *what* to do live in `service.py`; this module only knows *how* to make
PostgreSQL do it safely under concurrency. Driver errors are translated here into the
`common.errors` family, so nothing above this module imports sqlalchemy or asyncpg.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import Executable, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.types import String

from common.contracts import ERRORS_HISTORY_MAX, ErrorEntry, JobMessage, JobStatus, JobView
from common.enqueue import (
    ENQUEUE_NAMED,
    FIND_EXISTING_NAMED,
    WAKEUP_CHANNEL,
    Existing,
    Inserted,
    JobRow,
    encode_rows,
)
from common.errors import ServiceUnavailable

logger = logging.getLogger(__name__)

LEASE_CAP_HOURS = 12
"""No lease extends past this many hours after its claim (as in SQS)."""


@dataclass(frozen=True, slots=True)
class Settled:
    """A settle this call applied: the job as it is now, and (for an ack) seconds from
    submit to completion."""

    view: JobView
    end_to_end_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class Reaped:
    """One expired lease the reaper handled: the job's queue, task type and new status."""

    id: uuid.UUID
    queue: str
    task_type: str
    status: JobStatus


@dataclass(frozen=True, slots=True)
class Extended:
    """Outcome of a heartbeat: the job's status and lease end now, and any cancel request."""

    queue: str
    task_type: str
    status: JobStatus
    visible_at: datetime
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class DepthRow:
    """Count of jobs in one (queue, status), with the oldest PENDING job's age in seconds."""

    queue: str
    status: JobStatus
    count: int
    oldest_age_seconds: float


def _to_view(row: RowMapping) -> JobView:
    return JobView(
        id=row["id"],
        queue=row["queue"],
        task_type=row["task_type"],
        payload=row["payload"],
        status=JobStatus(row["status"]),
        priority=row["priority"],
        attempts=row["attempts"],
        releases=row["releases"],
        max_attempts=row["max_attempts"],
        timeout_seconds=row["timeout_seconds"],
        last_error=row["last_error"],
        errors=msgspec.convert(row["errors"] or [], list[ErrorEntry], strict=False),
        result=row["result"],
        idempotency_key=row["idempotency_key"],
        locked_by=row["locked_by"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        visible_at=row["visible_at"],
        claimed_at=row["claimed_at"],
        finished_at=row["finished_at"],
        cancel_requested=row["cancel_requested"],
    )


_JOB_COLUMNS = (
    "id, queue, task_type, payload, status, priority, attempts, releases, max_attempts, "
    "timeout_seconds, last_error, errors, result, idempotency_key, locked_by, created_at, "
    "updated_at, visible_at, claimed_at, finished_at, cancel_requested, lease_id"
)

_RETURNING_JOB = ", ".join("job." + c.strip() for c in _JOB_COLUMNS.split(","))

_ENQUEUE = text(ENQUEUE_NAMED)

_FIND_EXISTING = text(FIND_EXISTING_NAMED)

_NOTIFY = text("SELECT pg_notify(:channel, :payload)")

_GET = text(f"SELECT {_JOB_COLUMNS} FROM job WHERE id = :id")

_CLAIM = text(
    f"""
    WITH picked AS (
        SELECT id FROM job
        WHERE status = 'PENDING' AND queue = ANY(:queues)
        -- Same order as ix_job_claim: best priority first, FIFO by (time-ordered) id.
        ORDER BY priority DESC, id
        LIMIT :max
        -- Rows another claimer holds are skipped, not waited for: claimers never block
        -- each other and never receive the same row.
        FOR UPDATE SKIP LOCKED
    )
    UPDATE job SET status = 'PROCESSING',
                   attempts = job.attempts + 1,
                   lease_id = gen_random_uuid(),
                   locked_by = :worker,
                   claimed_at = statement_timestamp(),
                   visible_at = statement_timestamp() + make_interval(secs => :visibility_timeout),
                   updated_at = statement_timestamp()
    FROM picked WHERE job.id = picked.id
    RETURNING {_RETURNING_JOB}
    """
).bindparams(bindparam("queues", type_=ARRAY(String)))

_ACK = text(
    f"""
    UPDATE job SET status = 'COMPLETED',
                   result = :result,
                   locked_by = NULL,
                   finished_at = statement_timestamp(),
                   updated_at = statement_timestamp()
    -- The receipt handle fences the settle: only the latest claim may complete the job.
    WHERE id = :id AND lease_id = :lease_id AND status = 'PROCESSING'
    RETURNING {_JOB_COLUMNS},
              EXTRACT(EPOCH FROM statement_timestamp() - created_at)::float8 AS end_to_end
    """
).bindparams(bindparam("result", type_=JSONB))

BACKOFF_CEILING_SQL = (
    "LEAST(:max_delay, :base_delay * power(:multiplier, LEAST({attempt} - 1, 30)))"
)
"""The retry ceiling in seconds for `{attempt}` (1-based): min(max, base * mult^min(a - 1, 30)).

Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015) multiplies it by
u uniform in (0, 1], bound from Python. Capping the exponent keeps attempt 10,000 finite.
"""


def _append_error(entry: str) -> str:
    # Keep the newest entries only, so a job failing forever cannot grow without bound.
    return (
        f"(CASE WHEN jsonb_array_length(job.errors) >= {ERRORS_HISTORY_MAX} "
        f"THEN job.errors - 0 ELSE job.errors END) || jsonb_build_array({entry})"
    )


_ACK_MANY = text(
    f"""
    WITH entries AS (
        SELECT * FROM jsonb_to_recordset(CAST(:entries AS jsonb))
            AS e(id uuid, receipt_handle uuid, result jsonb)
    )
    UPDATE job SET status = 'COMPLETED',
                   result = entries.result,
                   locked_by = NULL,
                   finished_at = statement_timestamp(),
                   updated_at = statement_timestamp()
    FROM entries
    -- Each entry is fenced by its own receipt handle, exactly like a single ack.
    WHERE job.id = entries.id AND job.lease_id = entries.receipt_handle
      AND job.status = 'PROCESSING'
    RETURNING {_RETURNING_JOB},
              EXTRACT(EPOCH FROM statement_timestamp() - job.created_at)::float8 AS end_to_end
    """
)

_LEASES = text("SELECT id, lease_id, status FROM job WHERE id = ANY(:ids)").bindparams(
    bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))
)

# A worker's failure report. A cancel requested meanwhile wins over a retry; `retry_after`
# (the processor's own wish) wins over the backoff.
_FAIL = text(
    f"""
    WITH decided AS (
        SELECT id,
               CASE WHEN cancel_requested THEN 'CANCELLED'
                    WHEN NOT :retryable OR attempts - releases >= max_attempts THEN 'DEAD_LETTER'
                    ELSE 'SCHEDULED' END AS next_status
        FROM job
        WHERE id = :id AND lease_id = :lease_id AND status = 'PROCESSING'
        FOR UPDATE
    )
    UPDATE job SET
        status = decided.next_status,
        visible_at = CASE WHEN decided.next_status = 'SCHEDULED'
                     THEN statement_timestamp() + make_interval(secs => COALESCE(
                         CAST(:retry_after AS float8),
                         :jitter * {BACKOFF_CEILING_SQL.format(attempt="job.attempts")}))
                     ELSE job.visible_at END,
        finished_at = CASE WHEN decided.next_status <> 'SCHEDULED'
                           THEN statement_timestamp() END,
        last_error = :error,
        errors = {
        _append_error(
            "jsonb_build_object('attempt', job.attempts, 'at', statement_timestamp(),"
            " 'error', CAST(:error AS text))"
        )
    },
        locked_by = NULL,
        updated_at = statement_timestamp()
    FROM decided WHERE job.id = decided.id
    RETURNING {_RETURNING_JOB}
    """
)

_REAP = text(
    f"""
    WITH expired AS (
        SELECT id,
               CASE WHEN cancel_requested THEN 'CANCELLED'
                    WHEN attempts - releases >= max_attempts THEN 'DEAD_LETTER'
                    ELSE 'PENDING' END AS next_status
        FROM job
        WHERE status = 'PROCESSING' AND visible_at < statement_timestamp()
        ORDER BY visible_at
        LIMIT :batch
        -- A row being acked right now is locked: skip it rather than wait. A row locked and
        -- released after this snapshot is re-checked by the outer WHERE as it is now.
        FOR UPDATE SKIP LOCKED
    )
    UPDATE job SET
        status = expired.next_status,
        finished_at = CASE WHEN expired.next_status <> 'PENDING' THEN statement_timestamp() END,
        -- Expired jobs are ready at once: the expiry consumed the attempt.
        visible_at = statement_timestamp(),
        last_error = 'lease expired: no ack, fail or heartbeat within the visibility timeout',
        errors = {
        _append_error(
            "jsonb_build_object('attempt', job.attempts, 'at', statement_timestamp(),"
            " 'error', 'lease expired')"
        )
    },
        -- The lost lease's receipt handle must no longer settle the job.
        lease_id = NULL,
        locked_by = NULL,
        updated_at = statement_timestamp()
    FROM expired
    WHERE job.id = expired.id AND job.status = 'PROCESSING'
      AND job.visible_at < statement_timestamp()
    RETURNING job.id, job.queue, job.task_type, job.status
    """
)

# SQS ChangeMessageVisibility: the new timeout counts from this call, the whole lease is capped
# at 12 h from the claim, and 0 releases the job (counted in `releases`; past 3 x maxAttempts
# releases the job is dead-lettered, so a job released on every shutdown cannot loop forever).
_HEARTBEAT = text(
    f"""
    WITH decided AS (
        SELECT id,
               CASE WHEN :visibility_timeout > 0 THEN 'PROCESSING'
                    WHEN cancel_requested THEN 'CANCELLED'
                    WHEN releases + 1 > 3 * max_attempts THEN 'DEAD_LETTER'
                    ELSE 'PENDING' END AS next_status
        FROM job
        WHERE id = :id AND lease_id = :lease_id AND status = 'PROCESSING'
        FOR UPDATE
    )
    UPDATE job SET
        status = decided.next_status,
        releases = job.releases + CASE WHEN :visibility_timeout = 0 THEN 1 ELSE 0 END,
        visible_at = CASE WHEN :visibility_timeout > 0
                     THEN LEAST(statement_timestamp() + make_interval(secs => :visibility_timeout),
                                job.claimed_at + interval '{LEASE_CAP_HOURS} hours')
                     ELSE statement_timestamp() END,
        lease_id = CASE WHEN :visibility_timeout > 0 THEN job.lease_id END,
        locked_by = CASE WHEN :visibility_timeout > 0 THEN job.locked_by END,
        finished_at = CASE WHEN decided.next_status IN ('CANCELLED', 'DEAD_LETTER')
                           THEN statement_timestamp() END,
        last_error = CASE WHEN decided.next_status = 'DEAD_LETTER'
                          THEN 'released too often: more than 3 x maxAttempts releases'
                          ELSE job.last_error END,
        -- A release says why in the job's history (not in last_error: it is no failure).
        errors = CASE WHEN :visibility_timeout = 0 THEN {
        _append_error(
            "jsonb_build_object('attempt', job.attempts, 'at', statement_timestamp(),"
            " 'error', 'released: ' || CAST(:reason AS text))"
        )
    } ELSE job.errors END,
        updated_at = statement_timestamp()
    FROM decided WHERE job.id = decided.id
    RETURNING job.queue, job.task_type, job.status, job.visible_at, job.cancel_requested
    """
)

_CANCEL = text(
    f"""
    UPDATE job SET
        -- Waiting jobs end now; a running one is asked to stop (its worker confirms).
        status = CASE WHEN status = 'PROCESSING' THEN status ELSE 'CANCELLED' END,
        cancel_requested = (status = 'PROCESSING'),
        finished_at = CASE WHEN status = 'PROCESSING' THEN NULL ELSE statement_timestamp() END,
        updated_at = statement_timestamp()
    WHERE id = :id AND status IN ('PENDING', 'SCHEDULED', 'PROCESSING')
    RETURNING {_JOB_COLUMNS}
    """
)

_CONFIRM_CANCELLED = text(
    f"""
    UPDATE job SET status = 'CANCELLED', locked_by = NULL,
                   finished_at = statement_timestamp(), updated_at = statement_timestamp()
    WHERE id = :id AND lease_id = :lease_id AND status = 'PROCESSING'
    RETURNING {_JOB_COLUMNS}
    """
)

_RESET_FOR_RETRY = """
        status = 'PENDING', attempts = 0, releases = 0, lease_id = NULL, locked_by = NULL,
        cancel_requested = false, result = NULL, claimed_at = NULL, finished_at = NULL,
        visible_at = statement_timestamp(), updated_at = statement_timestamp()
"""

# Only a finished, unsuccessful job may run again: a live job must never get a second copy.
_RETRY = text(
    f"""
    UPDATE job SET {_RESET_FOR_RETRY}
    WHERE id = :id AND status IN ('DEAD_LETTER', 'CANCELLED')
    RETURNING {_JOB_COLUMNS}
    """
)

_REDRIVE = text(
    f"""
    WITH picked AS (
        SELECT id FROM job
        WHERE status = 'DEAD_LETTER'
          AND (CAST(:queue AS text) IS NULL OR queue = :queue)
          AND (CAST(:task_type AS text) IS NULL OR task_type = :task_type)
        ORDER BY id
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    UPDATE job SET {_RESET_FOR_RETRY}
    FROM picked WHERE job.id = picked.id AND job.status = 'DEAD_LETTER'
    RETURNING job.queue
    """
)

_DELETE_FINISHED = text(
    """
    DELETE FROM job WHERE id IN (
        SELECT id FROM job
        -- Matches ix_job_retention's predicate, so this walks the index by finished_at.
        WHERE status = ANY(:statuses)
          AND finished_at < statement_timestamp() - make_interval(secs => :older_than)
        ORDER BY finished_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    """
).bindparams(bindparam("statuses", type_=ARRAY(String)))

_PROMOTE = text(
    """
    WITH due AS (
        SELECT id FROM job
        WHERE status = 'SCHEDULED' AND visible_at <= statement_timestamp()
        ORDER BY visible_at
        LIMIT :batch
        -- Several queue-service replicas promote concurrently; each takes different rows.
        FOR UPDATE SKIP LOCKED
    )
    UPDATE job SET status = 'PENDING', updated_at = statement_timestamp()
    FROM due WHERE job.id = due.id AND job.status = 'SCHEDULED'
    RETURNING job.queue
    """
)

_DEPTH = text(
    """
    SELECT queue, status, count(*) AS count,
           COALESCE(EXTRACT(EPOCH FROM max(statement_timestamp() - visible_at)
                                       FILTER (WHERE status = 'PENDING')), 0)::float8 AS oldest_age
    FROM job
    WHERE status IN ('PENDING', 'SCHEDULED', 'PROCESSING', 'DEAD_LETTER')
    GROUP BY queue, status
    """
)


_CONTENTION = {"40P01", "40001"}
"""deadlock_detected, serialization_failure: the transaction can simply be retried."""
_CONTENTION_RETRIES = 3


def _sqlstate(exc: DBAPIError) -> str | None:
    original = getattr(exc, "orig", None)
    code = getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)
    return str(code) if code else None


@contextlib.asynccontextmanager
async def _translated() -> AsyncIterator[None]:
    """Turn "database unreachable" driver errors into `ServiceUnavailable` (HTTP 503)."""
    try:
        yield
    except (OperationalError, InterfaceError, OSError, TimeoutError) as exc:
        logger.warning("database unavailable: %s", exc, extra={"event": "database_unavailable"})
        raise ServiceUnavailable("the database is unavailable; retry shortly") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise ServiceUnavailable("the database connection was lost; retry shortly") from exc
        raise


async def _wake(conn: AsyncConnection, counts: Mapping[str, int]) -> None:
    """Tell long-polling claimers on every replica how many jobs each queue just got; sent at
    commit, so a rolled-back change wakes nobody."""
    for queue, count in counts.items():
        await conn.execute(_NOTIFY, {"channel": WAKEUP_CHANNEL, "payload": f"{queue}:{count}"})


class JobRepository:
    """PostgreSQL access for jobs, over one SQLAlchemy `AsyncEngine` (asyncpg driver)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection]:
        async with _translated(), self._engine.begin() as conn:
            yield conn

    async def _first(self, statement: Executable, params: dict[str, Any]) -> RowMapping | None:
        """Run one statement in its own transaction; its first row, if any."""
        async with self._transaction() as conn:
            return (await conn.execute(statement, params)).mappings().first()

    async def _rows(self, statement: Executable, params: dict[str, Any]) -> Sequence[RowMapping]:
        """Run one statement in its own transaction; all its rows."""
        async with self._transaction() as conn:
            return (await conn.execute(statement, params)).mappings().all()

    async def ping(self) -> None:
        """Run `SELECT 1`; raises ServiceUnavailable when the database does not answer."""
        async with self._transaction() as conn:
            await conn.execute(text("SELECT 1"))

    async def insert_many(self, rows: list[JobRow]) -> list[Inserted]:
        """Insert `rows` in one statement (which also wakes claimers of queues that got ready
        jobs). Returns the jobs created; a row whose id or idempotency key exists is skipped."""
        if not rows:
            return []
        for attempt in range(_CONTENTION_RETRIES):
            try:
                async with self._transaction() as conn:
                    result = await conn.execute(_ENQUEUE, {"rows": encode_rows(rows)})
                    return [
                        Inserted(r["id"], r["queue"], r["task_type"], JobStatus(r["status"]))
                        for r in result.mappings().all()
                    ]
            except DBAPIError as exc:
                # The statement orders its rows, so a deadlock needs an outside party; the
                # loser is rolled back whole and simply tries again.
                if _sqlstate(exc) not in _CONTENTION or attempt == _CONTENTION_RETRIES - 1:
                    raise
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        raise AssertionError("unreachable")

    async def insert(self, row: JobRow) -> Inserted | None:
        """Insert one job; None when its id or idempotency key exists."""
        inserted = await self.insert_many([row])
        return inserted[0] if inserted else None

    async def find_existing(
        self, job_id: uuid.UUID, idempotency_key: str | None
    ) -> Existing | None:
        """The job holding this id or idempotency key (the id first), or None."""
        async with self._transaction() as conn:
            result = await conn.execute(_FIND_EXISTING, {"id": job_id, "key": idempotency_key})
            row = result.mappings().first()
        if row is None:
            return None
        return Existing(row["id"], JobStatus(row["status"]), row["request_hash"])

    async def get(self, job_id: uuid.UUID) -> tuple[JobView, uuid.UUID | None] | None:
        """The job and its current receipt handle (lease id), or None."""
        row = await self._first(_GET, {"id": job_id})
        return None if row is None else (_to_view(row), row["lease_id"])

    async def claim(
        self, queues: Sequence[str], worker: str, max_jobs: int, visibility_timeout: int
    ) -> list[JobMessage]:
        """Claim up to `max_jobs` PENDING jobs from `queues` in one statement.

        Each claimed job becomes PROCESSING with `attempts + 1`, a new receipt handle and a
        lease ending `visibility_timeout` seconds from now (database time). Returns them in
        claim order (priority descending, then id).
        """
        async with self._transaction() as conn:
            result = await conn.execute(
                _CLAIM,
                {
                    "queues": list(queues),
                    "worker": worker,
                    "max": max_jobs,
                    "visibility_timeout": visibility_timeout,
                },
            )
            rows = result.mappings().all()
        messages = [
            JobMessage(
                id=row["id"],
                task_type=row["task_type"],
                payload=row["payload"],
                attempts=row["attempts"],
                max_attempts=row["max_attempts"],
                timeout_seconds=row["timeout_seconds"],
                receipt_handle=row["lease_id"],
                visibility_timeout=visibility_timeout,
                visible_at=row["visible_at"],
                idempotency_key=row["idempotency_key"],
            )
            for row in rows
        ]
        order = {row["id"]: (-row["priority"], row["id"]) for row in rows}
        messages.sort(key=lambda m: order[m.id])
        return messages

    async def ack(self, job_id: uuid.UUID, lease_id: uuid.UUID, result: Any) -> Settled | None:
        """Complete the job if `lease_id` is its current lease; None when nothing changed."""
        row = await self._first(_ACK, {"id": job_id, "lease_id": lease_id, "result": result})
        if row is None:
            return None
        return Settled(_to_view(row), end_to_end_seconds=row["end_to_end"])

    async def ack_many(self, entries: list[dict[str, Any]]) -> list[Settled]:
        """Complete every entry (`{"id", "receipt_handle", "result"}`) whose handle is current,
        in one statement; returns the jobs this call completed."""
        rows = await self._rows(_ACK_MANY, {"entries": msgspec.json.encode(entries).decode()})
        return [Settled(_to_view(row), end_to_end_seconds=row["end_to_end"]) for row in rows]

    async def leases(
        self, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[uuid.UUID | None, JobStatus]]:
        """{id: (current receipt handle, status)} for the jobs among `ids` that exist."""
        async with self._transaction() as conn:
            rows = (await conn.execute(_LEASES, {"ids": list(ids)})).all()
        return {row.id: (row.lease_id, JobStatus(row.status)) for row in rows}

    async def fail(
        self,
        job_id: uuid.UUID,
        lease_id: uuid.UUID,
        *,
        error: str,
        retryable: bool,
        retry_after: float | None,
        jitter: float,
        base_delay: float,
        multiplier: float,
        max_delay: float,
    ) -> Settled | None:
        """Record a failed attempt if `lease_id` is current: SCHEDULED after a jittered backoff
        (seconds), or DEAD_LETTER when not retryable or out of attempts. None when stale."""
        params = {
            "id": job_id,
            "lease_id": lease_id,
            "error": error,
            "retryable": retryable,
            "retry_after": retry_after,
            "jitter": jitter,
            "base_delay": base_delay,
            "multiplier": multiplier,
            "max_delay": max_delay,
        }
        row = await self._first(_FAIL, params)
        return None if row is None else Settled(_to_view(row))

    async def reap_expired(self, batch: int = 500) -> list[Reaped]:
        """Return up to `batch` expired leases to PENDING, or DEAD_LETTER when out of attempts."""
        rows = await self._rows(_REAP, {"batch": batch, "history": ERRORS_HISTORY_MAX})
        return [Reaped(r["id"], r["queue"], r["task_type"], JobStatus(r["status"])) for r in rows]

    async def promote_due(self, batch: int = 500) -> dict[str, int]:
        """Promote up to `batch` due SCHEDULED jobs to PENDING and notify claimers, in one
        transaction. Returns how many were promoted per queue."""
        async with self._transaction() as conn:
            rows = (await conn.execute(_PROMOTE, {"batch": batch})).all()
            counts = Counter(queue for (queue,) in rows)
            await _wake(conn, counts)
        return dict(counts)

    async def heartbeat(
        self,
        job_id: uuid.UUID,
        lease_id: uuid.UUID,
        visibility_timeout: int,
        reason: str = "requested",
    ) -> Extended | None:
        """Extend the lease to `visibility_timeout` seconds from now (capped at 12 h after the
        claim), or release the job when it is 0, recording `released: <reason>` in its errors.
        None when `lease_id` is not current."""
        async with self._transaction() as conn:
            row = (
                (
                    await conn.execute(
                        _HEARTBEAT,
                        {
                            "id": job_id,
                            "lease_id": lease_id,
                            "visibility_timeout": visibility_timeout,
                            "reason": reason,
                        },
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                return None
            if row["status"] == JobStatus.PENDING:
                await _wake(conn, {row["queue"]: 1})
        return Extended(
            row["queue"],
            row["task_type"],
            JobStatus(row["status"]),
            row["visible_at"],
            row["cancel_requested"],
        )

    async def cancel(self, job_id: uuid.UUID) -> JobView | None:
        """Cancel a waiting job, or ask a running one to stop; None when the job is finished
        or unknown."""
        row = await self._first(_CANCEL, {"id": job_id})
        return None if row is None else _to_view(row)

    async def confirm_cancelled(self, job_id: uuid.UUID, lease_id: uuid.UUID) -> Settled | None:
        """A worker stopped the job after a cancel request; None when `lease_id` is stale."""
        row = await self._first(_CONFIRM_CANCELLED, {"id": job_id, "lease_id": lease_id})
        return None if row is None else Settled(_to_view(row))

    async def retry(self, job_id: uuid.UUID) -> JobView | None:
        """Make a DEAD_LETTER or CANCELLED job PENDING again with attempts and releases reset;
        None when the job is in any other state or unknown."""
        async with self._transaction() as conn:
            row = (await conn.execute(_RETRY, {"id": job_id})).mappings().first()
            if row is None:
                return None
            await _wake(conn, {row["queue"]: 1})
        return _to_view(row)

    async def redrive(self, queue: str | None, task_type: str | None, batch: int) -> int:
        """Move up to `batch` dead-lettered jobs (optionally of one queue / task type) back to
        PENDING in one statement; returns how many moved."""
        async with self._transaction() as conn:
            rows = (
                await conn.execute(
                    _REDRIVE, {"queue": queue, "task_type": task_type, "batch": batch}
                )
            ).all()
            await _wake(conn, Counter(name for (name,) in rows))
        return len(rows)

    async def delete_finished(
        self, statuses: Sequence[JobStatus], older_than: float, batch: int
    ) -> int:
        """Delete up to `batch` jobs in `statuses` finished more than `older_than` seconds ago,
        oldest first, in one short statement; returns how many were deleted."""
        async with self._transaction() as conn:
            result = await conn.execute(
                _DELETE_FINISHED,
                {"statuses": [s.value for s in statuses], "older_than": older_than, "batch": batch},
            )
        return int(result.rowcount)

    async def list_jobs(
        self,
        *,
        status: JobStatus | None,
        queue: str | None,
        task_type: str | None,
        before: uuid.UUID | None,
        limit: int,
    ) -> list[JobView]:
        """Jobs matching the filters with id < `before` (keyset), newest first, at most `limit`.

        Only the given filters enter the statement, so each combination gets its own plan
        (ix_job_status_id, ix_job_queue_id or the primary key, walked backwards).
        """
        conditions: list[str] = []
        params: dict[str, Any] = {"limit": limit}
        for column, value in (("status", status), ("queue", queue), ("task_type", task_type)):
            if value is not None:
                conditions.append(f"{column} = :{column}")
                params[column] = value
        if before is not None:
            conditions.append("id < :before")
            params["before"] = before
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        statement = text(f"SELECT {_JOB_COLUMNS} FROM job {where} ORDER BY id DESC LIMIT :limit")
        async with self._transaction() as conn:
            rows = (await conn.execute(statement, params)).mappings().all()
        return [_to_view(row) for row in rows]

    async def depth(self) -> list[DepthRow]:
        """Counts of live and dead-lettered jobs per (queue, status)."""
        rows = await self._rows(_DEPTH, {})
        return [
            DepthRow(r["queue"], JobStatus(r["status"]), r["count"], r["oldest_age"]) for r in rows
        ]

    async def now(self) -> datetime:
        """The database's clock (`statement_timestamp()`), which decides every visibility."""
        async with self._transaction() as conn:
            value: datetime = (
                await conn.execute(text("SELECT statement_timestamp()"))
            ).scalar_one()
        return value

    async def fire_schedule(
        self, name: str, cron: str, bucket: datetime, row: JobRow
    ) -> Inserted | None:
        """Fire recurring schedule `name` for the cron bucket starting at `bucket`: move its
        `last_bucket` forward and insert `row`, in one transaction. Returns the job created,
        or None when the bucket was not after the schedule's last one (another replica or an
        earlier run fired it; a lagging clock never fires an older bucket) or when the row's
        idempotency key already had a job."""
        async with self._transaction() as conn:
            advanced = (
                await conn.execute(
                    _ADVANCE_SCHEDULE,
                    {"name": name, "cron": cron, "bucket": bucket, "job_id": row.id},
                )
            ).first()
            if advanced is None:
                return None
            result = await conn.execute(_ENQUEUE, {"rows": encode_rows([row])})
            created = result.mappings().first()
            if created is None:
                await conn.execute(_FORGET_SCHEDULE_JOB, {"name": name})
                return None
        return Inserted(
            created["id"], created["queue"], created["task_type"], JobStatus(created["status"])
        )

    async def health(self) -> DatabaseHealth:
        """The oldest open transaction's age, the `job` table's live and dead tuples and the
        time since its last vacuum, in one cheap statement over PostgreSQL's statistics views."""
        row = await self._first(_HEALTH, {})
        assert row is not None
        return DatabaseHealth(
            row["oldest_transaction_age"],
            row["live_tuples"],
            row["dead_tuples"],
            row["last_vacuum_age"],
        )


# Upsert the schedule's state, but only forward: on a concurrent fire the second replica waits
# for the first's row lock, then sees its committed bucket and updates nothing.
_ADVANCE_SCHEDULE = text(
    """
    INSERT INTO schedule (name, cron, last_bucket, last_job_id, fired_at)
    VALUES (:name, :cron, :bucket, :job_id, statement_timestamp())
    ON CONFLICT (name) DO UPDATE
        SET cron = EXCLUDED.cron, last_bucket = EXCLUDED.last_bucket,
            last_job_id = EXCLUDED.last_job_id, fired_at = EXCLUDED.fired_at
        WHERE schedule.last_bucket < EXCLUDED.last_bucket
    RETURNING name
    """
)

# The bucket's job existed already (created under its idempotency key before the schedule table
# did): the bucket counts as fired, but no job of this call backs it.
_FORGET_SCHEDULE_JOB = text("UPDATE schedule SET last_job_id = NULL WHERE name = :name")


@dataclass(frozen=True, slots=True)
class DatabaseHealth:
    """What holds back or needs vacuum (read by `JobRepository.health`).

    `oldest_transaction_age_seconds`: age of the oldest open transaction in this database that
    holds a snapshot or a transaction id (0 when none), i.e. how far back the xmin horizon is
    pinned. `live_tuples`/`dead_tuples`: of the `job` table, from the statistics collector.
    `last_vacuum_age_seconds`: since the latest VACUUM or autovacuum of `job`, None before the
    first.
    """

    oldest_transaction_age_seconds: float
    live_tuples: int
    dead_tuples: int
    last_vacuum_age_seconds: float | None


# One cheap statement (catalog views, no table scan). Only client sessions of this database
# count: PostgreSQL computes the horizon for this database's tables from them (and prepared
# transactions); this session's own short statement is left out. Other roles' sessions show
# their times only to a superuser or a member of pg_read_all_stats.
_HEALTH = text(
    """
    SELECT GREATEST(
               (SELECT EXTRACT(EPOCH FROM max(clock_timestamp() - xact_start))
                FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()
                  AND backend_type = 'client backend'
                  AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)),
               (SELECT EXTRACT(EPOCH FROM max(clock_timestamp() - prepared))
                FROM pg_prepared_xacts WHERE database = current_database()),
               0)::float8 AS oldest_transaction_age,
           COALESCE(s.n_live_tup, 0) AS live_tuples,
           COALESCE(s.n_dead_tup, 0) AS dead_tuples,
           EXTRACT(EPOCH FROM clock_timestamp() - GREATEST(s.last_vacuum, s.last_autovacuum)
           )::float8 AS last_vacuum_age
    FROM (SELECT 1) AS one
    LEFT JOIN pg_stat_user_tables AS s ON s.relid = 'job'::regclass
    """
)
