"""Acks carried by a claim are answered when they commit (issue 16 item 8), against the real
queue service and PostgreSQL: a claim carrying acks never enters the long-poll wait, and the
worker's claim→settle sample is observed before its next long poll begins.

The long-poll wait is observed through a `WakeupHub` that records who enters it, so nothing
here depends on how long anything takes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common.contracts import AckEntry, ClaimRequest, JobStatus
from common.web.http import ServiceClient
from jobq.processors import JobContext, ProcessorRegistry
from services.queue import app as queue_app
from services.queue.app import create_app
from services.queue.metrics import QueueMetrics
from services.queue.repository import JobRepository
from services.queue.service import QueueService
from services.queue.settings import QueueSettings
from services.queue.wakeup import WakeupHub
from services.worker.client import QueueClient
from services.worker.metrics import WorkerMetrics
from services.worker.runner import Worker
from services.worker.settings import WorkerSettings
from tests.conftest import serving
from tests.helpers import new_job


class RefusingHub(WakeupHub):
    """A hub whose wait is a test failure: the claim under test must not long-poll."""

    async def wait(self, queues: Iterable[str], within: float, *also: asyncio.Future[Any]) -> None:
        raise AssertionError("a claim carrying acks entered the long-poll wait")


async def test_a_claim_carrying_acks_on_an_empty_queue_answers_without_waiting(
    repository: JobRepository,
) -> None:
    settings = QueueSettings(database_url="postgresql://unused")
    service = QueueService(
        repository, RefusingHub(), settings, QueueMetrics(CollectorRegistry()), asyncio.Event()
    )
    created = await repository.insert(new_job())
    assert created is not None
    [job] = await repository.claim(["default"], "w", 1, 30)

    jobs, acks = await service.claim(
        ClaimRequest(
            worker="w",
            queues=["default"],
            max=4,
            wait_seconds=20,
            acks=[AckEntry(id=job.id, receipt_handle=job.receipt_handle, result={"ok": 1})],
        )
    )

    assert jobs == []
    assert [(ack.id, ack.status) for ack in acks] == [(job.id, 200)]
    view = await service.get(job.id)
    assert view.status is JobStatus.COMPLETED and view.result == {"ok": 1}


async def test_a_claim_carrying_acks_still_returns_the_jobs_it_finds(
    repository: JobRepository,
) -> None:
    settings = QueueSettings(database_url="postgresql://unused")
    service = QueueService(
        repository, RefusingHub(), settings, QueueMetrics(CollectorRegistry()), asyncio.Event()
    )
    for _ in range(3):
        await repository.insert(new_job())
    [job] = await repository.claim(["default"], "w", 1, 30)

    jobs, acks = await service.claim(
        ClaimRequest(
            worker="w",
            queues=["default"],
            max=4,
            wait_seconds=20,
            acks=[AckEntry(id=job.id, receipt_handle=job.receipt_handle)],
        )
    )

    assert len(jobs) == 2, "the batching under load: acks and the next jobs in one round trip"
    assert [ack.status for ack in acks] == [200]


class WatchingHub(WakeupHub):
    """A real hub that, each time a claim enters the long-poll wait, compares what PostgreSQL
    says (jobs completed) with what the worker has observed (claim→settle samples)."""

    def __init__(self, repository: JobRepository, samples: Any) -> None:
        super().__init__()
        self.repository = repository
        self.samples = samples
        self.job_id: uuid.UUID | None = None
        self.late: list[str] = []
        self.after_commit = asyncio.Event()

    async def wait(self, queues: Iterable[str], within: float, *also: asyncio.Future[Any]) -> None:
        if self.job_id is not None:
            view = await self.repository.get(self.job_id)
            if view is not None and view[0].status is JobStatus.COMPLETED:
                observed = self.samples()
                if observed < 1:
                    self.late.append(f"ack committed, {observed} claim→settle samples observed")
                self.after_commit.set()
        await super().wait(queues, within, *also)


async def test_the_settle_sample_is_observed_when_the_carried_ack_commits(
    clean_database: str, repository: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, 4)

    def samples() -> float:
        value = registry.get_sample_value("jobq_worker_claim_to_settle_seconds_count")
        return value or 0.0

    hub = WatchingHub(repository, samples)
    monkeypatch.setattr(queue_app, "WakeupHub", lambda: hub)
    processors = ProcessorRegistry()

    async def instant(job: JobContext) -> dict[str, Any]:
        return {"done": True}

    processors.register("noop", instant)
    settings = WorkerSettings(worker_wait_seconds=20, worker_concurrency=4)
    async with (
        serving(create_app(QueueSettings(database_url=clean_database))) as http,
        ServiceClient(str(http.base_url)) as service_client,
    ):
        worker = Worker(settings, QueueClient(service_client, "w1"), processors, metrics)
        shutdown = asyncio.Event()
        running = asyncio.create_task(worker.run(shutdown))
        created = await repository.insert(new_job())
        assert created is not None
        hub.job_id = created.id
        try:
            # Set by the first long-poll wait that begins after the ack committed.
            await asyncio.wait_for(hub.after_commit.wait(), 60)
        finally:
            shutdown.set()
            await running

    assert hub.late == [], "the worker learned of its ack's commit only after a long poll"
    assert samples() == 1
