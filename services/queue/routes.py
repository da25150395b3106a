"""HTTP routes of the queue service: thin handlers that decode, call QueueService, encode.

Bodies are decoded once, strictly, after authentication (`common.web.bodies`). Claimed jobs are
encoded with their payload passed through as the JSON text PostgreSQL stored, never decoded
and encoded again on the hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

import msgspec
from litestar import Controller, MediaType, Request, Response, get, post, put
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, HeaderParameter, JSONBody

from common.batch import decode_entries, entry_result, split_valid
from common.contracts import (
    LIST_LIMIT_DEFAULT,
    AckRequest,
    AckResult,
    BatchAckRequest,
    BatchAckResponse,
    BatchFailRequest,
    BatchFailResponse,
    BatchHeartbeatRequest,
    BatchHeartbeatResponse,
    BatchSubmitRequest,
    BatchSubmitResponse,
    CancelledRequest,
    ClaimRequest,
    ClaimResponse,
    EnqueueRequest,
    FailEntry,
    FailRequest,
    HeartbeatEntry,
    HeartbeatRequest,
    HeartbeatResponse,
    JobList,
    JobView,
    LimitsRequest,
    QueuesResponse,
    QueueState,
    RedriveRequest,
    RedriveResponse,
    SubmitJobResponse,
    WeightsRequest,
)
from common.errors import JobqError
from common.web.app import problems
from common.web.bodies import ReportJSON, StrictJSON, SubmitJSON
from common.web.http import DEADLINE_HEADER, parse_deadline
from common.web.list_params import (
    Cursor,
    KeyFilter,
    Limit,
    QueueFilter,
    StatusFilter,
    TaskTypeFilter,
    TenantScope,
    View,
    WaitSeconds,
    refuse_unknown_parameters,
)
from common.web.queue_params import Actor, QueueAction, QueuePath, actor_of, check_queue_path
from services.queue.depth import DepthCache
from services.queue.operator import Operator
from services.queue.repository import Claimed
from services.queue.service import QueueService

Deadline = Annotated[
    str | None,
    HeaderParameter(
        name=DEADLINE_HEADER,
        description="The caller's deadline, seconds since the Unix epoch (e.g. `1764620000.5`):"
        " a submit arriving after it is refused (503 deadline-exceeded) before anything is "
        "inserted.",
    ),
]
"""`X-Jobq-Deadline`, checked by `parse_deadline` at the boundary (422 unless an epoch time)."""


class _ClaimReply(msgspec.Struct, omit_defaults=True):
    jobs: Sequence[Claimed | _Handed]
    acks: list[AckResult] = msgspec.field(default_factory=list)


class _Handed(msgspec.Struct, rename="camel", frozen=True, omit_defaults=True):
    """A `Claimed` job for a claim that did not ask for both its queue and tenant
    (`ClaimRequest.attribute_names`): the attributes not asked for are left out."""

    id: uuid.UUID
    task_type: str
    payload: msgspec.Raw
    attempts: int
    max_attempts: int
    timeout_seconds: int | None
    receipt_handle: uuid.UUID
    visibility_timeout: int
    visible_at: datetime
    idempotency_key: str | None
    queue: str | None = None
    tenant: str | None = None
    trace_context: msgspec.Raw | None = None


def encode_claimed(
    jobs: Sequence[Claimed], acks: list[AckResult], attribute_names: Sequence[str] = ()
) -> bytes:
    """The `ClaimResponse` JSON for `jobs` and `acks`, each payload passed through as
    stored; a job's `queue` and `tenant` only where `attribute_names` asks for them (a worker
    of an earlier release refuses fields it does not know)."""
    if "queue" in attribute_names and "tenant" in attribute_names:
        return msgspec.json.encode(_ClaimReply(jobs=jobs, acks=acks))
    queue, tenant = "queue" in attribute_names, "tenant" in attribute_names
    handed = [
        _Handed(
            id=job.id,
            task_type=job.task_type,
            payload=job.payload,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            timeout_seconds=job.timeout_seconds,
            receipt_handle=job.receipt_handle,
            visibility_timeout=job.visibility_timeout,
            visible_at=job.visible_at,
            idempotency_key=job.idempotency_key,
            queue=job.queue if queue else None,
            tenant=job.tenant if tenant else None,
            trace_context=job.trace_context,
        )
        for job in jobs
    ]
    return msgspec.json.encode(_ClaimReply(jobs=handed, acks=acks))


class JobController(Controller):
    """Submit, inspect and settle jobs; `POST /jobs/next` is the worker's long-polling claim."""

    path = "/jobs"
    tags = ["jobs"]

    @post(
        "/",
        status_code=202,
        dto=SubmitJSON[EnqueueRequest],
        summary="Create a job (or replay a submit)",
        responses={
            200: ResponseSpec(SubmitJobResponse, description="Replay of an earlier submit"),
            **problems(409, 413, 415),
        },
    )
    async def submit(
        self,
        data: JSONBody[EnqueueRequest],
        service: NamedDependency[QueueService],
        deadline: Deadline = None,
    ) -> Response[SubmitJobResponse]:
        """Create the job; `jobId`, when given, makes a retried forward a replay. Refused
        (DeadlineExceeded) when `X-Jobq-Deadline` passed before the insert began."""
        submitted = await service.enqueue(data, deadline=parse_deadline(deadline))
        return Response(
            submitted.response,
            status_code=202 if submitted.created else 200,
            headers={"Location": f"/jobs/{submitted.response.job_id}"},
        )

    @post(
        "/batch",
        status_code=200,
        summary="Create up to 500 jobs",
        responses=problems(413, 415),
        dto=StrictJSON[BatchSubmitRequest],
    )
    async def submit_batch(
        self,
        data: JSONBody[BatchSubmitRequest],
        service: NamedDependency[QueueService],
        deadline: Deadline = None,
    ) -> BatchSubmitResponse:
        """Each entry (an EnqueueRequest) is validated on its own; the valid ones are inserted
        by one multi-row statement. Results come in request order. The whole batch is refused
        (DeadlineExceeded) when `X-Jobq-Deadline` passed before the insert began."""
        due = parse_deadline(deadline)
        decoded = decode_entries(data.jobs, EnqueueRequest)
        indexes, valid = split_valid(decoded)
        results = [entry_result(i, d) for i, d in enumerate(decoded) if isinstance(d, JobqError)]
        inserted = await service.enqueue_many(valid, deadline=due)
        for index, outcome in zip(indexes, inserted, strict=True):
            if isinstance(outcome, JobqError):
                results.append(entry_result(index, outcome))
            else:
                results.append(entry_result(index, (outcome.response, outcome.created)))
        return BatchSubmitResponse(results=sorted(results, key=lambda r: r.index))

    @post(
        "/ack",
        status_code=200,
        summary="Complete many jobs",
        dto=ReportJSON[BatchAckRequest],
        responses=problems(413, 415),
    )
    async def ack_many(
        self, data: JSONBody[BatchAckRequest], service: NamedDependency[QueueService]
    ) -> BatchAckResponse:
        """Complete up to 100 jobs in one statement, each fenced by its receipt handle; one
        result per entry (200, 404 or 409), in request order."""
        return await service.ack_many(data.entries)

    @post(
        "/fail",
        status_code=200,
        summary="Fail many attempts",
        dto=ReportJSON[BatchFailRequest],
        responses=problems(413, 415),
    )
    async def fail_many(
        self, data: JSONBody[BatchFailRequest], service: NamedDependency[QueueService]
    ) -> BatchFailResponse:
        """Record up to 100 failed attempts in one statement, each fenced by its receipt
        handle; one result per entry (200 with the job's status now, 404 or 409), in order."""
        return await service.fail_many(data.entries)

    @post(
        "/heartbeat",
        status_code=200,
        summary="Extend or release many leases",
        dto=StrictJSON[BatchHeartbeatRequest],
        responses=problems(413, 415),
    )
    async def heartbeat_many(
        self, data: JSONBody[BatchHeartbeatRequest], service: NamedDependency[QueueService]
    ) -> BatchHeartbeatResponse:
        """SQS ChangeMessageVisibilityBatch: up to 100 leases in one statement; one result per
        entry (200 with the lease now and any cancel request, 404 or 409), in order."""
        return await service.heartbeat_many(data.entries)

    @get("/", summary="List jobs (newest first)", responses=problems())
    async def list_jobs(
        self,
        service: NamedDependency[QueueService],
        request: Request[Any, Any, Any],
        status: StatusFilter = None,
        queue: QueueFilter = None,
        task_type: TaskTypeFilter = None,
        idempotency_key: KeyFilter = None,
        cursor: Cursor = None,
        limit: Limit = LIST_LIMIT_DEFAULT,
        view: View = "summary",
        tenant: TenantScope = None,
    ) -> JobList:
        """Filter by status (`DEAD_LETTER` lists the dead-letter queue), queue, task type and
        tenant; keyset pagination by id, stable while new jobs arrive. Jobs come in the
        summary view unless `view=full`; a page stops at `limit` jobs or 1 MiB of JSON."""
        refuse_unknown_parameters(request)
        return await service.list_jobs(
            status=status,
            queue=queue,
            task_type=task_type,
            idempotency_key=idempotency_key,
            cursor=cursor,
            limit=limit,
            tenant=tenant,
            view=view,
        )

    @get("/{job_id:uuid}", summary="Read a job", responses=problems(404))
    async def read(
        self,
        job_id: FromPath[uuid.UUID],
        service: NamedDependency[QueueService],
        tenant: TenantScope = None,
        wait_seconds: WaitSeconds = 0,
    ) -> JobView:
        """The job's full view; with `waitSeconds`, once it is finished or the time is up."""
        return await service.wait_for(job_id, tenant, wait_seconds)

    @post(
        "/next",
        status_code=200,
        dto=ReportJSON[ClaimRequest],
        summary="Claim jobs (long poll)",
        responses={
            204: ResponseSpec(
                None, description="No job arrived within waitSeconds (and no acks were carried)"
            ),
            **problems(413, 415),
        },
    )
    async def claim(
        self,
        data: JSONBody[ClaimRequest],
        service: NamedDependency[QueueService],
        request: Request[Any, Any, State],
    ) -> Response[ClaimResponse | None]:
        """Claim up to `max` jobs; waits up to `waitSeconds` for one without holding a
        database connection. A client that disconnects while waiting gets nothing claimed.
        `acks` completes finished jobs in the same statement as the claim; a claim carrying
        acks never waits, so its reply (200 with an outcome per ack, and the jobs found, if
        any) comes as soon as the acks committed."""
        disconnected = asyncio.ensure_future(request.receive())
        try:
            jobs, acks = await service.claim(data, disconnected)
            if jobs and disconnected.done() and not disconnected.cancelled():
                # The client left while the claim ran: nobody will process these jobs.
                await service.release_all(jobs)
                jobs = []
        finally:
            disconnected.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await disconnected
        if not jobs and not acks:
            return Response(None, status_code=204)
        # Encoded here (payloads passed through as stored); documented as ClaimResponse.
        body: Any = encode_claimed(jobs, acks, data.attribute_names)
        return Response(body, status_code=200, media_type=MediaType.JSON)

    @post(
        "/{job_id:uuid}/ack",
        status_code=200,
        dto=ReportJSON[AckRequest],
        summary="Complete a job",
        responses=problems(404, 409, 413, 415),
    )
    async def ack(
        self,
        job_id: FromPath[uuid.UUID],
        data: JSONBody[AckRequest],
        service: NamedDependency[QueueService],
    ) -> JobView:
        """Complete the job, fenced by its receipt handle; a replay returns the current view."""
        return await service.ack(job_id, data.receipt_handle, data.result)

    @post(
        "/{job_id:uuid}/fail",
        status_code=200,
        dto=ReportJSON[FailRequest],
        summary="Fail an attempt",
        responses=problems(404, 409, 413, 415),
    )
    async def fail(
        self,
        job_id: FromPath[uuid.UUID],
        data: JSONBody[FailRequest],
        service: NamedDependency[QueueService],
    ) -> JobView:
        """Record a failed attempt: retried after a jittered backoff, or dead-lettered."""
        entry = FailEntry(
            id=job_id,
            receipt_handle=data.receipt_handle,
            error=data.error,
            retryable=data.retryable,
            retry_after_seconds=data.retry_after_seconds,
        )
        return await service.fail(job_id, entry)

    @post(
        "/{job_id:uuid}/heartbeat",
        status_code=200,
        dto=StrictJSON[HeartbeatRequest],
        summary="Extend or release a lease",
        responses=problems(404, 409, 413, 415),
    )
    async def heartbeat(
        self,
        job_id: FromPath[uuid.UUID],
        data: JSONBody[HeartbeatRequest],
        service: NamedDependency[QueueService],
    ) -> HeartbeatResponse:
        """SQS ChangeMessageVisibility: the lease ends `visibilityTimeout` seconds from now
        (12 h cap from the claim); 0 releases the job. The reply carries `cancelRequested`."""
        entry = HeartbeatEntry(
            id=job_id,
            receipt_handle=data.receipt_handle,
            visibility_timeout=data.visibility_timeout,
            reason=data.reason,
        )
        result = await service.heartbeat(entry)
        assert result.job_status is not None and result.visible_at is not None
        return HeartbeatResponse(
            visible_at=result.visible_at,
            visibility_timeout=data.visibility_timeout,
            cancel_requested=result.cancel_requested,
            status=result.job_status,
        )

    @post(
        "/{job_id:uuid}/cancelled",
        status_code=200,
        dto=ReportJSON[CancelledRequest],
        summary="Confirm a cooperative cancel",
        responses=problems(404, 409, 413, 415),
    )
    async def cancelled(
        self,
        job_id: FromPath[uuid.UUID],
        data: JSONBody[CancelledRequest],
        service: NamedDependency[QueueService],
    ) -> JobView:
        """The worker stopped the job after a cancel request; the job ends CANCELLED."""
        return await service.confirm_cancelled(job_id, data.receipt_handle)

    @post(
        "/{job_id:uuid}/cancel",
        status_code=200,
        summary="Cancel a job",
        responses=problems(404, 409),
    )
    async def cancel(
        self,
        job_id: FromPath[uuid.UUID],
        service: NamedDependency[QueueService],
        tenant: TenantScope = None,
    ) -> JobView:
        """PENDING/SCHEDULED → CANCELLED at once; PROCESSING → cancel requested."""
        return await service.cancel(job_id, tenant)

    @post(
        "/{job_id:uuid}/retry",
        status_code=200,
        summary="Run a dead-lettered or cancelled job again",
        responses=problems(404, 409),
    )
    async def retry(
        self,
        job_id: FromPath[uuid.UUID],
        service: NamedDependency[QueueService],
        tenant: TenantScope = None,
    ) -> JobView:
        """DEAD_LETTER/CANCELLED → PENDING with attempts and releases reset; 409 otherwise."""
        return await service.retry(job_id, tenant)


