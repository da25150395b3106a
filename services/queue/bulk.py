"""Bulk changes by filter: retry, cancel or delete every matching job, and purge a queue's
waiting jobs (docs/architecture.md#bulk-changes).

A bulk change of 100,000 jobs must neither time out nor hold 100,000 row locks: it runs as
chunks of `BULK_CHUNK` jobs, each one short statement of its own (the redrive's pattern), that
picks the next matching rows with `FOR UPDATE SKIP LOCKED` and changes them. A row a worker
holds locked at that moment is skipped, not waited for. The count a confirmation states is
taken first with the same filter, bounded by the request's limit.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.contracts import FINISHED_STATUSES, JobStatus
from common.errors import InvalidInput
from common.operations import BULK_CHUNK, BulkAction
from services.queue import statements
from services.queue.repository import JobRepository, _notify_ready, archive, revive

ALLOWED: dict[str, tuple[JobStatus, ...]] = {
    "retry": (JobStatus.DEAD_LETTER, JobStatus.CANCELLED),
    "cancel": (JobStatus.PENDING, JobStatus.SCHEDULED, JobStatus.PROCESSING),
    "delete": (JobStatus.COMPLETED, JobStatus.DEAD_LETTER, JobStatus.CANCELLED),
    "purge": (JobStatus.PENDING, JobStatus.SCHEDULED),
}
"""The statuses each action applies to; other jobs are never matched."""

TABLE = {"retry": "job_history", "delete": "job_history", "cancel": "job", "purge": "job"}
"""Where each action's jobs are: finished ones in the history, live ones in `job`."""

_CHANGE = {
    # Back from the history to the live table, in one statement per chunk.
    "retry": f"""
, revived AS (
    DELETE FROM job_history
    WHERE job_history.id = ANY(ARRAY(SELECT id FROM picked))
      AND job_history.status IN ({{statuses}})
    RETURNING job_history.*
), changed AS (
    {revive("revived")}
    RETURNING queue, status
), woken AS ({_notify_ready("changed")})
SELECT count(*) AS changed, (SELECT count(*) FROM woken) AS notified FROM changed""",
    # As the single cancel: waiting jobs end now (moved to the history), a running one is
    # asked to stop.
    "cancel": f"""
, finished AS (
    DELETE FROM job
    WHERE job.id = ANY(ARRAY(SELECT id FROM picked)) AND job.status IN ('PENDING', 'SCHEDULED')
      AND job.status IN ({{statuses}})
    RETURNING job.*
), archived AS (
    {
        archive(
            "finished",
            status="'CANCELLED'",
            cancel_requested="false",
            finished_at="statement_timestamp()",
            updated_at="statement_timestamp()",
        )
    }
    RETURNING 1
), asked AS (
    UPDATE job SET cancel_requested = true, updated_at = statement_timestamp()
    WHERE job.id = ANY(ARRAY(SELECT id FROM picked)) AND job.status = 'PROCESSING'
      AND job.status IN ({{statuses}})
    RETURNING 1
)
SELECT (SELECT count(*) FROM archived) + (SELECT count(*) FROM asked) AS changed""",
    "delete": """
, changed AS (
    DELETE FROM job_history WHERE job_history.id = ANY(ARRAY(SELECT id FROM picked))
                              AND job_history.status IN ({statuses})
    RETURNING 1
)
SELECT count(*) AS changed FROM changed""",
    "purge": """
, changed AS (
    DELETE FROM job WHERE job.id = ANY(ARRAY(SELECT id FROM picked))
                      AND job.status IN ({statuses})
    RETURNING 1
)
SELECT count(*) AS changed FROM changed""",
}


@dataclass(frozen=True, slots=True)
class Filter:
    """Which jobs a bulk change means: any of `statuses` (already narrowed to the action's),
    optionally of one queue, task type and tenant, or one of `ids`."""

    statuses: tuple[JobStatus, ...]
    queue: str | None = None
    task_type: str | None = None
    tenant: str | None = None
    ids: Sequence[uuid.UUID] | None = None

    def where(self) -> tuple[str, list[Any]]:
        """The WHERE clause and its parameters ($1…); statuses as literals from the enum, so
        the planner can match the partial indexes."""
        literals = ", ".join(f"'{status.value}'" for status in self.statuses)
        conditions = [f"status IN ({literals})"]
        args: list[Any] = []
        for column, value in (
            ("queue", self.queue),
            ("task_type", self.task_type),
            ("tenant", self.tenant),
        ):
            if value is not None:
                args.append(value)
                conditions.append(f"{column} = ${len(args)}")
        if self.ids is not None:
            args.append(list(self.ids))
            conditions.append(f"id = ANY(${len(args)}::uuid[])")
        # A running job asked to stop already is not matched again by a cancel.
        if JobStatus.PROCESSING in self.statuses:
            conditions.append("NOT (status = 'PROCESSING' AND cancel_requested)")
        return " AND ".join(conditions), args


def narrowed(action: BulkAction | str, status: JobStatus | None) -> tuple[JobStatus, ...]:
    """The statuses `action` applies to, narrowed to `status` when one is asked for. Raises
    InvalidInput (pointer `/status`) when the action never applies to that status."""
    allowed = ALLOWED[action]
    if status is None:
        return allowed
    if status not in allowed:
        raise InvalidInput(
            f"{action} applies to {', '.join(allowed)} jobs, not {status}",
            errors=[{"pointer": "/status", "detail": f"not a status {action} applies to"}],
        )
    return (status,)


def _table(statuses: Sequence[JobStatus]) -> str:
    return "job_history" if set(statuses) <= FINISHED_STATUSES else "job"


async def count(repository: JobRepository, where: Filter, limit: int) -> int:
    """How many jobs match `where`, counting at most `limit`."""
    condition, args = where.where()
    args.append(limit)
    table = _table(where.statuses)
    statement = (
        f"SELECT count(*) AS n FROM (SELECT 1 FROM {table} WHERE {condition} LIMIT ${len(args)}) m"
    )
    rows = await repository.fetch(statements.named("bulk_count", statement), *args)
    return int(rows[0]["n"])


async def apply(repository: JobRepository, action: str, where: Filter, limit: int) -> int:
    """Apply `action` to at most `limit` jobs matching `where`, `BULK_CHUNK` per statement;
    returns how many changed. Stops at the first chunk that changed fewer than it asked for
    (nothing left, or the rest locked by others at that moment)."""
    condition, args = where.where()
    args.append(0)
    at = len(args)
    statement = statements.named(
        f"bulk_{action}",
        f"WITH picked AS (SELECT id FROM {TABLE[action]} WHERE {condition} ORDER BY id LIMIT ${at} "
        f"FOR UPDATE SKIP LOCKED)"
        + _CHANGE[action].format(statuses=", ".join(f"'{s.value}'" for s in where.statuses)),
    )
    changed = 0
    while changed < limit:
        chunk = min(BULK_CHUNK, limit - changed)
        args[at - 1] = chunk
        rows = await repository.fetch(statement, *args)
        done = int(rows[0]["changed"])
        changed += done
        if done < chunk:
            break
    return changed
