"""`Worker.run` in process, against an in-memory queue client (as arq's worker fixture and
procrastinate's in-memory connector test their loops): free-slot claims, acks carried by the
next claim, drain and release at shutdown, lost leases, cancels, timeouts, and settles retried
through an outage. No I/O: the fake keeps the jobs; time is the event loop's."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common.contracts import (
    AckEntry,
    AckResult,
    ClaimResponse,
    FailEntry,
    FailResult,
    HeartbeatEntry,
    HeartbeatResult,
    JobMessage,
    JobStatus,
    JobView,
)
from common.errors import ServiceUnavailable
from jobq.processors import JobContext, NonRetryable, ProcessorRegistry
from services.worker.metrics import WorkerMetrics
from services.worker.runner import Worker
from services.worker.settings import WorkerSettings
from tests.helpers import eventually


class FakeQueue:
    """The queue service's worker protocol over a dict of jobs: claims hand out PENDING jobs
    with a fresh receipt handle; settles are fenced by it (409 otherwise)."""

    def __init__(self) -> None:
        self.jobs: dict[uuid.UUID, dict[str, Any]] = {}
        self.claims: list[tuple[int, int]] = []
        """(max asked, acks carried) per claim."""
        self.ack_requests: list[int] = []
        self.outage = 0
        """Settle requests still to refuse with 503."""
        self.cancel: set[uuid.UUID] = set()
        self.arrived = asyncio.Event()

    def add(self, task_type: str, payload: dict[str, Any] | None = None, **extra: Any) -> uuid.UUID:
        job_id = uuid.uuid4()
        self.jobs[job_id] = {
            "task_type": task_type,
            "payload": payload or {},
            "status": JobStatus.PENDING,
            "handle": None,
            "attempts": 0,
            "result": None,
            "errors": [],
            **extra,
        }
        self.arrived.set()
        return job_id

    def status(self, job_id: uuid.UUID) -> JobStatus:
        status: JobStatus = self.jobs[job_id]["status"]
        return status

    def _settle(self, job_id: uuid.UUID, handle: uuid.UUID) -> int:
        job = self.jobs.get(job_id)
        if job is None:
            return 404
        if job["handle"] != handle:
            return 409
        return 200 if job["status"] is JobStatus.PROCESSING else 409

    def _outage(self) -> None:
        if self.outage:
            self.outage -= 1
            raise ServiceUnavailable("the queue service is down (test)")

    async def claim(
        self,
        queues: list[str],
        max_jobs: int,
        wait_seconds: float,
        visibility_timeout: int | None = None,
        acks: list[AckEntry] | None = None,
    ) -> ClaimResponse:
        self._outage()
        self.claims.append((max_jobs, len(acks or [])))
        results = [self._ack(entry) for entry in acks or []]
        jobs: list[JobMessage] = []
        while True:
            for job_id, job in self.jobs.items():
                if len(jobs) == max_jobs:
                    break
                if job["status"] is JobStatus.PENDING:
                    job.update(status=JobStatus.PROCESSING, handle=uuid.uuid4())
                    job["attempts"] += 1
                    jobs.append(
                        JobMessage(
                            id=job_id,
                            task_type=job["task_type"],
                            payload=job["payload"],
                            attempts=job["attempts"],
                            max_attempts=5,
                            timeout_seconds=job.get("timeout"),
                            receipt_handle=job["handle"],
                            visibility_timeout=visibility_timeout or 2,
                            visible_at=datetime.now(UTC),
                            idempotency_key=None,
                        )
                    )
            if jobs or results or wait_seconds == 0:
                return ClaimResponse(jobs=jobs, acks=results)
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), wait_seconds)
            except TimeoutError:
                return ClaimResponse(jobs=[])

    def _ack(self, entry: AckEntry) -> AckResult:
        status = self._settle(entry.id, entry.receipt_handle)
        if status == 200:
            self.jobs[entry.id].update(status=JobStatus.COMPLETED, result=entry.result)
        return AckResult(id=entry.id, status=status)

    async def ack_many(self, entries: list[AckEntry]) -> list[AckResult]:
        self._outage()
        self.ack_requests.append(len(entries))
        return [self._ack(entry) for entry in entries]

    async def fail_many(self, entries: list[FailEntry]) -> list[FailResult]:
        self._outage()
        results = []
        for entry in entries:
            status = self._settle(entry.id, entry.receipt_handle)
            job_status = None
            if status == 200:
                job = self.jobs[entry.id]
                job_status = JobStatus.SCHEDULED if entry.retryable else JobStatus.DEAD_LETTER
                job["errors"].append(entry.error)
                job.update(status=job_status)
            results.append(FailResult(id=entry.id, status=status, job_status=job_status))
        return results

    async def heartbeat_many(self, entries: list[HeartbeatEntry]) -> list[HeartbeatResult]:
        self._outage()
        results = []
        for entry in entries:
            status = self._settle(entry.id, entry.receipt_handle)
            if status != 200:
                results.append(HeartbeatResult(id=entry.id, status=status))
                continue
            job = self.jobs[entry.id]
            if entry.visibility_timeout == 0:
                job.update(status=JobStatus.PENDING, handle=None)
                job["errors"].append(f"released: {entry.reason}")
            results.append(
                HeartbeatResult(
                    id=entry.id,
                    status=200,
                    job_status=job["status"],
                    visible_at=datetime.now(UTC),
                    cancel_requested=entry.id in self.cancel,
                )
            )
        return results

    async def cancelled(self, job_id: uuid.UUID, receipt_handle: uuid.UUID) -> JobView:
        assert self._settle(job_id, receipt_handle) == 200
        self.jobs[job_id].update(status=JobStatus.CANCELLED)
        return _view(job_id, JobStatus.CANCELLED)

    async def live(self) -> bool:
        return True


def _view(job_id: uuid.UUID, status: JobStatus) -> JobView:
    now = datetime.now(UTC)
    return JobView(
        id=job_id, queue="default", tenant="t", task_type="t", payload={}, status=status,
        priority=0, attempts=1, releases=0, max_attempts=5, timeout_seconds=None, last_error=None,
        errors=[], result=None, idempotency_key=None, locked_by=None, created_at=now,
        updated_at=now, visible_at=now, claimed_at=now, finished_at=now, cancel_requested=False,
    )  # fmt: skip


async def _instant(job: JobContext) -> dict[str, Any]:
    return {"echo": job.payload}


async def _forever(job: JobContext) -> None:
    await asyncio.sleep(3600)


async def _refuse(job: JobContext) -> None:
    raise NonRetryable("bad payload")


Processors = dict[str, Callable[[JobContext], Awaitable[Any]]]


async def _running(
    queue: FakeQueue, processors: Processors, **settings: Any
) -> tuple[Worker, asyncio.Event, asyncio.Task[None]]:
    registry = ProcessorRegistry()
    for task_type, processor in processors.items():
        registry.register(task_type, processor)
    defaults = {"worker_wait_seconds": 0.05, "worker_shutdown_grace": 0.3}
    worker = Worker(
        WorkerSettings(**{**defaults, **settings}),
        queue,  # type: ignore[arg-type]
        registry,
        WorkerMetrics(CollectorRegistry(), 4),
    )
    shutdown = asyncio.Event()
    return worker, shutdown, asyncio.create_task(worker.run(shutdown))


async def _until(condition: Callable[[], bool], within: float = 5.0) -> None:
    async def probe() -> bool:
        return condition()

    await eventually(probe, bool, within=within, interval=0.01)


async def test_claims_ask_for_the_free_slots_and_acks_ride_the_next_claim() -> None:
    queue = FakeQueue()
    ids = [queue.add("instant", {"n": n}) for n in range(10)]
    _, shutdown, task = await _running(queue, {"instant": _instant}, worker_concurrency=4)

    await _until(lambda: all(queue.status(i) is JobStatus.COMPLETED for i in ids))
    shutdown.set()
    await task

    assert all(max_asked <= 4 for max_asked, _ in queue.claims)
    assert queue.claims[0] == (4, 0)
    carried = sum(acks for _, acks in queue.claims)
    assert carried + sum(queue.ack_requests) == 10, "an ack went twice or not at all"
    assert carried >= 4, "acks did not ride the claims"
    assert queue.jobs[ids[3]]["result"] == {"echo": {"n": 3}}


async def test_shutdown_lets_quick_jobs_finish_and_releases_the_rest() -> None:
    queue = FakeQueue()
    slow = queue.add("forever")
    quick = queue.add("instant")
    _, shutdown, task = await _running(
        queue, {"forever": _forever, "instant": _instant}, worker_concurrency=2
    )
    await _until(lambda: queue.status(quick) is JobStatus.COMPLETED)
    await _until(lambda: queue.status(slow) is JobStatus.PROCESSING)

    shutdown.set()
    await task

    assert queue.status(slow) is JobStatus.PENDING
    assert queue.jobs[slow]["errors"] == ["released: shutdown"]


async def test_a_lost_lease_stops_the_processor_and_discards_its_result() -> None:
    queue = FakeQueue()
    job = queue.add("forever")
    worker, shutdown, task = await _running(
        queue, {"forever": _forever}, worker_visibility_timeout=1
    )
    await _until(lambda: queue.status(job) is JobStatus.PROCESSING)
    queue.jobs[job]["handle"] = uuid.uuid4()  # handed to someone else

    await _until(lambda: worker._busy == 0)  # the heartbeat's 409 stopped it
    shutdown.set()
    await task
    assert queue.status(job) is JobStatus.PROCESSING  # untouched: the other owner's


async def test_a_cancel_request_stops_the_processor_and_is_confirmed() -> None:
    queue = FakeQueue()
    job = queue.add("forever")
    worker, shutdown, task = await _running(
        queue, {"forever": _forever}, worker_visibility_timeout=1
    )
    await _until(lambda: queue.status(job) is JobStatus.PROCESSING)
    queue.cancel.add(job)

    await _until(lambda: queue.status(job) is JobStatus.CANCELLED)
    await _until(lambda: _outcomes(worker) == {"cancelled": 1})  # the confirmation answered
    shutdown.set()
    await task


def _outcomes(worker: Worker) -> dict[str, float]:
    """`jobq_worker_job_duration_seconds` counts by outcome."""
    counts: dict[str, float] = {}
    for metric in worker._metrics.job_duration.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.value:
                counts[sample.labels["outcome"]] = sample.value
    return counts


async def test_a_timeout_is_a_retryable_failure_never_early_and_non_retryable_dead_letters() -> (
    None
):
    started: dict[str, float] = {}
    stopped: dict[str, float] = {}

    async def slow(job: JobContext) -> None:
        loop = asyncio.get_running_loop()
        started["slow"] = loop.time()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped["slow"] = loop.time()

    async def upstream(job: JobContext) -> None:
        raise TimeoutError("upstream slow")  # the processor's own: an ordinary failure

    queue = FakeQueue()
    hung = queue.add("slow", timeout=1)
    refused = queue.add("refuse")
    own = queue.add("upstream")
    processors = {"slow": slow, "refuse": _refuse, "upstream": upstream}
    _, shutdown, task = await _running(queue, processors)

    await _until(lambda: queue.status(hung) is JobStatus.SCHEDULED)
    await _until(lambda: queue.status(refused) is JobStatus.DEAD_LETTER)
    await _until(lambda: queue.status(own) is JobStatus.SCHEDULED)
    shutdown.set()
    await task
    assert stopped["slow"] - started["slow"] >= 1.0
    assert queue.jobs[hung]["errors"] == ["timed out after 1s (timeoutSeconds)"]
    assert queue.jobs[refused]["errors"] == ["bad payload"]
    assert queue.jobs[own]["errors"] == ["TimeoutError: upstream slow"]


async def test_an_unknown_task_type_fails_as_retryable_naming_it() -> None:
    queue = FakeQueue()
    job = queue.add("nobody-handles-this")
    _, shutdown, task = await _running(queue, {})
    await _until(lambda: queue.status(job) is JobStatus.SCHEDULED)
    shutdown.set()
    await task
    assert "nobody-handles-this" in queue.jobs[job]["errors"][0]


@pytest.mark.parametrize("refusals", [1, 5])
async def test_settles_are_retried_through_an_outage_and_applied_once(refusals: int) -> None:
    queue = FakeQueue()
    ids = [queue.add("instant") for _ in range(6)]
    _, shutdown, task = await _running(queue, {"instant": _instant}, worker_concurrency=3)
    await _until(lambda: len(queue.claims) >= 1)
    queue.outage = refusals  # the next requests, whatever they are, get 503

    await _until(lambda: all(queue.status(i) is JobStatus.COMPLETED for i in ids), within=20)
    shutdown.set()
    await task
    assert all(queue.jobs[i]["attempts"] == 1 for i in ids), "a job ran twice"


async def _staggered(job: JobContext) -> None:
    """Finishes after `3 * (n % 4)` turns of the event loop: the jobs of one claim end in a
    ragged line, as real ones that start together do."""
    for _ in range(job.payload["n"] % 4 * 3):
        await asyncio.sleep(0)


async def test_jobs_finishing_together_are_replaced_by_one_claim() -> None:
    queue = FakeQueue()
    ids = [queue.add("staggered", {"n": n}) for n in range(12)]
    _, shutdown, task = await _running(queue, {"staggered": _staggered}, worker_concurrency=4)

    await _until(lambda: all(queue.status(i) is JobStatus.COMPLETED for i in ids))
    shutdown.set()
    await task

    # Slots that free within a few turns of each other are claimed for together (and carry
    # their acks): three claims of 4 take the 12 jobs, not one claim per freed slot.
    assert [asked for asked, _ in queue.claims[:3]] == [4, 4, 4]
    assert [acks for _, acks in queue.claims[1:3]] == [4, 4]


async def test_a_flood_of_dead_letters_of_one_task_type_is_one_error_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One tenant's 200 junk jobs must not write 200 ERROR lines; another task type's first
    dead letter still shows."""
    queue = FakeQueue()
    junk = [queue.add("refuse") for _ in range(200)]
    caplog.set_level(logging.INFO, logger="services.worker.runner")
    _, shutdown, task = await _running(
        queue, {"refuse": _refuse, "refuse-too": _refuse}, worker_concurrency=16
    )
    await _until(lambda: all(queue.status(job) is JobStatus.DEAD_LETTER for job in junk))
    other = queue.add("refuse-too")
    await _until(lambda: queue.status(other) is JobStatus.DEAD_LETTER)
    shutdown.set()
    await task
    errors = [r for r in caplog.records if getattr(r, "event", "") == "job_dead_letter"]
    assert [r.task_type for r in errors] == ["refuse", "refuse-too"]


