"""The queue's rules: enqueue with replay, long-poll claims, fenced settles in batches.

SQL lives in `repository.py`; this module decides what each request means (which status code,
which settle is a replay, how long to wait) and keeps the metrics. Single submits that arrive
together are group-committed into one multi-row insert (`common.coalesce`); every settle route
is a batch of one or more entries, answered after the statement that applied it committed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import msgspec
from opentelemetry import trace

from common.coalesce import Coalescer
from common.contracts import (
    BATCH_MAX,
    ERROR_MAX_BYTES,
    LIST_PAGE_MAX_BYTES,
    PROGRESS_MESSAGE_MAX_CHARS,
    REDRIVE_BATCH,
    RESULT_MAX_BYTES,
    AckEntry,
    AckResult,
    BatchAckResponse,
    BatchFailResponse,
    BatchHeartbeatResponse,
    ClaimRequest,
    ConcurrencyLimit,
    EnqueueRequest,
    FailEntry,
    FailResult,
    HeartbeatEntry,
    HeartbeatResult,
    JobList,
    JobStatus,
    JobView,
    ListView,
    ProgressReport,
    QueuesResponse,
    QueueState,
    TenantWeight,
)
from common.enqueue import JobRow, Submitted, insert_jobs, job_row
from common.errors import (
    DeadlineExceeded,
    InvalidInput,
    InvalidState,
    JobNotFound,
    JobqError,
    QueueNotFound,
    ServiceUnavailable,
    StaleReceiptHandle,
)
from common.ids import new_job_id
from common.logging import RepeatedEvents
from common.text import sanitize_result, sanitize_text
from common.validation import check_payload
from common.web import tracing
from services.queue import retry
from services.queue.activity import Activity
from services.queue.depth import DepthCache, current_depth
from services.queue.metrics import QueueMetrics
from services.queue.outcomes import OutcomeWaiters
from services.queue.repository import (
    Claimed,
    Extended,
    JobRepository,
    LimitedClaim,
    ScheduleFiring,
    Settled,
)
from services.queue.repository import (
    FailEntry as FailRow,
)
from services.queue.settings import QueueSettings
from services.queue.tracing import claim_span, enqueue_span, settle_span
from services.queue.wakeup import WakeupHub

logger = logging.getLogger(__name__)

_PAGE_FRAME_BYTES = len(msgspec.json.encode(JobList(items=[], next_cursor=str(uuid.UUID(int=0)))))
"""JSON bytes of a listing page around its jobs."""


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


def _raise_for(job_id: uuid.UUID, handle: uuid.UUID, status: int) -> None:
    """Raise the error a single settle's per-entry `status` stands for (404, 409)."""
    if status == 404:
        raise JobNotFound(f"no job has id {job_id}")
    if status == 409:
        raise StaleReceiptHandle(
            f"receipt handle {handle} is not the latest for job {job_id}: the lease was lost "
            "and the job was handed out again or settled"
        )


_LATE = "the caller's deadline (X-Jobq-Deadline) passed before the work began; nothing was done"


def _ack_rows(entries: Sequence[AckEntry]) -> list[tuple[uuid.UUID, uuid.UUID, Any]]:
    """The (id, receipt handle, sanitised result) of each ack, as the repository takes them."""
    return [
        (entry.id, entry.receipt_handle, sanitize_result(entry.result, RESULT_MAX_BYTES))
        for entry in entries
    ]


def _recorded(
    queue: str, what: str, value: Any, actor: str, state: QueueState | None
) -> QueueState:
    """`state`, the state of `queue` after `actor` set its `what` (`limits`, `weights`) to
    `value`, which is logged. Raises QueueNotFound when there was no such queue (None)."""
    if state is None:
        raise QueueNotFound(f"queue {queue!r} has no job and was never changed; check its name")
    logger.warning(
        "queue %s %s set by %s: %s",
        queue,
        what,
        actor,
        msgspec.json.encode(value).decode(),
        extra={"event": f"queue_{what}", "queue": queue},
    )
    return state


def _limited_by_queue(states: list[QueueState]) -> dict[str, tuple[str, ...]]:
    """The task types each queue limits, in name order, for the queues that limit any."""
    return {
        state.queue: tuple(limit.task_type for limit in state.limits)
        for state in states
        if state.limits
    }


def _refuse_late(deadline: float | None) -> None:
    """Raise DeadlineExceeded when the caller's `deadline` (epoch seconds, `X-Jobq-Deadline`)
    has passed: the caller gave up, and work begun now could only surprise it (a job created
    after the producer answered that it may not exist)."""
    if deadline is not None and time.time() >= deadline:
        raise DeadlineExceeded(_LATE)


def _clean_progress(report: ProgressReport) -> ProgressReport:
    """`report` with a storable message (NUL and lone surrogates replaced, at most
    `PROGRESS_MESSAGE_MAX_CHARS` characters as decoded, so at most 4 bytes each in UTF-8)."""
    if report.message is None:
        return report
    message = sanitize_text(report.message, 4 * PROGRESS_MESSAGE_MAX_CHARS)
    return msgspec.structs.replace(report, message=message)


