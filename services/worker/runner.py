"""The worker loop: claim as many jobs as there are free slots, run them, settle each.

One long poll at a time asks for exactly the number of free slots, so a claimed job never waits
in memory while its lease runs down (the seed's "claim only what you can run" rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec

from common.contracts import JobMessage
from common.errors import JobqError, StaleReceiptHandle
from services.worker.client import QueueClient
from services.worker.metrics import WorkerMetrics
from services.worker.processors import JobContext, NonRetryable, ProcessorRegistry, Retry
from services.worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

_CLAIM_BACKOFF_MAX = 5.0


class Worker:
    """Runs jobs from `settings.worker_queues` with at most `worker_concurrency` at once."""

    def __init__(
        self,
        settings: WorkerSettings,
        client: QueueClient,
        registry: ProcessorRegistry,
        metrics: WorkerMetrics,
    ) -> None:
        self._settings = settings
        self._client = client
        self._registry = registry
        self._metrics = metrics
        self._active: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()

    @property
    def active(self) -> int:
        """Jobs running now."""
        return len(self._active)

    async def run(self, shutdown: asyncio.Event) -> None:
        """Claim and run jobs until `shutdown` is set, then give running jobs up to
        `worker_shutdown_grace` seconds to finish; the rest are cancelled (their leases
        expire and the reaper hands them to another worker)."""
        backoff = 0.0
        async with asyncio.TaskGroup() as tasks:
            while not shutdown.is_set():
                free = self._settings.worker_concurrency - len(self._active)
                if free <= 0:
                    self._slot_freed.clear()
                    await _first(self._slot_freed.wait(), shutdown.wait())
                    continue
                try:
                    jobs = await _first(self._claim(free), shutdown.wait())
                    backoff = 0.0
                except JobqError as exc:
                    backoff = min(_CLAIM_BACKOFF_MAX, backoff * 2 or 0.2)
                    logger.warning(
                        "claim failed (%s); retrying in %.1fs",
                        exc,
                        backoff,
                        extra={"event": "claim_failed"},
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(shutdown.wait(), timeout=backoff)
                    continue
                for job in jobs or []:
                    task = tasks.create_task(self._run_guarded(job))
                    self._active.add(task)
                    self._metrics.active_jobs.set(len(self._active))
                    task.add_done_callback(self._finished)
            await self._drain()

    async def _claim(self, free: int) -> list[JobMessage]:
        return await self._client.claim(
            self._settings.worker_queues,
            free,
            self._settings.worker_wait_seconds,
            self._settings.worker_visibility_timeout,
        )

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._active.discard(task)
        self._metrics.active_jobs.set(len(self._active))
        self._slot_freed.set()

    async def _drain(self) -> None:
        if not self._active:
            return
        logger.info(
            "draining %d running job(s) for up to %.0fs",
            len(self._active),
            self._settings.worker_shutdown_grace,
            extra={"event": "worker_draining"},
        )
        _, still_running = await asyncio.wait(
            set(self._active), timeout=self._settings.worker_shutdown_grace
        )
        for task in still_running:
            task.cancel()

    async def _run_guarded(self, job: JobMessage) -> None:
        # A bug in one job's handling must not take the other running jobs down with it.
        try:
            await self._run(job)
        except Exception:
            logger.exception(
                "unexpected error handling job; its lease will expire",
                extra={"event": "job_handling_crashed", "job_id": str(job.id)},
            )

    async def _run(self, job: JobMessage) -> None:
        claimed = time.monotonic()
        registration = self._registry.get(job.task_type)
        task_label = self._metrics.task_label(job.task_type)
        if registration is None:
            await self._settle_failure(
                job,
                f"no processor for task type {job.task_type!r} on this worker",
                retryable=True,
                retry_after=None,
                claimed=claimed,
                task_label=task_label,
                started=claimed,
            )
            return
        timeout = (
            job.timeout_seconds or registration.timeout_seconds or self._settings.worker_job_timeout
        )
        context = JobContext(
            id=job.id,
            task_type=job.task_type,
            payload=job.payload,
            attempt=job.attempts,
            max_attempts=job.max_attempts,
            idempotency_key=job.idempotency_key,
        )
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout) as deadline:
                result = await registration.processor(context)
        except TimeoutError:
            if deadline.expired():
                error, retryable, after = f"timed out after {timeout:g}s", True, None
            else:
                error, retryable, after = "TimeoutError raised by the processor", True, None
        except Retry as exc:
            error, retryable, after = str(exc), True, exc.after
        except NonRetryable as exc:
            error, retryable, after = str(exc) or "non-retryable failure", False, None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error, retryable, after = f"{type(exc).__name__}: {exc}", True, None
        else:
            await self._settle_success(job, result, claimed, started, task_label)
            return
        await self._settle_failure(
            job,
            error,
            retryable=retryable,
            retry_after=after,
            claimed=claimed,
            task_label=task_label,
            started=started,
        )

    async def _settle_success(
        self, job: JobMessage, result: Any, claimed: float, started: float, task_label: str
    ) -> None:
        duration = time.monotonic() - started
        try:
            # Whatever the processor returned must reach the queue: values JSON cannot hold
            # (datetimes are fine; sets, headers, custom objects) are sent as their text.
            storable = msgspec.to_builtins(result, enc_hook=str)
            await self._client.ack(job.id, job.receipt_handle, storable)
        except StaleReceiptHandle as exc:
            self._lost(job, exc, task_label, duration)
            return
        except JobqError as exc:
            logger.warning(
                "ack failed: %s; the lease will expire and the job run again",
                exc,
                extra={"event": "ack_failed", "job_id": str(job.id)},
            )
            return
        self._metrics.job_duration.labels(task_label, "success").observe(duration)
        self._metrics.claim_to_settle.observe(time.monotonic() - claimed)
        logger.info(
            "job completed",
            extra={
                "event": "job_completed",
                "job_id": str(job.id),
                "task_type": job.task_type,
                "attempt": job.attempts,
            },
        )

    async def _settle_failure(
        self,
        job: JobMessage,
        error: str,
        *,
        retryable: bool,
        retry_after: float | None,
        claimed: float,
        started: float,
        task_label: str,
    ) -> None:
        duration = time.monotonic() - started
        try:
            view = await self._client.fail(
                job.id, job.receipt_handle, error, retryable=retryable, retry_after=retry_after
            )
        except StaleReceiptHandle as exc:
            self._lost(job, exc, task_label, duration)
            return
        except JobqError as exc:
            logger.warning(
                "fail report failed: %s; the lease will expire",
                exc,
                extra={"event": "fail_report_failed", "job_id": str(job.id)},
            )
            return
        outcome = "dead_letter" if view.status == "DEAD_LETTER" else "retry"
        self._metrics.job_duration.labels(task_label, outcome).observe(duration)
        self._metrics.claim_to_settle.observe(time.monotonic() - claimed)
        extra = {
            "event": f"job_{outcome}",
            "job_id": str(job.id),
            "task_type": job.task_type,
            "attempt": job.attempts,
        }
        if outcome == "dead_letter":
            logger.error("job dead-lettered: %s", error, extra=extra)
        else:
            logger.warning("job failed, will retry: %s", error, extra=extra)

    def _lost(self, job: JobMessage, exc: JobqError, task_label: str, duration: float) -> None:
        self._metrics.job_duration.labels(task_label, "lost").observe(duration)
        logger.warning(
            "lease lost; result discarded: %s",
            exc,
            extra={"event": "lease_lost", "job_id": str(job.id)},
        )


async def _first(work: Any, stop: Any) -> Any:
    """Await `work` unless `stop` finishes first; returns work's result, or None if stopped
    (work is then cancelled)."""
    work_task = asyncio.ensure_future(work)
    stop_task = asyncio.ensure_future(stop)
    try:
        done, _ = await asyncio.wait({work_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_task.cancel()
    if work_task in done:
        return work_task.result()
    work_task.cancel()
    with contextlib.suppress(asyncio.CancelledError, JobqError):
        await work_task
    return None
