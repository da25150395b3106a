"""The worker loop: claim as many jobs as there are free slots, run them, settle each.

One long poll at a time asks for exactly the number of free slots, so a claimed job never waits
in memory while its lease runs down ("claim only what you can run"). A slot is free again as
soon as its processor returns; the job's report then travels in a batch with the reports of
other jobs that finished meanwhile (`Settler`), and the job is done when the queue service
answered for it. One heartbeat loop extends the leases of running jobs at half their visibility
timeout (worker's monotonic clock), in batches too; its replies carry cancel requests.
See docs/architecture.md#worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import msgspec
from opentelemetry import trace
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from common.contracts import (
    ERROR_MAX_BYTES,
    PROGRESS_MESSAGE_MAX_CHARS,
    RESULT_MAX_BYTES,
    AckEntry,
    AckResult,
    ClaimResponse,
    FailEntry,
    HeartbeatEntry,
    JobMessage,
    JobStatus,
    ProgressReport,
)
from common.errors import JobqError, ServiceUnavailable, StaleReceiptHandle
from common.logging import FailureRun, RepeatedEvents
from common.text import sanitize_result, sanitize_text
from common.web import tracing
from jobq.processors import JobContext, NonRetryable, ProcessorRegistry, Registration, Retry
from services.worker.client import QueueClient, Settler, check_status
from services.worker.metrics import WorkerMetrics
from services.worker.settings import WorkerSettings
from services.worker.tracing import end_attempt, start_attempt

logger = logging.getLogger(__name__)
T = TypeVar("T")

_CLAIM_BACKOFF_MAX = 5.0
_RELEASE_BUDGET = 5.0
_GATHER_TURNS = 4
"""Turns of the event loop without a slot freeing after which a worker stops waiting for more
jobs to finish before it claims."""
_ACK_LINGER = 0.002
"""Seconds a worker waits, after a claim that emptied the queue, for the jobs it just started
to finish before it long-polls again (so their acks ride that long poll)."""
_HEARTBEAT_TICK = 0.1
"""Seconds between looks for leases due to be extended (and acks waiting too long)."""
_DEADLINE_TICK = 0.1
"""Seconds between looks for processors past their timeout: a timeout is enforced at most this
late, with no timer of its own per job (on uvloop, a timer made and cancelled per job was about a
fifth of the worker's own CPU per job: benchmark/README.md, "the worker's own cost per job")."""
_HEARTBEAT_RETRY = 1.0
"""Seconds before a failed heartbeat is tried again."""
PROGRESS_INTERVAL = 2.0
"""Seconds between two heartbeats of one job at least, when its processor reports progress:
a report brings the job's next heartbeat forward to this long after its last one."""


class Stop(enum.Enum):
    """Why a running processor was stopped before it finished."""

    CANCEL_REQUESTED = "cancel requested"
    LEASE_LOST = "lease lost"
    SHUTDOWN = "shutdown"
    TIMED_OUT = "timed out"


@dataclass
class Running:
    """A job in progress: its message, the task handling it, whether its processor is running
    and until when (its timeout), why it was stopped (if it was), when it was claimed and when
    its lease is next extended (monotonic seconds)."""

    job: JobMessage
    owner: asyncio.Task[Any] | None = None
    """The task that runs the processor and then reports (`Worker._run`)."""
    in_processor: bool = False
    deadline: float = math.inf
    """When the processor's timeout runs out (monotonic seconds; inf while none runs)."""
    timeout: float = 0.0
    cancels: tuple[Stop, ...] = ()
    """The reasons `interrupt` cancelled `owner` for (each once at most)."""
    stop: Stop | None = None
    claimed: float = field(default_factory=time.monotonic)
    next_heartbeat: float = 0.0
    holds_slot: bool = True
    last_heartbeat: float = 0.0
    span: Any = None
    """The attempt's span when tracing is on (`services.worker.tracing`), else None."""
    progress: ProgressReport | None = None
    """The latest progress report not sent yet (None: none)."""

    def __post_init__(self) -> None:
        self.next_heartbeat = self.claimed + _heartbeat_interval(self.job)
        self.last_heartbeat = self.claimed

    def report_progress(self, fraction: float, message: str | None) -> None:
        """Keep the processor's latest report (`JobContext.progress` checked and clamped the
        fraction) for the next heartbeat, and bring that heartbeat forward to at most
        `PROGRESS_INTERVAL` seconds after the last one."""
        if message is not None:
            message = sanitize_text(
                message[:PROGRESS_MESSAGE_MAX_CHARS], 4 * PROGRESS_MESSAGE_MAX_CHARS
            )
        self.progress = ProgressReport(fraction=fraction, message=message)
        self.next_heartbeat = min(self.next_heartbeat, self.last_heartbeat + PROGRESS_INTERVAL)

    def interrupt(self, reason: Stop) -> None:
        """Stop the processor for `reason` (the first reason wins): cancel its task while the
        processor runs, so the CancelledError lands in the processor's code, never in the
        report that follows it. Each reason cancels once, so a processor that handled one stop
        (a cancel request, say) is still stopped by the next (its timeout, shutdown)."""
        if self.stop is None:
            self.stop = reason
        if self.in_processor and reason not in self.cancels and self.owner is not None:
            self.cancels += (reason,)
            self.owner.cancel()


def _heartbeat_interval(job: JobMessage) -> float:
    return max(0.5, job.visibility_timeout / 2)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt as it will be reported."""

    error: str
    retryable: bool = True
    retry_after: float | None = None


def _retryable_report_error(exc: BaseException) -> bool:
    # 5xx and unreachable: the report may not have been applied, and repeating a fenced settle
    # is always safe. 4xx (409 lost lease, 404) will not change by asking again.
    return isinstance(exc, JobqError) and exc.status >= 500


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
        self._settler = Settler(client)
        self._registry = registry
        self._metrics = metrics
        metrics.task_label.keep(registry.task_types())
        self._tasks: dict[asyncio.Task[None], Running] = {}
        self._busy = 0
        """Slots taken: jobs whose processor has not returned yet."""
        self._slot_freed = asyncio.Event()
        self._backoff = 0.0
        self._connected = False
        self._repeats = RepeatedEvents()
        self._claim_failures = FailureRun(logger, "claim")
        self._group: asyncio.TaskGroup | None = None
        """The task group of `run`, for the reports a carried ack hands back (`_ack_answered`)."""
        metrics.active_jobs.set_function(lambda: self._busy)

    @property
    def _processing(self) -> list[Running]:
        return [running for running in self._tasks.values() if running.in_processor]

    async def run(self, shutdown: asyncio.Event) -> None:
        """Claim and run jobs until `shutdown` is set, then give running jobs up to
        `worker_shutdown_grace` seconds to finish and release the rest (SQS: visibility 0),
        so another worker takes them at once instead of after their lease expires."""
        concurrency = self._settings.worker_concurrency
        async with asyncio.TaskGroup() as tasks:
            self._group = tasks
            heartbeats = tasks.create_task(self._heartbeat_loop())
            deadlines = tasks.create_task(self._deadline_loop())
            # A finished job frees a slot, which always leads to a claim: its ack rides along.
            self._settler.carry_acks = True
            while not shutdown.is_set():
                free = concurrency - self._busy
                if free <= 0:
                    self._slot_freed.clear()
                    await _first(self._slot_freed.wait(), shutdown.wait())
                    await self._gather_finishing()
                    continue
                jobs = await self._next_jobs(free, shutdown)
                for job in jobs:
                    running = Running(job)
                    task = running.owner = tasks.create_task(self._run_guarded(running))
                    self._tasks[task] = running
                    self._busy += 1
                    task.add_done_callback(self._finished)
                if 0 < len(jobs) < free:
                    # The queue ran dry, so the next claim will wait for work: give the jobs
                    # just started a moment to finish, so their acks travel with it instead
                    # of in a request of their own.
                    self._slot_freed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._slot_freed.wait(), _ACK_LINGER)
            self._settler.carry_acks = False
            await self._drain()
            heartbeats.cancel()
            if self._tasks:  # processors that outlived the drain still stop at their timeout
                await asyncio.wait(set(self._tasks))
            deadlines.cancel()
        self._group = None
        await self._settler.aclose()

    async def _gather_finishing(self) -> None:
        """Let the jobs finishing in this same moment free their slots too (a job takes a few
        turns of the event loop to report), so the next claim asks for all of them at once and
        carries all their acks: yield while slots keep freeing, at most `_GATHER_TURNS` turns
        without progress."""
        idle = 0
        busy = self._busy
        while idle < _GATHER_TURNS:
            await asyncio.sleep(0)
            idle = idle + 1 if self._busy == busy else 0
            busy = self._busy

    async def _next_jobs(self, free: int, shutdown: asyncio.Event) -> list[JobMessage]:
        """One claim for up to `free` jobs, carrying the acks waiting for it; [] on shutdown,
        or after a failed claim and a capped exponential pause (0.2 s doubling to 5 s).

        Any claim may long-poll: acks of jobs finishing meanwhile wait for the next claim for
        at most `HOLD_MAX` seconds, then go on their own (see the heartbeat loop)."""
        carried = self._settler.take_acks()
        try:
            reply: ClaimResponse | None = await _first(
                self._claim(free, [entry for entry, _ in carried]), shutdown.wait()
            )
        except JobqError as exc:
            Settler.answer_acks(carried, exc)
            await self._claim_failed(exc, shutdown)
            return []
        if reply is None:
            Settler.answer_acks(carried, ServiceUnavailable("the worker is shutting down"))
            return []
        Settler.answer_acks(carried, reply.acks)
        self._backoff, self._connected = 0.0, True
        self._claim_failures.succeeded()
        return reply.jobs

    async def _claim_failed(self, exc: JobqError, shutdown: asyncio.Event) -> None:
        self._backoff = min(_CLAIM_BACKOFF_MAX, self._backoff * 2 or 0.2)
        # Starting before the queue service is normal (compose, honcho): say so once, quietly;
        # failing after having worked, or for long, is worth a warning.
        if self._connected or self._backoff >= _CLAIM_BACKOFF_MAX:
            # An outage is its first failure, a line every 30 s and its recovery.
            self._claim_failures.failed("claim failed (%s); retrying in %.1fs", exc, self._backoff)
        elif self._backoff == 0.2:
            logger.info(
                "waiting for the queue service (%s)", exc, extra={"event": "waiting_for_queue"}
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(shutdown.wait(), timeout=self._backoff)

    async def _claim(self, free: int, acks: list[AckEntry]) -> ClaimResponse:
        return await self._client.claim(
            self._settings.worker_queues,
            free,
            self._settings.worker_wait_seconds,
            self._settings.worker_visibility_timeout,
            acks,
        )

    def _free_slot(self, running: Running) -> None:
        if running.holds_slot:
            running.holds_slot = False
            self._busy -= 1
            self._slot_freed.set()

    def _finished(self, task: asyncio.Task[None]) -> None:
        running = self._tasks.pop(task, None)
        if running is not None:
            # Normally freed when the processor returned; not if our own handling failed.
            self._free_slot(running)

    async def _drain(self) -> None:
        if not self._tasks:
            return
        grace = self._settings.worker_shutdown_grace
        logger.info(
            "draining %d running job(s) for up to %.0fs",
            self._busy,
            grace,
            extra={"event": "worker_draining"},
        )
        _, late = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in late:
            self._tasks[task].interrupt(Stop.SHUTDOWN)
        if late:
            await asyncio.wait(late, timeout=_RELEASE_BUDGET)

    async def _run_guarded(self, running: Running) -> None:
        # A bug in one job's handling must not take the other running jobs down with it.
        try:
            await self._run(running)
        except Exception:
            logger.exception(
                "unexpected error handling job; its lease will expire",
                extra={"event": "job_handling_crashed", "job_id": str(running.job.id)},
            )

    async def _run(self, running: Running) -> None:
        job = running.job
        registration = self._registry.get(job.task_type)
        started = time.monotonic()
        if registration is None:
            outcome: Any = Failure(f"no processor for task type {job.task_type!r} on this worker")
        else:
            if tracing.tracer is not None:
                running.span = start_attempt(tracing.tracer, job, self._settings.worker_name)
            outcome = await self._invoke_stoppable(registration, running)
            if outcome is Stop.TIMED_OUT:
                outcome = Failure(f"timed out after {running.timeout:g}s (timeoutSeconds)")
        if running.span is not None:
            _end_span(running.span, outcome)
        self._free_slot(running)
        duration = time.monotonic() - started
        if isinstance(outcome, Stop):
            await self._after_stop(running, outcome, duration)
        elif isinstance(outcome, Failure):
            await self._report_failure(running, outcome, duration)
        else:
            job = running.job
            entry = AckEntry(id=job.id, receipt_handle=job.receipt_handle, result=storable(outcome))
            # Usually the ack waits for the next claim, and this task ends here: what became
            # of it comes back to `_ack_answered`.
            if not self._settler.carry(
                entry, partial(self._ack_answered, running, entry, duration)
            ):
                await self._report_success(running, entry, duration)

    async def _invoke_stoppable(self, registration: Registration, running: Running) -> Any:
        """Run the processor in this task (no task of its own) until it returns or
        `Running.interrupt` stops it (a cancel request, a lost lease, shutdown, or its timeout
        run out, which `_deadline_loop` watches); returns its result, a Failure, or the Stop.

        Our own cancels are taken back here (`Task.uncancel`, as `asyncio.timeout` does), so
        the report that follows runs normally; a cancel from elsewhere (the task group's) still
        propagates."""
        job = running.job
        running.timeout = registration.timeout(
            job.timeout_seconds, self._settings.worker_job_timeout
        )
        running.deadline = time.monotonic() + running.timeout
        running.in_processor = True
        taken_back = False
        try:
            return await self._invoke(registration, running)
        except asyncio.CancelledError:
            if not running.cancels:
                raise
            taken_back = True
            if _take_back(running) > 0:
                raise  # cancelled from elsewhere as well
            return running.stop
        finally:
            running.in_processor = False
            running.deadline = math.inf
            if running.cancels and not taken_back:
                _take_back(running)  # the processor swallowed our cancels and returned

    async def _deadline_loop(self) -> None:
        """Stop processors past their timeout, every `_DEADLINE_TICK` seconds, until
        cancelled (`run` does once every job's task ended)."""
        while True:
            await asyncio.sleep(_DEADLINE_TICK)
            now = time.monotonic()
            for running in list(self._tasks.values()):
                if running.deadline <= now:
                    running.interrupt(Stop.TIMED_OUT)

    async def _invoke(self, registration: Registration, running: Running) -> Any:
        """Run the processor; returns its result or a Failure (its timeout is watched by
        `_deadline_loop`)."""
        job = running.job
        context = JobContext(
            id=job.id,
            task_type=job.task_type,
            payload=job.payload,
            attempt=job.attempts,
            max_attempts=job.max_attempts,
            idempotency_key=job.idempotency_key,
            progress_sink=running.report_progress,
        )
        try:
            if running.span is None:
                return await registration.processor(context)
            with trace.use_span(running.span, end_on_exit=False):
                return await registration.processor(context)
        except Retry as exc:
            return Failure(str(exc), retry_after=exc.after)
        except NonRetryable as exc:
            return Failure(str(exc) or "non-retryable failure", retryable=False)
        except Exception as exc:
            return Failure(f"{type(exc).__name__}: {exc}")

    async def _heartbeat_loop(self) -> None:
        """Extend the leases that are due, in one batch per tick, until cancelled; send acks
        that waited too long for a claim to carry them."""
        while True:
            await asyncio.sleep(_HEARTBEAT_TICK)
            self._settler.send_stale()
            now = time.monotonic()
            due = [r for r in self._processing if r.next_heartbeat <= now and r.stop is None]
            if due:
                await asyncio.gather(*(self._heartbeat(running) for running in due))

    async def _heartbeat(self, running: Running) -> None:
        """Extend one lease (batched with the others due); stop the processor when the job was
        cancelled or the lease is lost."""
        job = running.job
        progress = running.progress
        entry = HeartbeatEntry(
            id=job.id,
            receipt_handle=job.receipt_handle,
            visibility_timeout=job.visibility_timeout,
            progress=progress,
        )
        running.last_heartbeat = time.monotonic()
        try:
            reply = await self._settler.heartbeat(entry)
        except StaleReceiptHandle:
            running.interrupt(Stop.LEASE_LOST)
            return
        except JobqError as exc:
            logger.warning(
                "heartbeat failed: %s",
                exc,
                extra={"event": "heartbeat_failed", "job_id": str(job.id)},
            )
            running.next_heartbeat = time.monotonic() + _HEARTBEAT_RETRY
            return
        running.next_heartbeat = time.monotonic() + _heartbeat_interval(job)
        if running.progress is progress:
            running.progress = None
        else:  # a newer report came meanwhile: it rides the next heartbeat, brought forward
            running.next_heartbeat = min(
                running.next_heartbeat, running.last_heartbeat + PROGRESS_INTERVAL
            )
        if reply.cancel_requested:
            running.interrupt(Stop.CANCEL_REQUESTED)

    async def _after_stop(self, running: Running, reason: Stop, duration: float) -> None:
        job = running.job
        task_label = self._metrics.task_label(job.task_type)
        extra = {"event": f"job_{reason.name.lower()}", "job_id": str(job.id)}
        match reason:
            case Stop.CANCEL_REQUESTED:
                handle = job.receipt_handle
                confirmed = await self._settle(
                    running, "cancel confirmation", lambda: self._settler.cancelled(job.id, handle)
                )
                if confirmed is not None:
                    self._metrics.observe_duration(task_label, "cancelled", duration)
                    logger.info("job cancelled on request", extra=extra)
            case Stop.SHUTDOWN:
                # One try only: the process is exiting, and an unreleased lease just expires.
                release = HeartbeatEntry(
                    id=job.id,
                    receipt_handle=job.receipt_handle,
                    visibility_timeout=0,
                    reason="shutdown",
                )
                try:
                    await self._settler.heartbeat(release)
                except JobqError as exc:
                    logger.warning("could not release at shutdown: %s", exc, extra=extra)
                    return
                self._metrics.observe_duration(task_label, "released", duration)
                logger.warning("job released at shutdown", extra=extra)
            case Stop.LEASE_LOST:
                self._lost(job, "heartbeat refused")

    def _ack_answered(
        self,
        running: Running,
        entry: AckEntry,
        duration: float,
        answer: AckResult | BaseException | None,
    ) -> None:
        """What became of an ack a claim was to carry (`Settler.carry`): done when the claim
        completed it; else (no claim took it, the claim failed, or it answered 409 or 404)
        `_report_success` takes it from there in a task of its own."""
        if isinstance(answer, AckResult) and answer.status == 200:
            self._acked(running, duration)
            return
        assert self._group is not None, "acks are carried only while `run` holds its group"
        self._group.create_task(self._report_success(running, entry, duration, answer))

    async def _report_success(
        self,
        running: Running,
        entry: AckEntry,
        duration: float,
        carried: AckResult | BaseException | None = None,
    ) -> None:
        """Report a success (`_settle`, retries included). `carried`: the answer a claim gave
        to this ack when it carried it (None if none did), taken as the first attempt's."""

        async def first() -> AckResult:
            if isinstance(carried, BaseException):
                raise carried
            assert carried is not None
            check_status(entry.id, carried.status)
            return carried

        acked = await self._settle(
            running, "ack", lambda: self._settler.ack(entry), None if carried is None else first
        )
        if acked is not None:
            self._acked(running, duration)

    def _acked(self, running: Running, duration: float) -> None:
        job = running.job
        task_label = self._metrics.task_label(job.task_type)
        self._metrics.observe_duration(task_label, "success", duration)
        self._metrics.claim_to_settle.observe(time.monotonic() - running.claimed)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "job completed",
                extra={
                    "event": "job_completed",
                    "job_id": str(job.id),
                    "task_type": job.task_type,
                    "attempt": job.attempts,
                },
            )

    async def _report_failure(self, running: Running, failure: Failure, duration: float) -> None:
        job = running.job
        error = sanitize_text(failure.error, ERROR_MAX_BYTES)
        entry = FailEntry(
            id=job.id,
            receipt_handle=job.receipt_handle,
            error=error,
            retryable=failure.retryable,
            retry_after_seconds=failure.retry_after,
        )
        reply = await self._settle(running, "fail report", lambda: self._settler.fail(entry))
        if reply is None:
            return
        outcome = "dead_letter" if reply.job_status is JobStatus.DEAD_LETTER else "retry"
        task_label = self._metrics.task_label(job.task_type)
        self._metrics.observe_duration(task_label, outcome, duration)
        self._metrics.claim_to_settle.observe(time.monotonic() - running.claimed)
        extra = {
            "event": f"job_{outcome}",
            "job_id": str(job.id),
            "task_type": job.task_type,
            "attempt": job.attempts,
        }
        # Folded per task type: one tenant's junk must not flood the operators' logs.
        if outcome == "dead_letter":
            self._repeats.log(
                logger, logging.ERROR, job.task_type, "job dead-lettered: %s", error, extra=extra
            )
        else:
            self._repeats.log(
                logger,
                logging.WARNING,
                job.task_type,
                "job failed, will retry: %s",
                error,
                extra=extra,
            )

    async def _settle(
        self,
        running: Running,
        what: str,
        report: Callable[[], Awaitable[T]],
        first: Callable[[], Awaitable[T]] | None = None,
    ) -> T | None:
        """Send a settle report; None when it was not recorded (lease lost, or the queue
        service stayed unavailable), which is logged here. `first`, when given, stands for the
        first attempt (an answer already in hand), and `report` for the retries.

        While the queue service is unreachable or answers 5xx, the report is retried (jittered,
        0.2 s doubling to 5 s) for up to the job's visibility timeout: a lease holds until it is
        reaped, so a report that arrives after an outage still counts and the job does not run
        twice. Repeating a report is safe: settles are fenced by the receipt handle and a
        replay of an applied one is answered 200.
        """
        job = running.job
        try:
            try:
                return await (first or report)()
            except JobqError as exc:
                if not _retryable_report_error(exc):
                    raise
            retrying = AsyncRetrying(
                retry=retry_if_exception(_retryable_report_error),
                wait=wait_exponential_jitter(initial=0.2, max=5.0),
                stop=stop_after_delay(job.visibility_timeout),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    return await report()
        except StaleReceiptHandle as exc:
            self._lost(job, str(exc))
        except JobqError as exc:
            logger.warning(
                "%s failed: %s; the lease will expire and the job run again",
                what,
                exc,
                extra={"event": "report_failed", "job_id": str(job.id)},
            )
        return None

    def _lost(self, job: JobMessage, why: str) -> None:
        self._metrics.lost_leases.inc()
        logger.warning(
            "lease lost; result discarded: %s",
            why,
            extra={"event": "lease_lost", "job_id": str(job.id)},
        )


def _take_back(running: Running) -> int:
    """Undo `running`'s cancels of its task (`Task.uncancel`, once per cancel sent); returns
    the cancels still requested, by others than this worker's stops."""
    owner = running.owner
    if owner is None:
        return 0
    for _ in running.cancels:
        owner.uncancel()
    return owner.cancelling()


def _end_span(span: Any, outcome: Any) -> None:
    """End an attempt's span with what the processor's run came to."""
    if isinstance(outcome, Stop):
        end_attempt(span, outcome.value)
    elif isinstance(outcome, Failure):
        end_attempt(span, "failed", outcome.error)
    else:
        end_attempt(span, "succeeded")


def storable(result: Any) -> Any:
    """What the processor returned, made storable: values JSON cannot hold are sent as their
    text, oversized or deeply nested ones as a stub. Never raises."""
    if result is None:
        return None
    try:
        return sanitize_result(msgspec.to_builtins(result, enc_hook=str), RESULT_MAX_BYTES)
    except (RecursionError, TypeError, ValueError, OverflowError) as exc:
        return {"truncated": True, "reason": f"result could not be encoded: {type(exc).__name__}"}


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
