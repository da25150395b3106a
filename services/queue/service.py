"""The queue's rules: enqueue with replay, long-poll claims, fenced acks and fails.

SQL lives in `repository.py`; this module decides what each request means (which status code,
which settle is a replay, how long to wait) and keeps the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from common.contracts import (
    ERROR_MAX_BYTES,
    REDRIVE_BATCH,
    RESULT_MAX_BYTES,
    AckRequest,
    AckResult,
    BatchAckRequest,
    BatchAckResponse,
    CancelledRequest,
    ClaimRequest,
    EnqueueRequest,
    FailRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    JobList,
    JobMessage,
    JobStatus,
    JobView,
    SubmitJobResponse,
)
from common.enqueue import Inserted, JobRow, job_row
from common.errors import (
    IdempotencyConflict,
    InvalidInput,
    InvalidState,
    JobNotFound,
    JobqError,
    ServiceUnavailable,
    StaleReceiptHandle,
)
from common.ids import new_job_id
from common.text import sanitize_result, sanitize_text
from common.validation import check_payload
from services.queue.metrics import QueueMetrics
from services.queue.repository import JobRepository, Settled
from services.queue.settings import QueueSettings
from services.queue.wakeup import WakeupHub

logger = logging.getLogger(__name__)

_INSERT_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class Submitted:
    """A submit's answer: the response body and whether a new job was created (202 vs 200)."""

    response: SubmitJobResponse
    created: bool


def _conflict(row: JobRow, existing: uuid.UUID) -> IdempotencyConflict:
    what = f"job id {row.id}" if row.id == existing else f"idempotency key {row.idempotency_key!r}"
    return IdempotencyConflict(f"{what} is already used by job {existing} with a different request")


def _outcome(status: JobStatus) -> str:
    match status:
        case JobStatus.COMPLETED:
            return "success"
        case JobStatus.SCHEDULED | JobStatus.PENDING:
            return "retry"
        case JobStatus.DEAD_LETTER:
            return "dead_letter"
        case JobStatus.CANCELLED:
            return "cancelled"
        case JobStatus.PROCESSING:
            return "processing"


