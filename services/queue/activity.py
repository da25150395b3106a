"""What the operator views read besides jobs: workers seen in claims and per-minute
completion and failure counts per queue (docs/architecture.md#operator-views).

Neither costs a write per claim or per job: `Activity` adds them up in memory and `flush`
writes everything a replica saw since its last flush with two statements (one upsert per
table, rows in key order so concurrent replicas never deadlock), every
`QUEUE_ACTIVITY_INTERVAL` seconds. Since the rows are in PostgreSQL, every replica reads the
same workers and counts. A replica that dies loses at most one interval of counts: these are
views for people, not accounting.

The workers' claim counts use the sliding-window counter of rate limiters (Cloudflare,
"How we built rate limiting capable of scaling to millions of domains", 2017): the counts of
the current and the previous clock minute, the previous one weighted by how much of it the
last 60 s still cover.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from croniter import croniter

from common.contracts import JobStatus
from common.operations import MinuteCount, ScheduleView, WorkerView
from services.queue import statements
from services.queue.repository import JobRepository, Settled
from services.queue.schedules import Schedule

logger = logging.getLogger(__name__)

_UPSERT_WORKERS = """
INSERT INTO worker AS w (name, queues, slots, last_seen, minute, claimed)
SELECT e.name, string_to_array(e.queues, ','), e.slots, statement_timestamp(),
       date_trunc('minute', statement_timestamp()), e.claimed
FROM unnest($1::text[], $2::text[], $3::int[], $4::int[]) AS e(name, queues, slots, claimed)
ORDER BY e.name
ON CONFLICT (name) DO UPDATE SET
    queues = EXCLUDED.queues,
    slots = COALESCE(EXCLUDED.slots, w.slots),
    last_seen = EXCLUDED.last_seen,
    previous_claimed = CASE WHEN w.minute = EXCLUDED.minute THEN w.previous_claimed
                            WHEN w.minute = EXCLUDED.minute - interval '1 minute' THEN w.claimed
                            ELSE 0 END,
    claimed = CASE WHEN w.minute = EXCLUDED.minute THEN LEAST(w.claimed::bigint
                   + EXCLUDED.claimed, 2147483647)::int ELSE EXCLUDED.claimed END,
    minute = EXCLUDED.minute
"""

_ADD_MINUTES = """
INSERT INTO queue_minute AS q (queue, minute, completed, failed)
SELECT e.queue, date_trunc('minute', statement_timestamp()), e.completed, e.failed
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS e(queue, completed, failed)
ORDER BY e.queue
ON CONFLICT (queue, minute) DO UPDATE SET
    completed = q.completed + EXCLUDED.completed, failed = q.failed + EXCLUDED.failed
"""

_FORGET = """
WITH old_minutes AS (
    DELETE FROM queue_minute WHERE minute < statement_timestamp() - make_interval(secs => $1)
    RETURNING 1
), old_workers AS (
    DELETE FROM worker WHERE last_seen < statement_timestamp() - make_interval(secs => $1)
    RETURNING 1
)
SELECT (SELECT count(*) FROM old_minutes) + (SELECT count(*) FROM old_workers) AS forgotten
"""

# A busy worker claims nothing while its slots are full but heartbeats its leases: its live
# leases (PROCESSING rows it holds, read through the reaper's partial index) keep it seen.
_WORKERS = """
WITH held AS (
    SELECT locked_by, count(*) AS in_use, max(updated_at) AS touched
    FROM job WHERE status = 'PROCESSING' AND locked_by IS NOT NULL
    GROUP BY locked_by
), now AS (
    SELECT statement_timestamp() AS at, date_trunc('minute', statement_timestamp()) AS minute
)
SELECT w.name, w.queues, w.slots, COALESCE(held.in_use, 0) AS in_use,
       GREATEST(w.last_seen, held.touched) AS last_seen,
       round(CASE
           WHEN w.minute = now.minute THEN w.claimed + w.previous_claimed
                * (1 - EXTRACT(EPOCH FROM now.at - now.minute) / 60)
           WHEN w.minute = now.minute - interval '1 minute' THEN w.claimed
                * (1 - EXTRACT(EPOCH FROM now.at - now.minute) / 60)
           ELSE 0 END)::bigint AS claimed_last_minute
FROM worker AS w CROSS JOIN now LEFT JOIN held ON held.locked_by = w.name
WHERE GREATEST(w.last_seen, held.touched) > now.at - make_interval(secs => $1)
ORDER BY w.name
"""

_THROUGHPUT = """
SELECT queue, minute, completed, failed FROM queue_minute
WHERE minute > date_trunc('minute', statement_timestamp()) - make_interval(mins => $1)
  AND ($2::text[] IS NULL OR queue = ANY($2::text[]))
