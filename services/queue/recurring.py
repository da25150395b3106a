"""Recurring jobs: cron schedules from configuration, fired by every queue-service replica.

Each schedule's current *bucket* is the latest cron time at or before now (database time).
A bucket fires by moving the schedule's `last_bucket` (table `schedule`) forward in the same
transaction as the job's insert, so however many replicas fire, and however often they restart,
exactly one job exists per bucket, even long after retention deleted it (deduplication instead
of leader election, as pg-boss and River schedule; the state row is what their cron tables
keep). The job also carries the idempotency key `<name>:<bucket start>`.

First start and downtime: a schedule with no state fires its latest bucket at once; after
downtime only the latest missed bucket fires, once, never one job per missed bucket.

A clock stepped back: a stored bucket more than one period ahead of the database's clock
would block the schedule until the clock caught up with it (silently, for as long as the
step). The firing statement rewinds it to the current bucket instead, once however many
replicas fire, logged (WARNING `schedule_clock_stepped_back`) and counted
(`jobq_schedule_clock_stepped_back_total`); the bucket's idempotency key still keeps a job
the earlier timeline created for it from being created twice.
"""

from __future__ import annotations

import logging
from datetime import datetime

from common.contracts import EnqueueRequest
from services.queue.schedules import Schedule
from services.queue.service import QueueService

logger = logging.getLogger(__name__)


class Recurring:
    """Fires `schedules` through `service`. The database decides which replica fires a bucket;
    the last bucket seen per schedule is remembered in process only to spare the database a
    statement per schedule per tick."""

    def __init__(self, service: QueueService, schedules: list[Schedule]) -> None:
        self._service = service
        self._schedules = schedules
        self._fired: dict[str, datetime] = {}

    async def tick(self) -> int:
        """Fire every schedule whose bucket is new to this replica, at database time."""
        if not self._schedules:
            return 0
        return await self.fire(await self._service.now())

    async def fire(self, now: datetime) -> int:
        """Submit the current bucket's job of each schedule; returns how many were created
        by this call (0 when another replica got there first)."""
        created = 0
        for schedule in self._schedules:
            try:
                created += await self._fire_one(schedule, now)
            except Exception as exc:
                # One schedule's trouble must not keep the others from firing.
                logger.warning(
                    "schedule %s could not fire: %s",
                    schedule.name,
                    exc,
                    extra={"event": "schedule_failed", "schedule": schedule.name},
                )
        return created

    async def _fire_one(self, schedule: Schedule, now: datetime) -> int:
        bucket = schedule.bucket(now)
        # Only the very bucket seen is skipped: an earlier one means the clock went back, and
        # the database decides whether that is a lagging read or a step to rewind from.
        if self._fired.get(schedule.name) == bucket:
            return 0
        request = EnqueueRequest(
            task_type=schedule.task_type,
            queue=schedule.queue,
            payload=schedule.payload,
            priority=schedule.priority,
            idempotency_key=f"{schedule.name}:{bucket.isoformat()}",
        )
        firing = await self._service.enqueue_scheduled(
            schedule.name, schedule.cron, bucket, schedule.period(bucket), request
        )
        self._fired[schedule.name] = bucket
        if firing.rewound_from is not None:
            logger.warning(
                "schedule %s: its last bucket %s is more than one period ahead of the "
                "database's clock (%s); the clock was stepped back, firing again from %s",
                schedule.name,
                firing.rewound_from.isoformat(),
                now.isoformat(),
                bucket.isoformat(),
                extra={"event": "schedule_clock_stepped_back", "schedule": schedule.name},
            )
        created = firing.created
        if created is None:
            return 0
        logger.info(
            "schedule %s fired for %s",
            schedule.name,
            bucket.isoformat(),
            extra={"event": "schedule_fired", "job_id": str(created.id)},
        )
        return 1
