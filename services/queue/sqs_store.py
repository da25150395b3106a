"""The SQS queue registry in PostgreSQL (`sqs_queue`), and the two job moves an SQS endpoint
needs that jobq's own API does not have: dead letters into a separate dead-letter queue and
back (SQS RedrivePolicy, StartMessageMoveTask), and purging a queue's messages.

Only the SQS endpoint uses these, through `services.queue.sqs_routes`
(docs/architecture.md#sqs-compatibility).
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from common.errors import QueueExists, QueueNotFound
from common.sqs_registry import SqsQueue
from services.queue import statements
from services.queue.repository import (
    _RESET_FOR_RETRY,
    RESET_VALUES,
    JobRepository,
    _moved_into,
    _notify_ready,
)

_COLUMNS = "tenant, name, queue, attributes, created_at, updated_at"

# A declaration is idempotent: the same (tenant, name) with the same attributes is a replay.
# `xmax = 0` tells a row this statement inserted from one it found.
_DECLARE = f"""
INSERT INTO sqs_queue AS q (tenant, name, queue, attributes)
VALUES ($1, $2, $3, $4::jsonb)
ON CONFLICT (tenant, name) DO UPDATE SET tenant = q.tenant
RETURNING {_COLUMNS}, (xmax = 0) AS created
"""

_GET = f"SELECT {_COLUMNS} FROM sqs_queue WHERE tenant = $1 AND name = $2"

_LIST = f"""
SELECT {_COLUMNS} FROM sqs_queue
WHERE ($1::text IS NULL OR tenant = $1) AND name LIKE $2 || '%' AND ($3::text IS NULL OR name > $3)
ORDER BY name LIMIT $4
"""

# An empty value removes the attribute; the others are set.
_SET_ATTRIBUTES = f"""
UPDATE sqs_queue SET
    attributes = (SELECT coalesce(jsonb_object_agg(key, value), '{{}}'::jsonb)
                  FROM jsonb_each(attributes || $3::jsonb) WHERE value <> '""'::jsonb),
    updated_at = statement_timestamp()
