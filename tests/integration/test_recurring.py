"""Recurring jobs: one job per schedule bucket, however many queue-service replicas fire."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.queue.history import History
from services.queue.metrics import QueueMetrics
from services.queue.recurring import Recurring
from services.queue.repository import JobRepository
from services.queue.schedules import Schedule, parse_schedules
from services.queue.service import QueueService
from services.queue.settings import QueueSettings
from services.queue.wakeup import WakeupHub

SCHEDULES = (
    '[{"name": "nightly", "cron": "*/5 * * * *", "taskType": "report", "payload": {"x": 1}}]'
)


YEARLY = '[{"name": "yearly", "cron": "0 0 1 1 *", "taskType": "noop", "queue": "y"}]'


def replica(
    repository: JobRepository,
    database_url: str,
    schedules: str = SCHEDULES,
    registry: CollectorRegistry | None = None,
) -> Recurring:
    """A queue-service replica's recurring firer (its own service object and metrics, on
    `registry`): a new one is what a restarted replica has, with nothing remembered in process."""
    service = QueueService(
        repository,
        WakeupHub(),
        QueueSettings(database_url=database_url),
        QueueMetrics(registry or CollectorRegistry()),
        asyncio.Event(),
    )
    return Recurring(service, parse_schedules(schedules))


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
    assert await job_keys(engine) == [
        "nightly:2026-11-29T10:05:00+00:00",
        "nightly:2026-11-29T10:10:00+00:00",
    ]


async def job_keys(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT idempotency_key FROM job_all ORDER BY 1"))
        return [str(key) for key in rows.scalars().all()]


async def test_a_bucket_whose_job_retention_deleted_does_not_fire_again_after_a_restart(
    engine: AsyncEngine, repository: JobRepository, clean_database: str
) -> None:
    moment = datetime(2026, 3, 14, 9, 0, 0, tzinfo=UTC)
    assert await replica(repository, clean_database, YEARLY).fire(moment) == 1
    [job] = await repository.claim(["y"], "w", 1, 30)
    assert await repository.ack_many([(job.id, job.receipt_handle, None)])
    # Retention drops the partition holding the finished job (a clock 3 days on).
    later_clock = datetime.now(UTC) + timedelta(days=3)
    assert (await History(repository, 86400, 0.0, 0.0).maintain(later_clock)).dropped

    restarted = [replica(repository, clean_database, YEARLY) for _ in range(2)]
    later = moment.replace(hour=10)
    again = await asyncio.gather(*(r.fire(later) for r in restarted))

    assert again == [0, 0], "the 1 January bucket was enqueued a second time"
    assert await job_keys(engine) == []
    next_year = await restarted[0].fire(datetime(2027, 1, 1, 0, 0, 1, tzinfo=UTC))
    assert next_year == 1
    assert await job_keys(engine) == ["yearly:2027-01-01T00:00:00+00:00"]


async def test_after_downtime_only_the_latest_missed_bucket_fires(
    engine: AsyncEngine, repository: JobRepository, clean_database: str
) -> None:
    before = replica(repository, clean_database)
    assert await before.fire(datetime(2026, 11, 29, 10, 7, 0, tzinfo=UTC)) == 1

    # Down from 10:07 to 10:37: six buckets (10:10 … 10:35) passed without a replica.
    after = [replica(repository, clean_database) for _ in range(2)]
    back = datetime(2026, 11, 29, 10, 37, 0, tzinfo=UTC)
    created = await asyncio.gather(*(r.fire(back) for r in after))

    assert sorted(created) == [0, 1]
    assert await job_keys(engine) == [
        "nightly:2026-11-29T10:05:00+00:00",
        "nightly:2026-11-29T10:35:00+00:00",
    ]
    async with engine.connect() as conn:
        state = (
            (await conn.execute(text("SELECT name, last_bucket FROM schedule"))).mappings().all()
        )
    assert [(s["name"], s["last_bucket"]) for s in state] == [
        ("nightly", datetime(2026, 11, 29, 10, 35, tzinfo=UTC))
    ]


async def test_an_earlier_bucket_never_fires_after_a_later_one(
    engine: AsyncEngine, repository: JobRepository, clean_database: str
) -> None:
    # A replica whose clock reading lags another's must not fire the older bucket. Around the
    # database's real clock: a stored bucket far ahead of it would be a clock stepped back.
    ahead, behind = replica(repository, clean_database), replica(repository, clean_database)
    current = parse_schedules(SCHEDULES)[0].bucket(await repository.now())
    assert await ahead.fire(current + timedelta(seconds=1)) == 1
    assert await behind.fire(current - timedelta(seconds=1)) == 0
    assert await job_keys(engine) == [f"nightly:{current.isoformat()}"]


async def test_a_clock_stepped_back_resumes_firing_at_the_current_bucket_once(
    engine: AsyncEngine,
    repository: JobRepository,
    clean_database: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stored bucket far ahead of the database's clock (the clock ran ahead, fired, and was
    stepped back) must not stop the schedule until the clock catches up (issue 16 item 10)."""
    registries = [CollectorRegistry(), CollectorRegistry()]
    first, second = (replica(repository, clean_database, registry=r) for r in registries)
    ahead = datetime(2100, 1, 1, 0, 7, 0, tzinfo=UTC)
    assert await first.fire(ahead) == 1  # the clock read 2100 when this bucket fired

    # Back to the database's real clock: both replicas tick at once; one rewinds and fires.
    with caplog.at_level(logging.WARNING, logger="services.queue.recurring"):
        created = await asyncio.gather(first.tick(), second.tick())
    assert sorted(created) == [0, 1]
    now = await repository.now()
    current = parse_schedules(SCHEDULES)[0].bucket(now)
    assert await job_keys(engine) == sorted(
        ["nightly:2100-01-01T00:05:00+00:00", f"nightly:{current.isoformat()}"]
    )
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT last_bucket FROM schedule"))).scalar_one()
    assert stored == current
    steps = [r for r in caplog.records if getattr(r, "event", "") == "schedule_clock_stepped_back"]
    assert len(steps) == 1 and "2100-01-01T00:05:00" in steps[0].getMessage()
    counted = [
        r.get_sample_value("jobq_schedule_clock_stepped_back_total", {"schedule": "nightly"})
        for r in registries
    ]
    assert sorted(c or 0.0 for c in counted) == [0.0, 1.0]

    # The current bucket never fires twice, from a restarted replica either.
    assert await first.tick() == 0 and await second.tick() == 0
    assert await replica(repository, clean_database).tick() == 0
    assert len(await job_keys(engine)) == 2


async def test_a_stored_bucket_within_one_period_ahead_is_not_a_clock_step(
    engine: AsyncEngine, repository: JobRepository, clean_database: str
) -> None:
    # Ahead by less than one period (a replica's read lagging another's): nothing is rewound.
    now = await repository.now()
    [schedule] = parse_schedules(SCHEDULES)
    following = schedule.bucket(now) + schedule.period(schedule.bucket(now))
    assert await replica(repository, clean_database).fire(following) == 1
    assert await replica(repository, clean_database).tick() == 0
    assert await job_keys(engine) == [f"nightly:{following.isoformat()}"]


def test_buckets_and_bad_schedules() -> None:
    [schedule] = parse_schedules(SCHEDULES)
    at = datetime(2026, 11, 29, 10, 5, 0, tzinfo=UTC)
    assert schedule.bucket(at) == at
    assert schedule.bucket(at.replace(minute=9, second=59)) == at
    every_second = Schedule(name="s", cron="* * * * * *", task_type="t")
    assert every_second.bucket(at.replace(microsecond=500)) == at
    assert every_second.period(at) == timedelta(seconds=1)
    assert schedule.period(at) == timedelta(minutes=5)
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
