"""Wire types of the operator views: bulk changes by filter, purge, workers, schedules and
per-minute throughput (docs/architecture.md#operator-views). Both services and the clients
share them, as they share `common.contracts`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from common.contracts import BATCH_MAX, NAME_PATTERN, JobStatus, Name, _Wire

BULK_LIMIT_MAX = 1_000_000
"""Most jobs one bulk request changes; it runs as many short statements of `BULK_CHUNK`."""

BULK_CHUNK = 500
"""Jobs one statement of a bulk change touches, so no statement holds many row locks long."""

THROUGHPUT_MINUTES_MAX = 1440
"""Most minutes of per-minute counts one request reads (the table keeps a day by default)."""

BulkAction = Literal["retry", "cancel", "delete"]
"""`retry`: DEAD_LETTER/CANCELLED → PENDING; `cancel`: PENDING/SCHEDULED → CANCELLED (a
PROCESSING job is asked to stop); `delete`: COMPLETED/DEAD_LETTER/CANCELLED jobs removed."""


class BulkRequest(_Wire):
    """`POST /jobs/bulk`: apply `action` to the jobs matching the filter (or the listed `ids`),
    at most `limit` of them, in chunks of 500, each its own statement. `dryRun` only counts
    them (the count a confirmation states). A job the action does not apply to (a COMPLETED
    job for `retry`) is not matched, so the count is what would change."""

    action: BulkAction
    status: JobStatus | None = None
    queue: Name | None = None
    task_type: Name | None = None
    ids: Annotated[list[uuid.UUID], Meta(max_length=BATCH_MAX)] | None = None
    limit: Annotated[int, Meta(ge=1, le=BULK_LIMIT_MAX)] = BULK_LIMIT_MAX
    dry_run: bool = False


class BulkResponse(_Wire):
    """What a bulk request matched (counted before any change) and changed (0 on a dry run)."""

    action: BulkAction
    matched: int
    changed: int
    dry_run: bool


class PurgeRequest(_Wire):
    """`POST /queues/{queue}/pending/purge`: delete the queue's PENDING and SCHEDULED jobs.
    `confirm` must repeat the queue's name (as GitHub's "type the repository's name"), so a
    purge is never one slip; `dryRun` only counts."""

    confirm: Annotated[str, Meta(pattern=NAME_PATTERN)]
    dry_run: bool = False


class PurgeResponse(_Wire):
    """How many waiting jobs the purge matched and deleted."""

    queue: str
    matched: int
    deleted: int
    dry_run: bool


class WorkerView(_Wire):
    """A worker as the queue service saw it in its claims: `slotsTotal` its concurrency (null
    for a worker that does not say), `slotsInUse` the jobs it holds a live lease on now,
    `claimedLastMinute` a sliding-window estimate over the last 60 s."""

    name: str
    queues: list[str]
    slots_in_use: int
    slots_total: int | None
    claimed_last_minute: int
    last_seen: datetime


class WorkersResponse(_Wire):
    """Every worker seen within the last `liveSeconds`, by name."""

    workers: list[WorkerView]
    live_seconds: float


class ScheduleView(_Wire):
    """A recurring schedule: its configuration, the last cron bucket fired (by any replica)
    with its job, and when it fires next."""

    name: str
    cron: str
    queue: str
    task_type: str
    last_bucket: datetime | None
    last_job_id: uuid.UUID | None
    fired_at: datetime | None
    next_fire_at: datetime


class SchedulesResponse(_Wire):
    """Every configured schedule, by name."""

    schedules: list[ScheduleView]


class MinuteCount(_Wire):
    """Jobs of one queue settled in one clock minute: `completed`, and `failed` (attempts that
    failed, whether retried or dead-lettered)."""

    queue: str
    minute: datetime
    completed: int
    failed: int


class ThroughputResponse(_Wire):
    """Per-minute counts of the last `minutes` minutes, oldest first; minutes without a
    settle are absent."""

    minutes: int
    points: list[MinuteCount] = msgspec.field(default_factory=list)