def _distinct_ids(ids: Sequence[uuid.UUID], pointer: str = "/entries") -> None:
    if len(set(ids)) != len(ids):
        raise InvalidInput(
            "each job may appear once per batch",
            errors=[{"pointer": pointer, "detail": "repeated id"}],
        )


_PAIR_LOCKS_KEPT = 10_000
"""Limited pairs whose in-process lock a replica keeps; past it the idle ones are dropped."""


def soonest_token(known: float | None, due: float, now: float) -> float:
    """When a queue's long polls should next wake for a token: the sooner of the `known` time
    (None: none) and a bucket's next token `due`, unless `known` has passed (at `now`; all
    `time.monotonic()` seconds): a claim ran after it and spent that token, so it would wake
    the polls at once for a token nobody holds."""
    if known is None or known <= now:
        return due
    return min(known, due)


class QueueService:
    """Queue operations over a `JobRepository`, with long polling through a `WakeupHub`."""

    def __init__(
        self,
        repository: JobRepository,
        hub: WakeupHub,
        settings: QueueSettings,
        metrics: QueueMetrics,
        shutdown: asyncio.Event,
        activity: Activity | None = None,
    ) -> None:
        self._repository = repository
        # Workers and per-minute counts for the operator views, written in batches.
        self.activity = activity or Activity(repository, settings.queue_throughput_retention)
        self._hub = hub
        self._settings = settings
        self._metrics = metrics
        self._shutdown = shutdown
        self._repeats = RepeatedEvents()
        self._backoff = retry.Backoff(
            settings.queue_retry_base_delay,
            settings.queue_retry_multiplier,
            settings.queue_retry_max_delay,
        )
        self._submits: Coalescer[tuple[EnqueueRequest, float], Submitted] = Coalescer(
            self._enqueue_batch, max_batch=BATCH_MAX, max_in_flight=2
        )
        self._waiters = OutcomeWaiters(repository, hub, shutdown)
        self._limited: dict[str, tuple[str, ...]] = {}
        self._limited_read_at = -math.inf
        self._limited_lock = asyncio.Lock()
        self._rotation = 0
        # Per queue, when (time.monotonic()) a token bucket that held its jobs back has its
        # next token, and the timer that then wakes one of its long polls.
        self._token_wakes: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        # Limited (queue, task type) pairs whose last claim found nothing waiting: the hub's
        # mark for the queue then, and until when (time.monotonic()) the pair is skipped.
        self._idle_pairs: dict[tuple[str, str], tuple[tuple[int, int], float]] = {}
        # One lock per limited pair: this replica's claims of a pair take turns on it, so
        # only one at a time asks PostgreSQL for the pair's advisory lock.
        self._pair_locks: dict[tuple[str, str], asyncio.Lock] = {}
        # Queues that limit a task type whose last unlimited claim found nothing: the hub's
        # mark for the queue then, and until when (time.monotonic()) that claim is skipped.
        self._idle_rest: dict[str, tuple[tuple[int, int], float]] = {}

    async def aclose(self) -> None:
        """Finish the group commits and waiters' reads under way."""
        await self._submits.aclose()
        await self._waiters.aclose()

    async def enqueue(self, request: EnqueueRequest, *, deadline: float | None = None) -> Submitted:
        """Create one job, or recognise a replay of one created before (see `enqueue_many`).

        Concurrent calls are group-committed: they share one multi-row insert, and each gets
        its answer after that insert committed. Raises PayloadTooLarge/InvalidInput for a
        payload that cannot be stored, IdempotencyConflict when the key belongs to a
        different request, ServiceUnavailable when the database is, DeadlineExceeded when
        the caller's `deadline` (epoch seconds) passed before the insert began.
        """
        check_payload(request.payload)
        _refuse_late(deadline)
        return await self._submits.submit((request, math.inf if deadline is None else deadline))

    async def _enqueue_batch(
        self, items: list[tuple[EnqueueRequest, float]]
    ) -> list[Submitted | JobqError]:
        # Callers whose deadline passed while they waited for a place in this insert are
        # refused here, before it begins.
        now = time.time()
        outcomes: list[Submitted | JobqError] = [
            DeadlineExceeded(_LATE) if deadline <= now else JobqError("no outcome")
            for _, deadline in items
        ]
        live = [index for index, (_, deadline) in enumerate(items) if deadline > now]
        inserted = await self.enqueue_many([items[i][0] for i in live], checked=True)
        for index, outcome in zip(live, inserted, strict=True):
            outcomes[index] = outcome
        return outcomes

    async def enqueue_many(
        self,
        requests: list[EnqueueRequest],
        *,
        checked: bool = False,
        deadline: float | None = None,
    ) -> list[Submitted | JobqError]:
        """Create jobs with one multi-row statement; one outcome per request, in order.

        Replays and conflicts are decided by `common.enqueue.insert_jobs` (the client
        library's path too). An unstorable payload is PayloadTooLarge or InvalidInput (not
        checked again when the caller says the payloads are `checked`). Raises
        DeadlineExceeded, inserting nothing, when the caller's `deadline` (epoch seconds)
        passed before the insert began.
        """
        outcomes: list[Submitted | JobqError | None] = [None] * len(requests)
        rows: dict[int, JobRow] = {}
        default_attempts = self._settings.queue_max_attempts
        for index, request in enumerate(requests):
            if not checked:
                try:
                    check_payload(request.payload)
                except JobqError as exc:
                    outcomes[index] = exc
                    continue
            job_id = request.job_id or new_job_id()
            rows[index] = job_row(
                request,
                job_id,
                default_attempts,
                request.tenant,
                request.trace_context,
                default_idempotency_window=self._settings.queue_idempotency_window,
            )
        _refuse_late(deadline)
        if tracing.tracer is None:
            inserted = await insert_jobs(self._repository, list(rows.values()))
        else:
            with enqueue_span(tracing.tracer, [requests[i] for i in rows]):
                inserted = await insert_jobs(self._repository, list(rows.values()))
        counts: Counter[tuple[str, str, str]] = Counter()
        for (index, row), outcome in zip(rows.items(), inserted, strict=True):
            outcomes[index] = outcome
            if isinstance(outcome, Submitted) and outcome.created:
                counts[(row.queue, row.task_type, row.tenant)] += 1
        for (queue, task_type, tenant), count in counts.items():
            self._metrics.count_enqueued(queue, task_type, tenant, count)
        return [o if o is not None else JobqError("no outcome") for o in outcomes]

    async def now(self) -> datetime:
        """The database's clock, which decides every visibility."""
        return await self._repository.now()

    async def schema_revision(self) -> str | None:
        """The alembic revision the database is at (None before the first migration)."""
        return await self._repository.schema_revision()

    async def queue_depth(self, cache: DepthCache) -> QueuesResponse:
        """Per-queue counts: from `cache` when fresh, else counted in PostgreSQL."""
        return await current_depth(self._repository, cache)

    async def get(self, job_id: uuid.UUID, tenant: str | None = None) -> JobView:
        """The job's view; raises JobNotFound, also (with a `tenant`) for another tenant's
        job, with the same message as for a missing one."""
        found = await self._repository.get(job_id, tenant)
        if found is None:
            raise JobNotFound(f"no job has id {job_id}")
        return found[0]

    async def wait_for(self, job_id: uuid.UUID, tenant: str | None, within: float) -> JobView:
        """The job's view once it is finished, or after `within` seconds (0: at once), woken
        by its settle's notification (`services.queue.outcomes`); raises JobNotFound."""
        if within <= 0:
            return await self.get(job_id, tenant)
        return await self._waiters.wait(job_id, tenant, within)

    async def list_jobs(
        self,
        *,
        status: JobStatus | None,
        queue: str | None,
        task_type: str | None,
        cursor: uuid.UUID | None,
        limit: int,
        tenant: str | None = None,
        view: ListView = "summary",
        idempotency_key: str | None = None,
    ) -> JobList:
        """One page of jobs, newest first, in the `view` asked for; `cursor` is the previous
        page's `next_cursor`; with a `tenant`, that tenant's jobs only. The page holds at most
        `limit` jobs and LIST_PAGE_MAX_BYTES of JSON (at least one job); `next_cursor` is
        set when it is full either way."""
        items, cut = await self._repository.list_jobs(
            status=status,
            queue=queue,
            task_type=task_type,
            idempotency_key=idempotency_key,
            before=cursor,
            limit=limit,
            tenant=tenant,
            full=view == "full",
            max_bytes=LIST_PAGE_MAX_BYTES - _PAGE_FRAME_BYTES,
        )
        full = cut or len(items) == limit
        next_cursor = str(items[-1].id) if items and full else None
        return JobList(items=items, next_cursor=next_cursor)

    async def claim(
        self, request: ClaimRequest, disconnected: asyncio.Future[Any] | None = None
    ) -> tuple[list[Claimed], list[AckResult]]:
        """Claim up to `request.max` jobs, long-polling up to `request.wait_seconds`; complete
        the jobs in `request.acks` first, in the same statement as the claim (in a statement
        of their own before it when a task type the request's queues limit may have jobs
        waiting, `_limited_may_wait`, so the slots they free count).

        Returns the jobs claimed and one outcome per ack (as `ack_many`), as soon as at least
        one job is claimed; no jobs when none arrived in time, when the service is shutting
        down, or when the client went away (`disconnected` completed), in which case nothing is
        claimed for it. A claim carrying acks never waits: it answers as soon as the statement
        that applied them committed, with the jobs it found or none, so a worker learns of the
        commit at once (docs/architecture.md#claim). Raises InvalidInput for repeated ack ids.
        """
        visibility = request.visibility_timeout or self._settings.queue_visibility_timeout
        limited = await self._limited_task_types()
        began = 0 if tracing.tracer is None else time.time_ns()
        if request.acks:
            if self._limited_may_wait(request.queues, limited):
                # The acks first, so the slots they free count for this claim's limited jobs.
                acks = await self._acked(request.acks, "/acks")
                started = time.perf_counter()
                jobs = await self._claim_once(request, visibility, limited)
                self._metrics.claim_duration.observe(time.perf_counter() - started)
            else:
                jobs, acks = await self._ack_and_claim(request, visibility)
            if jobs:
                self._metrics.claim_batch_size.observe(len(jobs))
                if tracing.tracer is not None:
                    claim_span(tracing.tracer, jobs, request.queues, request.worker, began)
            else:
                self._metrics.empty_claims.inc()
            self.activity.claimed(request.worker, request.queues, request.slots, len(jobs))
            return jobs, acks
        deadline = time.monotonic() + request.wait_seconds
        while True:
            started = time.perf_counter()
            jobs = await self._claim_once(request, visibility, limited)
            self._metrics.claim_duration.observe(time.perf_counter() - started)
            if jobs:
                self._metrics.claim_batch_size.observe(len(jobs))
                self.activity.claimed(request.worker, request.queues, request.slots, len(jobs))
                if tracing.tracer is not None:
                    claim_span(tracing.tracer, jobs, request.queues, request.worker, began)
                return jobs, []
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
        self.activity.claimed(request.worker, request.queues, request.slots, 0)
        return [], []

    async def _ack_and_claim(
        self, request: ClaimRequest, visibility: int
    ) -> tuple[list[Claimed], list[AckResult]]:
        entries = request.acks
        _distinct_ids([entry.id for entry in entries], "/acks")
        started = time.perf_counter()
        jobs, settled = await self._repository.ack_and_claim(
            _ack_rows(entries),
            request.queues,
            request.worker,
            request.max,
            visibility,
        )
        self._metrics.claim_duration.observe(time.perf_counter() - started)
        return jobs, await self._ack_results(entries, settled)

    async def _claim_once(
        self, request: ClaimRequest, visibility: int, limited: dict[str, tuple[str, ...]]
    ) -> list[Claimed]:
        """One claim of up to `request.max` jobs: first from the task types its queues limit
        (`limited`), each pair within its limit (`JobRepository.claim_limited`), then the
        claim statement for the rest. Limited jobs go first because the claim statement would
        otherwise hand out a steady flow of unlimited jobs ahead of them for ever; they can
        take no more slots than their limits allow, so the unlimited jobs are never starved
        in turn. The pairs of a queue are tried from a rotating start, so no task type's
        backlog keeps another's from its room. Queues without limits cost one dictionary
        lookup.

        When the database fails after limited jobs were claimed, those are answered rather
        than left to their leases."""
        jobs: list[Claimed] = []
        if limited:
            self._rotation += 1
            try:
                for queue in request.queues:
                    types = limited.get(queue, ())
                    start = self._rotation % len(types) if types else 0
                    for task_type in types[start:] + types[:start]:
                        if len(jobs) >= request.max:
                            return jobs
                        jobs += await self._claim_pair(
                            queue, task_type, request, request.max - len(jobs), visibility
                        )
            except ServiceUnavailable:
                if not jobs:
                    raise
                return jobs
            if len(jobs) >= request.max:
                return jobs
        try:
            return jobs + await self._claim_rest(
                request, request.max - len(jobs), visibility, limited
            )
        except ServiceUnavailable:
            if not jobs:
                raise
            return jobs

    async def _claim_rest(
        self,
        request: ClaimRequest,
        most: int,
        visibility: int,
        limited: dict[str, tuple[str, ...]],
    ) -> list[Claimed]:
        """Up to `most` jobs of the task types `request.queues` do not limit (the claim
        statement), or none, without a statement, when `_rest_idle` says none are there."""
        if limited and self._rest_idle(request.queues, limited):
            return []
        # Marked before the statement: a notification while it runs ends the skip.
        marks = [(queue, self._idle_mark(queue)) for queue in request.queues if queue in limited]
        rest = await self._repository.claim(request.queues, request.worker, most, visibility)
        if marks and len(rest) < most:
            # No unlimited job left in these queues: the next claims skip the statement
            # (which reads past the limited types' backlog to find none) until a
            # notification says one of them got ready jobs.
            self._idle_rest.update(marks)
        elif self._idle_rest:
            for queue in request.queues:
                self._idle_rest.pop(queue, None)
        return rest

    def _limited_may_wait(self, queues: Sequence[str], limited: dict[str, tuple[str, ...]]) -> bool:
        """Whether a limited pair of `queues` may have jobs waiting: one that `_claim_pair`
        would not skip. Only then do a claim's acks go in a statement of their own, so the
        slots they free count for the pair's claim; otherwise acks and claim are one
        statement, as in a queue without limits (the claim statement leaves the limited
        types alone either way)."""
        return any(
            not self._still_idle(queue, self._idle_pairs.get((queue, task_type)))
            for queue in queues
            for task_type in limited.get(queue, ())
        )

    def _rest_idle(self, queues: Sequence[str], limited: dict[str, tuple[str, ...]]) -> bool:
        """Whether the unlimited claim of `queues` can be skipped: every one limits a task
        type and its last unlimited claim on this replica found nothing, with no notification
        for it since and for at most QUEUE_DEPTH_INTERVAL (a safety net for a job made ready
        without one)."""
        return all(
            queue in limited and self._still_idle(queue, self._idle_rest.get(queue))
            for queue in queues
        )

    def _idle_mark(self, queue: str) -> tuple[tuple[int, int], float]:
        """What a claim that found nothing in `queue` keeps: the hub's mark for the queue now,
        and until when (time.monotonic()) the claim may be skipped (QUEUE_DEPTH_INTERVAL)."""
        return self._hub.heard(queue), time.monotonic() + self._settings.queue_depth_interval

    def _still_idle(self, queue: str, idle: tuple[tuple[int, int], float] | None) -> bool:
        """Whether a claim `idle` marked (`_idle_mark`; None: none) may still be skipped: no
        notification for `queue` since, and its time not up."""
        return idle is not None and idle[0] == self._hub.heard(queue) and time.monotonic() < idle[1]

    async def _claim_pair(
        self, queue: str, task_type: str, request: ClaimRequest, most: int, visibility: int
    ) -> list[Claimed]:
        """Up to `most` jobs of one limited pair (`JobRepository.claim_limited`), or none,
        without a statement, when the pair's last claim on this replica found nothing waiting
        and since then no notification said the queue got ready jobs, for at most
        QUEUE_DEPTH_INTERVAL (a safety net for a job made ready without one). A limited type
        with no ready jobs then costs the other types' claims nothing."""
        key = (queue, task_type)
        if self._still_idle(queue, self._idle_pairs.get(key)):
            return []
        mark = self._idle_mark(queue)  # before the claim: a notification during it counts
        lock = self._pair_locks.get(key)
        if lock is None:
            if len(self._pair_locks) >= _PAIR_LOCKS_KEPT:
                self._pair_locks = {k: v for k, v in self._pair_locks.items() if v.locked()}
            lock = self._pair_locks[key] = asyncio.Lock()
        # The claims of this replica wait their turn here, holding no connection (a claim
        # of the pair takes a few milliseconds), so at most one per replica waits for the
        # pair's advisory lock in PostgreSQL.
        async with lock:
            claim = await self._repository.claim_limited(
                queue, task_type, request.worker, most, visibility
            )
        self._held_back(queue, task_type, claim)
        if len(claim.jobs) >= most:
            # It took all it asked for, so the pair may have more to hand out (tokens left, a
            # slot free) than waiters will claim before their poll interval: wake one; a
            # bound that holds it back stops the chain.
            self._hub.wake(queue, 1)
        if claim.held_by is None and len(claim.jobs) < most:
            # Nothing left waiting (or the pair is no longer limited, or paused: a resume or
            # a limit change notifies every replica).
            self._idle_pairs[key] = mark
        else:
            self._idle_pairs.pop(key, None)
        return claim.jobs

    def _held_back(self, queue: str, task_type: str, claim: LimitedClaim) -> None:
        """Count a limited claim that a bound of the pair held back, by the bound; when a
        token bucket did, wake one long poll on the queue on this replica when its next token
        is due (no busy polling, and no herd: one wake per token, none while nothing
        waits)."""
        if claim.held_by is None:
            return
        self._metrics.claims_held_back.labels(queue, task_type, claim.held_by).inc()
        if claim.wait_seconds is not None:
            self._wake_one_in(queue, max(0.001, claim.wait_seconds))

    def _wake_one_in(self, queue: str, seconds: float) -> None:
        """Wake one long poll on `queue` in `seconds`, or sooner when a wake already set for
        it is due sooner (`soonest_token`: one that has passed is replaced). One timer per
        queue at most, gone once it fires."""
        now = time.monotonic()
        known = self._token_wakes.get(queue)
        due = soonest_token(None if known is None else known[0], now + seconds, now)
        if known is not None:
            if known[0] == due:
                return
            known[1].cancel()
        handle = asyncio.get_running_loop().call_later(due - now, self._token_wake, queue)
        self._token_wakes[queue] = (due, handle)

    def _token_wake(self, queue: str) -> None:
        self._token_wakes.pop(queue, None)
        self._hub.wake(queue, 1)

    async def _limited_task_types(self) -> dict[str, tuple[str, ...]]:
        """The task types each queue limits, read from PostgreSQL at most once per
        QUEUE_DEPTH_INTERVAL (and at once after a change through this replica). A limit set
        through another replica is enforced at once (the claim statement reads it live); its
        jobs wait for this read to be claimed here."""
        now = time.monotonic()
        if now - self._limited_read_at >= self._settings.queue_depth_interval:
            async with self._limited_lock:
                if now - self._limited_read_at >= self._settings.queue_depth_interval:
                    self._limited = _limited_by_queue(await self._repository.queue_states())
                    self._limited_read_at = time.monotonic()
        return self._limited

    async def ack_many(self, entries: Sequence[AckEntry]) -> BatchAckResponse:
        """Complete many jobs in one statement, each fenced by its own receipt handle.

        Per entry: 200 when completed now or already settled with that handle (a replay), 404
        for an unknown job, 409 for a stale handle. Raises InvalidInput for repeated ids.
        """
        return BatchAckResponse(results=await self._acked(entries, "/entries"))

    async def _acked(self, entries: Sequence[AckEntry], pointer: str) -> list[AckResult]:
        """`ack_many`'s outcomes; repeated ids are refused pointing at `pointer`."""
        _distinct_ids([entry.id for entry in entries], pointer)
        settled = await self._repository.ack_many(_ack_rows(entries))
        return await self._ack_results(entries, settled)

    async def _ack_results(
        self, entries: Sequence[AckEntry], settled: Sequence[Settled]
    ) -> list[AckResult]:
        """Record the acks applied, and answer every entry (200, or a replay's 200, 404, 409)."""
        self._record(settled)
        if len(settled) == len(entries):
            # Ids are distinct (`_distinct_ids`), so every entry was applied now: all 200.
            return [AckResult(id=entry.id, status=200) for entry in entries]
        done = {job.id for job in settled}
        statuses = await self._replays(
            [(entry.id, entry.receipt_handle) for entry in entries if entry.id not in done]
        )
        return [
            AckResult(id=entry.id, status=200 if entry.id in done else statuses[entry.id][0])
            for entry in entries
        ]

    async def fail_many(self, entries: Sequence[FailEntry]) -> BatchFailResponse:
        """Record many failed attempts in one statement: each job is SCHEDULED after a
        jittered backoff, or DEAD_LETTER when not retryable or out of attempts (CANCELLED when
        a cancel was requested meanwhile).

        Per entry: 200 with the job's status now (also for a replay), 404, or 409 stale.
        Raises InvalidInput for repeated ids.
        """
        _distinct_ids([entry.id for entry in entries])
        rows = [
            FailRow(
                id=entry.id,
                receipt_handle=entry.receipt_handle,
                error=sanitize_text(entry.error, ERROR_MAX_BYTES) or "(no error text)",
                retryable=entry.retryable,
                retry_after=entry.retry_after_seconds,
                jitter=retry.jitter(),
            )
            for entry in entries
        ]
        settled = {job.id: job for job in await self._repository.fail_many(rows, self._backoff)}
        self._record(list(settled.values()))
        statuses = await self._replays(
            [(entry.id, entry.receipt_handle) for entry in entries if entry.id not in settled]
        )
        results = []
        for entry in entries:
            job = settled.get(entry.id)
            if job is not None:
                results.append(FailResult(id=entry.id, status=200, job_status=job.status))
            else:
                code, status = statuses[entry.id]
                results.append(FailResult(id=entry.id, status=code, job_status=status))
        return BatchFailResponse(results=results)

    async def heartbeat_many(
        self, entries: Sequence[HeartbeatEntry], *, pointer: str = "/entries/{index}"
    ) -> BatchHeartbeatResponse:
        """Extend leases from now (SQS ChangeMessageVisibilityBatch), or release jobs with 0,
        in one statement; a release records `released: <reason>` (default `requested`) in the
        job's errors. Per entry: 200 with the lease now, 404, or 409 when the lease was lost.

        Raises InvalidInput for repeated ids, or a reason given without a release (pointing
        at `pointer` formatted with the entry's index).
        """
        _distinct_ids([entry.id for entry in entries])
        for index, entry in enumerate(entries):
            if entry.reason is not None and entry.visibility_timeout != 0:
                where = pointer.format(index=index) + "/reason"
                raise InvalidInput(
                    "a reason is only given with a release (visibilityTimeout 0)",
                    errors=[{"pointer": where, "detail": "only with visibilityTimeout 0"}],
                )
        progress = {e.id: _clean_progress(e.progress) for e in entries if e.progress is not None}
        return await self._change_leases(
            [
                (e.id, e.receipt_handle, e.visibility_timeout, e.reason or "requested")
                for e in entries
            ],
            progress,
        )

    async def _change_leases(
        self,
        entries: Sequence[tuple[uuid.UUID, uuid.UUID, int, str]],
        progress: dict[uuid.UUID, ProgressReport] | None = None,
    ) -> BatchHeartbeatResponse:
        changed = {job.id: job for job in await self._repository.heartbeat_many(entries, progress)}
        reasons = {job_id: reason for job_id, _, _, reason in entries}
        self._record_releases([job for job in changed.values() if job.released], reasons)
        missing = {job_id for job_id, *_ in entries if job_id not in changed}
        known = await self._repository.leases(list(missing)) if missing else {}
        results = []
        for job_id, *_ in entries:
            job = changed.get(job_id)
            if job is None:
                status = 409 if job_id in known else 404
                results.append(HeartbeatResult(id=job_id, status=status))
            else:
                results.append(
                    HeartbeatResult(
                        id=job_id,
                        status=200,
                        job_status=job.status,
                        visible_at=job.visible_at,
                        cancel_requested=job.cancel_requested,
                    )
                )
        return BatchHeartbeatResponse(results=results)

    async def release_all(self, jobs: Sequence[Claimed]) -> None:
        """Release jobs claimed for a client that went away before receiving them."""
        if jobs:
            await self.heartbeat_many(
                [
                    HeartbeatEntry(
                        id=job.id, receipt_handle=job.receipt_handle, visibility_timeout=0
                    )
                    for job in jobs
                ]
            )

    async def ack(self, job_id: uuid.UUID, handle: uuid.UUID, result: Any) -> JobView:
        """Complete one job; a replay of an applied settle returns the current view.

        Raises JobNotFound, or StaleReceiptHandle when the handle is not the job's latest.
        """
        reply = await self.ack_many([AckEntry(id=job_id, receipt_handle=handle, result=result)])
        return await self._view_after(job_id, handle, reply.results[0].status)

    async def fail(self, job_id: uuid.UUID, entry: FailEntry) -> JobView:
        """Record one failed attempt (see `fail_many`); returns the job's view.

        Raises JobNotFound, or StaleReceiptHandle when the handle is not the job's latest.
        """
        reply = await self.fail_many([entry])
        return await self._view_after(job_id, entry.receipt_handle, reply.results[0].status)

    async def heartbeat(self, entry: HeartbeatEntry) -> HeartbeatResult:
        """Extend one lease from now, or release the job with 0 (see `heartbeat_many`).

        Raises JobNotFound, or StaleReceiptHandle when the lease was lost.
        """
        [result] = (await self.heartbeat_many([entry], pointer="")).results
        _raise_for(entry.id, entry.receipt_handle, result.status)
        return result

    async def cancel(self, job_id: uuid.UUID, tenant: str | None = None) -> JobView:
        """Cancel a PENDING/SCHEDULED job at once; ask a PROCESSING one to stop (its worker
        learns it from the next heartbeat). Raises JobNotFound (also for another tenant's job
        when a `tenant` is given), or InvalidState (409) when the job already finished."""
        view = await self._repository.cancel(job_id, tenant)
        if view is None:
            current = await self.get(job_id, tenant)
            raise InvalidState(f"job {job_id} is {current.status}; only live jobs can be cancelled")
        if view.status is JobStatus.CANCELLED:
            queue, task = self._metrics.seed(view.queue, view.task_type)
            self._metrics.processed.labels(queue, task, "cancelled").inc()
        return view

    async def confirm_cancelled(self, job_id: uuid.UUID, handle: uuid.UUID) -> JobView:
        """The worker stopped the job after a cancel request: it ends CANCELLED. A replay
        returns the current view; raises JobNotFound or StaleReceiptHandle."""
        settled = await self._repository.confirm_cancelled(job_id, handle)
        if settled is not None:
            self._record([settled])
            return await self.get(job_id)
        status, _ = (await self._replays([(job_id, handle)]))[job_id]
        return await self._view_after(job_id, handle, status)

    async def retry(self, job_id: uuid.UUID, tenant: str | None = None) -> JobView:
        """Run a DEAD_LETTER or CANCELLED job again (attempts and releases reset). Raises
        JobNotFound (also for another tenant's job when a `tenant` is given), or InvalidState
        (409) for any live or completed job, so a job never has two live copies."""
        view = await self._repository.retry(job_id, tenant)
        if view is None:
            current = await self.get(job_id, tenant)
            raise InvalidState(
                f"job {job_id} is {current.status}; "
                "only DEAD_LETTER or CANCELLED jobs can be retried"
            )
        logger.info("job retried by request", extra={"event": "job_retried", "job_id": str(job_id)})
        return view

    async def set_paused(self, queue: str, paused: bool, actor: str) -> QueueState:
        """Pause (`paused`) or resume `queue`, as `actor`: a paused queue still takes submits
        but its claims, on every replica, hand out nothing from the next claim statement on;
        resuming wakes its long polls everywhere. Pausing a paused queue (or resuming a running
        one) changes nothing but the record of the last change. Raises QueueNotFound for a
        queue that has no job and was never paused, ServiceUnavailable when the database is."""
        state = await self._repository.set_paused(queue, paused, actor)
        if state is None:
            raise QueueNotFound(f"queue {queue!r} has no job and was never paused; check its name")
        logger.warning(
            "queue %s %s by %s",
            queue,
            "paused" if paused else "resumed",
            actor,
            extra={"event": "queue_paused" if paused else "queue_resumed", "queue": queue},
        )
        return state

    async def set_limits(
        self, queue: str, limits: Sequence[ConcurrencyLimit], actor: str
    ) -> QueueState:
        """Replace `queue`'s concurrency limits with `limits` (one per task type; empty: none), as
        `actor`. From the next claim statement on, on every replica, no more jobs of a limited
        task type are handed out than its limits leave room for; a job that settles, is
        released or whose lease expires frees its slot at once. Raises QueueNotFound for a
        queue that has no job and no state, ServiceUnavailable when the database is."""
        state = await self._repository.set_limits(queue, limits, actor)
        state = _recorded(queue, "limits", limits, actor, state)
        self._limited_read_at = -math.inf
        return state

    async def set_weights(
        self, queue: str, weights: Sequence[TenantWeight], actor: str
    ) -> QueueState:
        """Replace `queue`'s tenant weights in the fair share with `weights` (empty: every
        tenant weighs 1), as `actor`; the claim statements of every replica read them from
        the next claim on. Raises QueueNotFound for a queue that has no job and no state,
        ServiceUnavailable when the database is."""
        state = await self._repository.set_weights(queue, weights, actor)
        return _recorded(queue, "weights", weights, actor, state)

    async def redrive(
        self,
        queue: str | None,
        task_type: str | None,
        limit: int | None,
        tenant: str | None = None,
    ) -> int:
        """Move dead-lettered jobs (with a `tenant`, that tenant's only) back to PENDING,
        `limit` in all (default: every one), in batches of at most 500, each its own short
        statement. Returns how many moved."""
        moved = 0
        while limit is None or moved < limit:
            batch = REDRIVE_BATCH if limit is None else min(REDRIVE_BATCH, limit - moved)
            count = await self._repository.redrive(queue, task_type, batch, tenant)
            moved += count
            if count < batch:
                break
        logger.info(
            "redrove %d dead-lettered job(s)",
            moved,
            extra={
                "event": "dead_letter_redrive",
                "queue": queue,
                "task_type": task_type,
                "tenant": tenant,
            },
        )
        return moved

    async def _replays(
        self, entries: Sequence[tuple[uuid.UUID, uuid.UUID]]
    ) -> dict[uuid.UUID, tuple[int, JobStatus | None]]:
        """For settles that changed nothing: 200 when the handle settled the job already (a
        replay, with the job's status), 404 for an unknown job, 409 for a stale handle."""
        if not entries:
            return {}
        leases = await self._repository.leases([job_id for job_id, _ in entries])
        answers: dict[uuid.UUID, tuple[int, JobStatus | None]] = {}
        for job_id, handle in entries:
            if job_id not in leases:
                answers[job_id] = (404, None)
                continue
            current, status = leases[job_id]
            replay = current == handle and status is not JobStatus.PROCESSING
            answers[job_id] = (200, status) if replay else (409, status)
        return answers

    async def _view_after(self, job_id: uuid.UUID, handle: uuid.UUID, status: int) -> JobView:
        """The job's view after a single settle was answered `status` (200, 404 or 409)."""
        _raise_for(job_id, handle, status)
        return await self.get(job_id)

    def _record(self, settled: Sequence[Settled]) -> None:
        """Count settled attempts by outcome, observe end-to-end times, log retries (WARNING)
        and dead letters (ERROR), folded per task type (`common.logging.RepeatedEvents`)."""
        self.activity.settled(settled)
        if tracing.tracer is not None and settled:
            # The span is current while the settles are logged: their lines carry its ids.
            with trace.use_span(settle_span(tracing.tracer, settled), end_on_exit=True):
                self._count_settled(settled)
        else:
            self._count_settled(settled)

    def _count_settled(self, settled: Sequence[Settled]) -> None:
        counts: Counter[tuple[str, str, str]] = Counter()
        metrics = self._metrics
        # A batch's jobs share a few (queue, task type) pairs: their labels and end-to-end
        # series are looked up once per pair, not once per job.
        labels: dict[tuple[str, str], tuple[str, str]] = {}
        end_to_end: dict[tuple[str, str], Any] = {}
        for job in settled:
            pair = labels.get((job.queue, job.task_type))
            if pair is None:
                pair = labels[(job.queue, job.task_type)] = metrics.seed(job.queue, job.task_type)
            outcome = _outcome(job.status)
            counts[(*pair, outcome)] += 1
            if job.end_to_end_seconds is not None:
                series = end_to_end.get(pair)
                if series is None:
                    series = end_to_end[pair] = metrics.end_to_end.labels(*pair)
                series.observe(job.end_to_end_seconds)
            if job.status is JobStatus.DEAD_LETTER:
                self._repeats.log(
                    logger,
                    logging.ERROR,
                    job.task_type,
                    "job dead-lettered: %s",
                    job.last_error,
                    extra={
                        "event": "job_dead_letter",
                        "job_id": str(job.id),
                        "task_type": job.task_type,
                        "attempt": job.attempts,
                    },
                )
            elif outcome == "retry":
                self._repeats.log(
                    logger,
                    logging.WARNING,
                    job.task_type,
                    "job will retry: %s",
                    job.last_error,
                    extra={
                        "event": "job_retry",
                        "job_id": str(job.id),
                        "task_type": job.task_type,
                        "attempt": job.attempts,
                    },
                )
        for (queue, task, outcome), count in counts.items():
            metrics.processed.labels(queue, task, outcome).inc(count)

    def _record_releases(self, released: Sequence[Extended], reasons: dict[uuid.UUID, str]) -> None:
        """Count releases by reason, and those that ended a job (cancelled, dead-lettered) by
        outcome; log each release."""
        metrics = self._metrics
        for job in released:
            queue, task = metrics.seed(job.queue, job.task_type)
            metrics.released.labels(queue, reasons[job.id]).inc()
            outcome = _outcome(job.status)
            if outcome != "retry":
                metrics.processed.labels(queue, task, outcome).inc()
            self._repeats.log(
                logger,
                logging.INFO,
                reasons[job.id],
                "job released (%s): now %s",
                reasons[job.id],
                job.status,
                extra={"event": "job_released", "job_id": str(job.id)},
            )

    async def enqueue_scheduled(
        self, name: str, cron: str, bucket: datetime, period: timedelta, request: EnqueueRequest
    ) -> ScheduleFiring:
        """Create the job of recurring schedule `name` for the cron bucket starting at `bucket`
        (`period`: from it to the next cron time), unless that bucket or a later one was fired
        already (by any replica, at any time: the schedule's state is in PostgreSQL), or
        rewind the schedule to `bucket` when its stored bucket is more than `period` ahead of
        the database's clock (the clock was stepped back), counted in
        `jobq_schedule_clock_stepped_back_total`. Returns what the firing did.

        Raises PayloadTooLarge/InvalidInput for a payload that cannot be stored.
        """
        check_payload(request.payload)
        row = job_row(
            request,
            new_job_id(),
            self._settings.queue_max_attempts,
            default_idempotency_window=self._settings.queue_idempotency_window,
        )
        firing = await self._repository.fire_schedule(name, cron, bucket, period, row)
        if firing.created is not None:
            created = firing.created
            self._metrics.count_enqueued(created.queue, created.task_type, row.tenant)
        if firing.rewound_from is not None:
            self._metrics.schedule_clock_stepped_back.labels(name).inc()
        return firing