WHERE tenant = $1 AND name = $2
RETURNING {_COLUMNS}
"""

_UNFINISHED = "('PENDING', 'SCHEDULED', 'PROCESSING')"
_PURGE = f"DELETE FROM job WHERE queue = $1 AND status IN {_UNFINISHED}"
_DELETE = "DELETE FROM sqs_queue WHERE tenant = $1 AND name = $2 RETURNING queue"

# Like the dead-letter redrive (repository._REDRIVE), but into another queue, and also for
# messages waiting in an SQS dead-letter queue (moved back to their source): dead letters come
# back from the history ($3 is 'DEAD_LETTER'), waiting messages stay in `job` ($3 'PENDING').
_MOVE_LIVE = f"""
WITH picked AS (
    SELECT id FROM job WHERE queue = $1 AND status = $3 ORDER BY id LIMIT $5
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE job SET queue = $2, max_attempts = $4, {_RESET_FOR_RETRY}
    WHERE job.id = ANY(ARRAY(SELECT id FROM picked)) AND job.status = $3
    RETURNING job.queue, job.status
), woken AS ({_notify_ready("moved")})
SELECT count(*) AS moved, (SELECT count(*) FROM woken) AS notified FROM moved
"""

_MOVED_DEAD = {**RESET_VALUES, "queue": "$2::text", "max_attempts": "$4::int"}

_MOVE_DEAD = f"""
WITH picked AS (
    SELECT id FROM job_history WHERE queue = $1 AND status = $3 ORDER BY id LIMIT $5
    FOR UPDATE SKIP LOCKED
), revived AS (
    DELETE FROM job_history
    WHERE job_history.id = ANY(ARRAY(SELECT id FROM picked)) AND job_history.status = $3
    RETURNING job_history.*
), moved AS (
    {_moved_into("job", "revived", _MOVED_DEAD)}
    RETURNING queue, status
), woken AS ({_notify_ready("moved")})
SELECT count(*) AS moved, (SELECT count(*) FROM woken) AS notified FROM moved
"""


def _queue(row: asyncpg.Record) -> SqsQueue:
    return SqsQueue(
        tenant=row["tenant"],
        name=row["name"],
        queue=row["queue"],
        attributes=dict(row["attributes"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class SqsStore:
    """The `sqs_queue` table and the SQS job moves, over the repository's pool (its errors:
    ServiceUnavailable when the database is)."""

    def __init__(self, repository: JobRepository) -> None:
        self._repository = repository

    async def declare(
        self, tenant: str, name: str, queue: str, attributes: dict[str, str]
    ) -> tuple[SqsQueue, bool]:
        """Declare the SQS queue `name` of `tenant` as jobq queue `queue` with `attributes`;
        returns it and whether it was created. An existing one is returned as it is (its
        attributes may differ: SQS's QueueNameExists is for the endpoint to decide). Raises
        QueueExists when another SQS queue already maps to `queue`."""
        async with self._repository.connection() as conn:
            try:
                row = await conn.fetchrow(_DECLARE, tenant, name, queue, attributes)
            except asyncpg.UniqueViolationError:
                raise QueueExists(
                    f"the jobq queue {queue!r} already belongs to another SQS queue"
                ) from None
        assert row is not None
        return _queue(row), bool(row["created"])

    async def get(self, tenant: str, name: str) -> SqsQueue:
        """The SQS queue `name` of `tenant`; raises QueueNotFound."""
        async with self._repository.connection() as conn:
            row = await conn.fetchrow(_GET, tenant, name)
        if row is None:
            raise QueueNotFound(f"no SQS queue {name!r} in account {tenant!r}")
        return _queue(row)

    async def list(
        self, tenant: str | None, prefix: str, after: str | None, limit: int
    ) -> tuple[list[SqsQueue], str | None]:
        """Up to `limit` queues of `tenant` (None: every tenant) whose names start with
        `prefix`, by name after `after`; and the name to continue after (None: no more)."""
        async with self._repository.connection() as conn:
            rows = await conn.fetch(_LIST, tenant, _like_escaped(prefix), after, limit + 1)
        items = [_queue(row) for row in rows[:limit]]
        return items, (items[-1].name if len(rows) > limit else None)

    async def set_attributes(self, tenant: str, name: str, attributes: dict[str, str]) -> SqsQueue:
        """Set `attributes` (an empty value removes one); raises QueueNotFound."""
        async with self._repository.connection() as conn:
            row = await conn.fetchrow(_SET_ATTRIBUTES, tenant, name, attributes)
        if row is None:
            raise QueueNotFound(f"no SQS queue {name!r} in account {tenant!r}")
        return _queue(row)

    async def purge(self, tenant: str, name: str) -> int:
        """Delete the unfinished jobs (PENDING, SCHEDULED, PROCESSING) of the queue; how many.
        A message in flight loses its receipt handle. Raises QueueNotFound."""
        queue = (await self.get(tenant, name)).queue
        async with self._repository.connection() as conn:
            done: str = await conn.execute(_PURGE, queue)
        return int(done.rsplit(" ", 1)[-1])

    async def delete(self, tenant: str, name: str) -> int:
        """Forget the queue and delete its unfinished jobs, in one transaction; returns how
        many jobs were deleted (finished ones stay for history). Raises QueueNotFound."""
        async with self._repository.connection() as conn, conn.transaction():
            queue = await conn.fetchval(_DELETE, tenant, name)
            if queue is None:
                raise QueueNotFound(f"no SQS queue {name!r} in account {tenant!r}")
            done: str = await conn.execute(_PURGE, queue)
        return int(done.rsplit(" ", 1)[-1])

    async def move(
        self, source: str, destination: str, status: str, max_attempts: int, limit: int
    ) -> int:
        """Move up to `limit` jobs of queue `source` in `status` (DEAD_LETTER or PENDING) to
        `destination`, PENDING with attempts reset and `max_attempts`, waking its long polls;
        in statements of at most 500 jobs. Returns how many moved."""
        moved = 0
        while moved < limit:
            batch = min(500, limit - moved)
            async with self._repository.connection() as conn:
                statement = _MOVE_DEAD if status == "DEAD_LETTER" else _MOVE_LIVE
                row = await conn.fetchrow(
                    statement, source, destination, status, max_attempts, batch
                )
            count = int(row["moved"]) if row is not None else 0
            moved += count
            if count < batch:
                break
        return moved


def _like_escaped(prefix: str) -> str:
    """`prefix` with LIKE's wildcards escaped (`_` is a legal SQS name character)."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


__all__: Sequence[str] = ["SqsStore"]


statements.register(globals(), prefix="sqs_")
