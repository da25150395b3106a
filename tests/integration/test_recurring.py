"""Recurring jobs: one job per schedule bucket, however many queue-service replicas fire."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.queue.metrics import QueueMetrics
from services.queue.recurring import Recurring, Schedule, parse_schedules
from services.queue.repository import JobRepository
from services.queue.service import QueueService
from services.queue.settings import QueueSettings
from services.queue.wakeup import WakeupHub

SCHEDULES = (
    '[{"name": "nightly", "cron": "*/5 * * * *", "taskType": "report", "payload": {"x": 1}}]'
)


def replica(repository: JobRepository, database_url: str) -> Recurring:
    """A queue-service replica's recurring firer (its own service object and metrics)."""
    service = QueueService(
        repository,
        WakeupHub(),
        QueueSettings(database_url=database_url),
        QueueMetrics(CollectorRegistry()),
        asyncio.Event(),
    )
    return Recurring(service, parse_schedules(SCHEDULES))


async def test_two_replicas_firing_one_bucket_create_one_job(
    engine: AsyncEngine, repository: JobRepository, clean_database: str
) -> None:
    first, second = replica(repository, clean_database), replica(repository, clean_database)
    moment = datetime(2026, 11, 29, 10, 7, 13, tzinfo=UTC)

    created = await asyncio.gather(first.fire(moment), second.fire(moment))
    again = await first.fire(datetime(2026, 11, 29, 10, 9, 59, tzinfo=UTC))
    next_bucket = await second.fire(datetime(2026, 11, 29, 10, 10, 0, tzinfo=UTC))

    assert sorted(created) == [0, 1]
    assert again == 0 and next_bucket == 1
    async with engine.connect() as conn:
        keys = (
            (await conn.execute(text("SELECT idempotency_key FROM job ORDER BY 1"))).scalars().all()
        )
    assert keys == ["nightly:2026-11-29T10:05:00+00:00", "nightly:2026-11-29T10:10:00+00:00"]


def test_buckets_and_bad_schedules() -> None:
    [schedule] = parse_schedules(SCHEDULES)
    at = datetime(2026, 11, 29, 10, 5, 0, tzinfo=UTC)
    assert schedule.bucket(at) == at
    assert schedule.bucket(at.replace(minute=9, second=59)) == at
    every_second = Schedule(name="s", cron="* * * * * *", task_type="t")
    assert every_second.bucket(at.replace(microsecond=500)) == at
    for bad in (
        '[{"name": "x", "cron": "every day", "taskType": "t"}]',
        '[{"name": "x", "cron": "* * * * *", "taskType": "t", "typo": 1}]',
        '[{"name": "x", "cron": "* * * * *", "taskType": "t"},'
        ' {"name": "x", "cron": "0 * * * *", "taskType": "t"}]',
        '[{"name": "x", "cron": "0 0 31 2 *", "taskType": "t"}]',
        '[{"name": "x", "cron": "* * * * * * *", "taskType": "t"}]',
        '[{"name": "x", "cron": "* * * * *\\n", "taskType": "t"}]',
        '[{"name": "x", "cron": "* * * * *", "taskType": "t", "payload": {"a": "\\u0000"}}]',
    ):
        with pytest.raises(ValueError):
            parse_schedules(bad)
