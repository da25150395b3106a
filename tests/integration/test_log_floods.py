"""Per-job log lines cannot flood the operators' logs: the queue service writes the first dead
letter of a task type, then folds the rest (`common.logging.RepeatedEvents`)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from common.contracts import ClaimRequest, EnqueueRequest, FailEntry, JobStatus
from services.queue.metrics import QueueMetrics
from services.queue.repository import JobRepository
from services.queue.service import QueueService
from services.queue.settings import QueueSettings
from services.queue.wakeup import WakeupHub


async def test_dead_letters_of_one_task_type_are_one_error_line(
    repository: JobRepository, clean_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    service = QueueService(
        repository,
        WakeupHub(),
        QueueSettings(database_url=clean_database),
        QueueMetrics(CollectorRegistry()),
        asyncio.Event(),
    )
    for task_type in ["junk"] * 60 + ["other"]:
        await service.enqueue(EnqueueRequest(task_type=task_type, payload={}, max_attempts=1))
    claimed, _ = await service.claim(
        ClaimRequest(worker="w", queues=["default"], max=100, wait_seconds=0)
    )
    assert len(claimed) == 61
    caplog.set_level(logging.INFO, logger="services.queue.service")
    failed = await service.fail_many(
        [
            FailEntry(id=job.id, receipt_handle=job.receipt_handle, error="unknown task type")
            for job in claimed
        ]
    )

    assert {result.job_status for result in failed.results} == {JobStatus.DEAD_LETTER}
    errors = [r for r in caplog.records if getattr(r, "event", "") == "job_dead_letter"]
    assert sorted(r.task_type for r in errors) == ["junk", "other"]