class QueueService:
    """Queue operations over a `JobRepository`, with long polling through a `WakeupHub`."""

    def __init__(
        self,
        repository: JobRepository,
        hub: WakeupHub,
        settings: QueueSettings,
        metrics: QueueMetrics,
        shutdown: asyncio.Event,
    ) -> None:
        self.repository = repository
        self._hub = hub
        self._settings = settings
        self._metrics = metrics
        self._shutdown = shutdown

    async def enqueue(self, request: EnqueueRequest) -> Submitted:
        """Create one job, or recognise a replay of one created before (see `enqueue_many`).

        Raises PayloadTooLarge/InvalidInput for a payload that cannot be stored,
        IdempotencyConflict when the key belongs to a different request.
        """
        [outcome] = await self.enqueue_many([request])
        if isinstance(outcome, JobqError):
            raise outcome
        return outcome

    async def enqueue_many(self, requests: list[EnqueueRequest]) -> list[Submitted | JobqError]:
        """Create jobs with one multi-row statement; one outcome per request, in order.

        A replay is the same job id (a retried forward) or the same idempotency key with the
        same request hash: the existing job's id and current status, `created=False`. A key
        repeated inside the batch is a replay of its first use. A key already used by a
        different request is IdempotencyConflict; an unstorable payload, PayloadTooLarge or
        InvalidInput.
        """
        outcomes: list[Submitted | JobqError | None] = [None] * len(requests)
        rows: dict[int, JobRow] = {}
        repeats: dict[int, tuple[int, JobRow]] = {}
        first_use: dict[str, int] = {}
        default_attempts = self._settings.queue_max_attempts
        for index, request in enumerate(requests):
            try:
                check_payload(request.payload)
            except JobqError as exc:
                outcomes[index] = exc
                continue
            row = job_row(request, request.job_id or new_job_id(), default_attempts)
            key = request.idempotency_key
            if key is not None and key in first_use:
                repeats[index] = (first_use[key], row)
                continue
            if key is not None:
                first_use[key] = index
            rows[index] = row
        await self._insert_resolving(rows, outcomes)
        for index, (first, row) in repeats.items():
            earlier = outcomes[first]
            if isinstance(earlier, Submitted):
                same = row.request_hash == rows[first].request_hash
                outcomes[index] = (
                    Submitted(earlier.response, False)
                    if same
                    else _conflict(row, earlier.response.job_id)
                )
            else:
                outcomes[index] = earlier
        return [o if o is not None else JobqError("no outcome") for o in outcomes]

    async def _insert_resolving(
        self, rows: dict[int, JobRow], outcomes: list[Submitted | JobqError | None]
    ) -> None:
        # Insert, then read collisions in new statements: a concurrent twin may commit in
        # between, and retention may delete the row we collided with, so try a few times.
        pending = dict(rows)
        for _ in range(_INSERT_ATTEMPTS):
            if not pending:
                return
            created = {
                job.id: job for job in await self.repository.insert_many(list(pending.values()))
            }
            vanished: dict[int, JobRow] = {}
            for index, row in pending.items():
                job = created.get(row.id)
                if job is not None:
                    self._metrics.enqueued.labels(
                        self._metrics.queue_label(job.queue),
                        self._metrics.task_label(job.task_type),
                    ).inc()
                    outcomes[index] = Submitted(
                        SubmitJobResponse(job_id=job.id, status=job.status), True
                    )
                    continue
                existing = await self.repository.find_existing(row.id, row.idempotency_key)
                if existing is None:
                    vanished[index] = row
                elif existing.request_hash != row.request_hash:
                    outcomes[index] = _conflict(row, existing.id)
                else:
                    reply = SubmitJobResponse(job_id=existing.id, status=existing.status)
                    outcomes[index] = Submitted(reply, False)
            pending = vanished
        for index in pending:
            outcomes[index] = ServiceUnavailable("could not settle a concurrent submission; retry")

    async def get(self, job_id: uuid.UUID) -> JobView:
        """The job's view; raises JobNotFound."""
        found = await self.repository.get(job_id)
        if found is None:
            raise JobNotFound(f"no job has id {job_id}")
        return found[0]

    async def list_jobs(
        self,
        *,
        status: JobStatus | None,
        queue: str | None,
        task_type: str | None,
        cursor: uuid.UUID | None,
        limit: int,
    ) -> JobList:
        """One page of jobs, newest first; `cursor` is the previous page's `next_cursor`."""
        items = await self.repository.list_jobs(
            status=status, queue=queue, task_type=task_type, before=cursor, limit=limit
        )
        next_cursor = str(items[-1].id) if len(items) == limit else None
        return JobList(items=items, next_cursor=next_cursor)

    async def claim(
        self, request: ClaimRequest, disconnected: asyncio.Future[Any] | None = None
    ) -> list[JobMessage]:
        """Claim up to `request.max` jobs, long-polling up to `request.wait_seconds`.

        Returns as soon as at least one job is claimed; an empty list when none arrived in
        time, when the service is shutting down, or when the client went away (`disconnected`
        completed), in which case nothing is claimed for it.
        """
        visibility = request.visibility_timeout or self._settings.queue_visibility_timeout
        deadline = time.monotonic() + request.wait_seconds
        while True:
            started = time.perf_counter()
            jobs = await self.repository.claim(
                request.queues, request.worker, request.max, visibility
            )
            self._metrics.claim_duration.observe(time.perf_counter() - started)
            if jobs:
                self._metrics.claim_batch_size.observe(len(jobs))
                return jobs
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._shutdown.is_set():
                break
            if disconnected is not None and disconnected.done():
                break
            extra = (disconnected,) if disconnected is not None else ()
            await self._hub.wait(
                request.queues, min(self._settings.queue_poll_interval, remaining), *extra
            )
            if self._shutdown.is_set() or (disconnected is not None and disconnected.done()):
                break
        self._metrics.empty_claims.inc()
        return []

    async def ack(self, job_id: uuid.UUID, request: AckRequest) -> JobView:
        """Complete the job. A replay of an applied settle returns the current view.

        Raises JobNotFound, or StaleReceiptHandle when the handle is not the job's latest.
        """
        result = sanitize_result(request.result, RESULT_MAX_BYTES)
        settled = await self.repository.ack(job_id, request.receipt_handle, result)
        if settled is None:
            return await self._replay_or_stale(job_id, request.receipt_handle)
        self._record(settled)
        return settled.view

    async def ack_many(self, request: BatchAckRequest) -> BatchAckResponse:
        """Complete many jobs in one statement, each fenced by its own receipt handle.

        Per entry: 200 when completed now or already settled with that handle (a replay), 404
        for an unknown job, 409 for a stale handle. Raises InvalidInput for repeated ids.
        """
        ids = [entry.id for entry in request.entries]
        if len(set(ids)) != len(ids):
            raise InvalidInput(
                "each job may appear once per batch",
                errors=[{"pointer": "/entries", "detail": "repeated id"}],
            )
        rows = [
            {
                "id": str(entry.id),
                "receipt_handle": str(entry.receipt_handle),
                "result": sanitize_result(entry.result, RESULT_MAX_BYTES),
            }
            for entry in request.entries
        ]
        settled_now = await self.repository.ack_many(rows)
        for settled in settled_now:
            self._record(settled)
        completed = {settled.view.id for settled in settled_now}
        rest = [entry for entry in request.entries if entry.id not in completed]
        leases = await self.repository.leases([entry.id for entry in rest]) if rest else {}
        results = []
        for entry in request.entries:
            if entry.id in completed:
                status = 200
            elif entry.id not in leases:
                status = 404
            else:
                handle, job_status = leases[entry.id]
                replay = handle == entry.receipt_handle and job_status is not JobStatus.PROCESSING
                status = 200 if replay else 409
            results.append(AckResult(id=entry.id, status=status))
        return BatchAckResponse(results=results)

    async def fail(self, job_id: uuid.UUID, request: FailRequest) -> JobView:
        """Record a failed attempt: SCHEDULED with jittered backoff, or DEAD_LETTER.

        Raises JobNotFound, or StaleReceiptHandle when the handle is not the job's latest.
        """
        settings = self._settings
        settled = await self.repository.fail(
            job_id,
            request.receipt_handle,
            error=sanitize_text(request.error, ERROR_MAX_BYTES) or "(no error text)",
            retryable=request.retryable,
            retry_after=request.retry_after_seconds,
            # u in (0, 1]: a zero delay would put every failed job back at once.
            jitter=1.0 - random.random(),
            base_delay=settings.queue_retry_base_delay,
            multiplier=settings.queue_retry_multiplier,
            max_delay=settings.queue_retry_max_delay,
        )
        if settled is None:
            return await self._replay_or_stale(job_id, request.receipt_handle)
        self._record(settled)
        return settled.view

    async def heartbeat(self, job_id: uuid.UUID, request: HeartbeatRequest) -> HeartbeatResponse:
        """Extend the lease from now (SQS ChangeMessageVisibility), or release the job with 0.

        Raises JobNotFound, or StaleReceiptHandle when the lease was lost.
        """
        if request.reason is not None and request.visibility_timeout != 0:
            raise InvalidInput(
                "a reason is only given with a release (visibilityTimeout 0)",
                errors=[{"pointer": "/reason", "detail": "only with visibilityTimeout 0"}],
            )
        reason = request.reason or "requested"
        extended = await self.repository.heartbeat(
            job_id, request.receipt_handle, request.visibility_timeout, reason
        )
        if extended is None:
            await self._raise_stale(job_id, request.receipt_handle)
        assert extended is not None
        if request.visibility_timeout == 0:
            self._metrics.released.labels(self._metrics.queue_label(extended.queue), reason).inc()
        if extended.status is not JobStatus.PROCESSING:
            queue = self._metrics.queue_label(extended.queue)
            task = self._metrics.task_label(extended.task_type)
            outcome = _outcome(extended.status)
            if outcome != "retry":
                self._metrics.processed.labels(queue, task, outcome).inc()
            logger.info(
                "job released: now %s",
                extended.status,
                extra={"event": "job_released", "job_id": str(job_id)},
            )
        return HeartbeatResponse(
            visible_at=extended.visible_at,
            visibility_timeout=request.visibility_timeout,
            cancel_requested=extended.cancel_requested,
            status=extended.status,
        )

    async def release_all(self, jobs: list[JobMessage]) -> None:
        """Release jobs claimed for a client that went away before receiving them."""
        for job in jobs:
            released = await self.repository.heartbeat(job.id, job.receipt_handle, 0, "client_gone")
            if released is not None:
                queue = self._metrics.queue_label(released.queue)
                self._metrics.released.labels(queue, "client_gone").inc()

    async def cancel(self, job_id: uuid.UUID) -> JobView:
        """Cancel a PENDING/SCHEDULED job at once; ask a PROCESSING one to stop (its worker
        learns it from the next heartbeat). Raises JobNotFound, or InvalidState (409) when the
        job already finished."""
        view = await self.repository.cancel(job_id)
        if view is None:
            current = await self.get(job_id)
            raise InvalidState(f"job {job_id} is {current.status}; only live jobs can be cancelled")
        if view.status is JobStatus.CANCELLED:
            self._metrics.processed.labels(
                self._metrics.queue_label(view.queue),
                self._metrics.task_label(view.task_type),
                "cancelled",
            ).inc()
        return view

    async def confirm_cancelled(self, job_id: uuid.UUID, request: CancelledRequest) -> JobView:
        """The worker stopped the job after a cancel request: it ends CANCELLED."""
        settled = await self.repository.confirm_cancelled(job_id, request.receipt_handle)
        if settled is None:
            return await self._replay_or_stale(job_id, request.receipt_handle)
        self._record(settled)
        return settled.view

    async def retry(self, job_id: uuid.UUID) -> JobView:
        """Run a DEAD_LETTER or CANCELLED job again (attempts and releases reset). Raises
        JobNotFound, or InvalidState (409) for any live or completed job, so a job never has
        two live copies."""
        view = await self.repository.retry(job_id)
        if view is None:
            current = await self.get(job_id)
            raise InvalidState(
                f"job {job_id} is {current.status}; "
                "only DEAD_LETTER or CANCELLED jobs can be retried"
            )
        logger.info("job retried by request", extra={"event": "job_retried", "job_id": str(job_id)})
        return view

    async def redrive(self, queue: str | None, task_type: str | None, limit: int | None) -> int:
        """Move dead-lettered jobs back to PENDING, `limit` in all (default: every one), in
        batches of at most 500, each its own short transaction. Returns how many moved."""
        moved = 0
        while limit is None or moved < limit:
            batch = REDRIVE_BATCH if limit is None else min(REDRIVE_BATCH, limit - moved)
            count = await self.repository.redrive(queue, task_type, batch)
            moved += count
            if count < batch:
                break
        logger.info(
            "redrove %d dead-lettered job(s)",
            moved,
            extra={"event": "dead_letter_redrive", "queue": queue, "task_type": task_type},
        )
        return moved

    async def _raise_stale(self, job_id: uuid.UUID, handle: uuid.UUID) -> None:
        found = await self.repository.get(job_id)
        if found is None:
            raise JobNotFound(f"no job has id {job_id}")
        raise StaleReceiptHandle(
            f"receipt handle {handle} no longer holds job {job_id} (now {found[0].status}): "
            "it was settled, released or handed out again"
        )

    async def _replay_or_stale(self, job_id: uuid.UUID, handle: uuid.UUID) -> JobView:
        found = await self.repository.get(job_id)
        if found is None:
            raise JobNotFound(f"no job has id {job_id}")
        view, lease_id = found
        if lease_id == handle and view.status is not JobStatus.PROCESSING:
            return view
        raise StaleReceiptHandle(
            f"receipt handle {handle} is not the latest for job {job_id}: the lease was lost "
            "and the job was handed out again or settled"
        )

    async def enqueue_scheduled(
        self, name: str, cron: str, bucket: datetime, request: EnqueueRequest
    ) -> Inserted | None:
        """Create the job of recurring schedule `name` for the cron bucket starting at `bucket`,
        unless that bucket or a later one was fired already (by any replica, at any time: the
        schedule's state is in PostgreSQL). Returns the job created, or None.

        Raises PayloadTooLarge/InvalidInput for a payload that cannot be stored.
        """
        check_payload(request.payload)
        row = job_row(request, new_job_id(), self._settings.queue_max_attempts)
        created = await self.repository.fire_schedule(name, cron, bucket, row)
        if created is not None:
            queue = self._metrics.queue_label(created.queue)
            self._metrics.enqueued.labels(queue, self._metrics.task_label(created.task_type)).inc()
        return created

    def _record(self, settled: Settled) -> None:
        view = settled.view
        queue = self._metrics.queue_label(view.queue)
        task = self._metrics.task_label(view.task_type)
        outcome = _outcome(view.status)
        self._metrics.processed.labels(queue, task, outcome).inc()
        if settled.end_to_end_seconds is not None:
            self._metrics.end_to_end.labels(queue, task).observe(settled.end_to_end_seconds)
        log_extra = {"event": f"job_{outcome}", "job_id": str(view.id), "attempt": view.attempts}
        if view.status is JobStatus.DEAD_LETTER:
            logger.error("job dead-lettered: %s", view.last_error, extra=log_extra)
        elif outcome == "retry":
            logger.warning("job will retry: %s", view.last_error, extra=log_extra)