@post(
    "/dead-letter/redrive",
    status_code=200,
    dto=StrictJSON[RedriveRequest],
    tags=["dead-letter"],
    summary="Redrive dead-lettered jobs",
    responses=problems(413, 415),
)
async def redrive(
    data: JSONBody[RedriveRequest],
    service: NamedDependency[QueueService],
    tenant: TenantScope = None,
) -> RedriveResponse:
    """Move dead-lettered jobs (optionally of one queue, task type and tenant) back to
    PENDING."""
    moved = await service.redrive(data.queue, data.task_type, data.limit, tenant)
    return RedriveResponse(moved=moved)


@post(
    "/queues/{queue:str}/{action:str}",
    status_code=200,
    tags=["queues"],
    summary="Pause or resume a queue",
    responses=problems(404),
)
async def change_queue(
    request: Request[Any, Any, Any],
    queue: QueuePath,
    action: QueueAction,
    service: NamedDependency[QueueService],
    actor: Actor = None,
) -> QueueState:
    """`pause`: from the next claim statement on, on every replica, the queue hands out no
    job; running jobs finish and settle; long polls wait (then answer 204). `resume`: it hands
    out jobs again, its long polls on every replica woken at once. 404 for a queue that has no
    job and was never paused."""
    check_queue_path(request, queue, action)
    return await service.set_paused(queue, action == "pause", actor_of(actor))