ORDER BY minute, queue
"""

_SCHEDULES = "SELECT name, last_bucket, last_job_id, fired_at FROM schedule"


@dataclass(slots=True)
class _Seen:
    queues: tuple[str, ...]
    slots: int | None
    claimed: int = 0


@dataclass(slots=True)
class Activity:
    """Claims and settles seen by this replica since its last `flush` (in memory)."""

    repository: JobRepository
    retention: float
    """Seconds per-minute counts and silent workers are kept."""
    _workers: dict[str, _Seen] = field(default_factory=dict)
    _completed: Counter[str] = field(default_factory=Counter)
    _failed: Counter[str] = field(default_factory=Counter)

    def claimed(self, worker: str, queues: list[str], slots: int | None, count: int) -> None:
        """A claim by `worker` of `queues` (`slots`: its concurrency, if it said) got `count`
        jobs; an empty claim still says the worker is alive."""
        seen = self._workers.get(worker)
        if seen is None:
            seen = self._workers[worker] = _Seen(tuple(queues), slots)
        else:
            seen.queues, seen.slots = tuple(queues), slots if slots is not None else seen.slots
        seen.claimed += count

    def settled(self, jobs: Sequence[Settled]) -> None:
        """Count completions, and failed attempts (retried or dead-lettered), per queue."""
        for job in jobs:
            if job.status is JobStatus.COMPLETED:
                self._completed[job.queue] += 1
            elif job.status in _FAILED:
                self._failed[job.queue] += 1

    async def flush(self) -> int:
        """Write what was seen since the last flush (two statements at most) and forget rows
        older than `retention`; returns how many rows were written. What a failed write held
        is dropped, not retried: the next interval's counts must not wait behind it."""
        workers, self._workers = self._workers, {}
        completed, self._completed = self._completed, Counter()
        failed, self._failed = self._failed, Counter()
        written = 0
        if workers:
            names = sorted(workers)
            await self.repository.execute(
                _UPSERT_WORKERS,
                names,
                [",".join(workers[n].queues) for n in names],
                [workers[n].slots for n in names],
                [workers[n].claimed for n in names],
            )
            written += len(names)
        queues = sorted(set(completed) | set(failed))
        if queues:
            await self.repository.execute(
                _ADD_MINUTES, queues, [completed[q] for q in queues], [failed[q] for q in queues]
            )
            written += len(queues)
        await self.repository.execute(_FORGET, self.retention)
        return written

    async def workers(self, live_seconds: float) -> list[WorkerView]:
        """Workers seen (a claim, or a lease touched) within `live_seconds`, by name."""
        rows = await self.repository.fetch(_WORKERS, live_seconds)
        return [
            WorkerView(
                name=r["name"],
                queues=list(r["queues"]),
                slots_in_use=r["in_use"],
                slots_total=r["slots"],
                claimed_last_minute=r["claimed_last_minute"],
                last_seen=r["last_seen"],
            )
            for r in rows
        ]

    async def throughput(self, minutes: int, queues: list[str] | None) -> list[MinuteCount]:
        """Per-minute counts of the last `minutes` minutes (of `queues`, None: all), oldest
        first."""
        rows = await self.repository.fetch(_THROUGHPUT, minutes, queues)
        return [
            MinuteCount(
                queue=r["queue"], minute=r["minute"], completed=r["completed"], failed=r["failed"]
            )
            for r in rows
        ]

    async def schedules(self, configured: list[Schedule]) -> list[ScheduleView]:
        """The `configured` schedules with their stored state and next fire time."""
        stored = {r["name"]: r for r in await self.repository.fetch(_SCHEDULES)}
        now = datetime.now(UTC)
        views = []
        for schedule in configured:
            row = stored.get(schedule.name)
            views.append(
                ScheduleView(
                    name=schedule.name,
                    cron=schedule.cron,
                    queue=schedule.queue,
                    task_type=schedule.task_type,
                    last_bucket=row["last_bucket"] if row else None,
                    last_job_id=row["last_job_id"] if row else None,
                    fired_at=row["fired_at"] if row else None,
                    next_fire_at=croniter(schedule.cron, now).get_next(datetime),
                )
            )
        return views


_FAILED = frozenset({JobStatus.SCHEDULED, JobStatus.PENDING, JobStatus.DEAD_LETTER})
"""Statuses a failed attempt leaves a job in (retried, or out of attempts)."""


statements.register(globals())
