"""What the database reports about its queues and itself, as plain values: read by the
repository, shown by the metrics and the depth cache (which so need not import the
repository)."""

from __future__ import annotations

from dataclasses import dataclass

from common.contracts import JobStatus


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


LIVE_STATUSES = (JobStatus.SCHEDULED, JobStatus.PENDING, JobStatus.PROCESSING)
"""The statuses of jobs still to run or running."""

DEPTH_STATUSES = (*LIVE_STATUSES, JobStatus.DEAD_LETTER)
"""The statuses `JobRepository.depth` counts."""


@dataclass(frozen=True, slots=True)
class DepthRow:
    """Count of jobs in one (queue, status), with the oldest PENDING job's age in seconds."""

    queue: str
    status: JobStatus
    count: int
    oldest_age_seconds: float


@dataclass(frozen=True, slots=True)
class LimitReading:
    """One limited (queue, task type): its `concurrency` limit (None: no bound of all its
    running jobs), the jobs of it PROCESSING now (`running`) and PENDING now (`waiting`,
    counted up to `WAITING_COUNTED`), and the tokens its rate limit's bucket holds now
    (`tokens`; None without a `rate`)."""

    queue: str
    task_type: str
    concurrency: int | None
    running: int
    waiting: int
    tokens: float | None = None


WAITING_COUNTED = 1_000
"""PENDING jobs of one limited (queue, task type) a depth refresh counts at most: enough to
tell a limit that holds work back from one that does not, at a bounded cost per refresh."""