@put(
    "/queues/{queue:str}/limits",
    status_code=200,
    dto=StrictJSON[LimitsRequest],
    tags=["queues"],
    summary="Set a queue's concurrency limits by task type",
    responses=problems(404, 413, 415),
)
async def set_limits(
    request: Request[Any, Any, Any],
    queue: QueuePath,
    data: JSONBody[LimitsRequest],
    service: NamedDependency[QueueService],
    actor: Actor = None,
) -> QueueState:
    """Replace the queue's concurrency limits, one per task type (`{"limits": [{"taskType":
    "webhook", "concurrency": 20, "tenantConcurrency": 3}]}`; `{"limits": []}` removes them):
    from the next claim on, on every replica, at most `concurrency` jobs of the task type are
    PROCESSING at once, and at most `tenantConcurrency` of one tenant. 404 for a queue that
    has no job and no state."""
    check_queue_path(request, queue, "limits")
    return await service.set_limits(queue, data.limits, actor_of(actor))


@put(
    "/queues/{queue:str}/weights",
    status_code=200,
    dto=StrictJSON[WeightsRequest],
    tags=["queues"],
    summary="Set the tenants' weights in a queue's fair share",
    responses=problems(404, 413, 415),
)
async def set_weights(
    request: Request[Any, Any, Any],
    queue: QueuePath,
    data: JSONBody[WeightsRequest],
    service: NamedDependency[QueueService],
    actor: Actor = None,
) -> QueueState:
    """Replace the tenants' weights in the queue's fair share (`{"weights": [{"tenant":
    "acme", "weight": 3}]}`; `{"weights": []}`: every tenant weighs 1): from the next claim
    on, on every replica, tenants with ready jobs get them in proportion to their weights.
    404 for a queue that has no job and no state."""
    check_queue_path(request, queue, "weights")
    return await service.set_weights(queue, data.weights, actor_of(actor))


@get("/queues", tags=["queues"], summary="Queue depth", responses=problems())
async def queues(
    service: NamedDependency[QueueService],
    depth_cache: NamedDependency[DepthCache],
    operator: NamedDependency[Operator],
    tenant: TenantScope = None,
) -> QueuesResponse:
    """Per-queue counts (from the Redis cache when fresh, else PostgreSQL), with `source` and
    `refreshedAt` saying which and when, and whether each queue is paused (since when, and
    its last change). With a `tenant`: that tenant's jobs only, counted in PostgreSQL, and
    only the queues it has live or dead-lettered jobs in."""
    if tenant is not None:
        return await operator.tenant_depth(tenant)
    return await service.queue_depth(depth_cache)


__all__ = ["JobController", "change_queue", "queues", "redrive", "set_limits", "set_weights"]