async def test_a_queue_service_outage_is_one_claim_warning_and_one_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = FakeQueue()
    first = queue.add("instant")
    caplog.set_level(logging.INFO, logger="services.worker.runner")
    _, shutdown, task = await _running(queue, {"instant": _instant})
    await _until(lambda: queue.status(first) is JobStatus.COMPLETED)
    queue.outage = 4  # the next four requests are refused: the claims
    await _until(lambda: queue.outage == 0, within=15)
    second = queue.add("instant")
    await _until(lambda: queue.status(second) is JobStatus.COMPLETED, within=15)
    shutdown.set()
    await task
    events = [getattr(r, "event", "") for r in caplog.records]
    assert events.count("claim_failed") == 1
    assert events.count("claim_recovered") == 1


async def test_a_processor_that_swallows_its_stop_still_reports_its_result() -> None:
    """The stop is a cancel of the job's own task: taken back once the processor returns, so
    the report after it (an ack here) runs with nothing left pending against it."""
    seen: list[str] = []

    async def stubborn(job: JobContext) -> dict[str, bool]:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
        await asyncio.sleep(0.01)  # not cancelled a second time
        return {"finished": True}

    queue = FakeQueue()
    job = queue.add("stubborn")
    _, shutdown, task = await _running(queue, {"stubborn": stubborn}, worker_visibility_timeout=1)
    await _until(lambda: queue.status(job) is JobStatus.PROCESSING)
    queue.cancel.add(job)

    await _until(lambda: queue.status(job) is JobStatus.COMPLETED)
    shutdown.set()
    await task
    assert seen == ["cancelled"]
    assert queue.jobs[job]["result"] == {"finished": True}


async def test_a_carried_ack_refused_for_a_lost_lease_is_counted_and_not_repeated() -> None:
    queue = FakeQueue()

    async def outlived(job: JobContext) -> str:
        queue.jobs[job.id]["handle"] = uuid.uuid4()  # meanwhile handed to another worker
        return "late"

    job = queue.add("outlived")
    done = queue.add("instant")
    worker, shutdown, task = await _running(queue, {"outlived": outlived, "instant": _instant})
    await _until(lambda: queue.status(done) is JobStatus.COMPLETED)
    await _until(lambda: worker._metrics.lost_leases._value.get() == 1)
    shutdown.set()
    await task
    assert queue.status(job) is JobStatus.PROCESSING  # the other owner's
    assert queue.jobs[job]["result"] is None
    assert sum(carried for _, carried in queue.claims) == 2  # each ack sent once, by a claim
    assert queue.ack_requests == []


async def _handles_one_stop(job: JobContext) -> None:
    """Takes its first stop for a cleanup that never ends (a hung upstream, say)."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(3600)


async def test_a_processor_that_handled_one_stop_is_still_stopped_by_the_next() -> None:
    queue = FakeQueue()
    cancelled = queue.add("stubborn", timeout=2)
    _, shutdown, task = await _running(
        queue, {"stubborn": _handles_one_stop}, worker_visibility_timeout=1
    )
    await _until(lambda: queue.status(cancelled) is JobStatus.PROCESSING)
    queue.cancel.add(cancelled)
    # The cancel request stops it first; its timeout (2 s) stops the cleanup.
    await _until(lambda: queue.status(cancelled) is JobStatus.CANCELLED)

    timed_out = queue.add("stubborn", timeout=1)
    await _until(lambda: queue.jobs[timed_out]["attempts"] == 1)
    await asyncio.sleep(1.2)  # past its timeout, whose stop it handled
    shutdown.set()  # the shutdown's stop ends the cleanup
    await asyncio.wait_for(task, 10)
    assert queue.status(timed_out) is JobStatus.SCHEDULED
    assert queue.jobs[timed_out]["errors"] == ["timed out after 1s (timeoutSeconds)"]


async def test_an_ack_no_claim_took_is_sent_on_its_own_without_waiting_again() -> None:
    queue = FakeQueue()

    async def brief(job: JobContext) -> str:
        await asyncio.sleep(0.05)  # ends while the worker's next claim long-polls
        return "done"

    job = queue.add("brief")
    worker, shutdown, task = await _running(queue, {"brief": brief}, worker_wait_seconds=2)
    carried: list[uuid.UUID] = []
    carry = worker._settler.carry

    def counting(entry: AckEntry, answer: Any) -> bool:
        carried.append(entry.id)
        return carry(entry, answer)

    worker._settler.carry = counting  # type: ignore[method-assign]
    await _until(lambda: queue.status(job) is JobStatus.COMPLETED)
    shutdown.set()
    await task
    assert carried == [job]  # held once, then sent alone
    assert queue.ack_requests == [1]
