"""HTTP routes of the producer: validate at the boundary, mint the job id, forward."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post, put
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, JSONBody

from common.batch import decode_entries, entry_result, split_valid
from common.contracts import (
    LIST_LIMIT_DEFAULT,
    BatchSubmitRequest,
    BatchSubmitResponse,
    EnqueueRequest,
    JobList,
    JobView,
    LimitsRequest,
    QueueState,
    RedriveRequest,
    RedriveResponse,
    SubmitJobRequest,
    SubmitJobResponse,
    WeightsRequest,
)
from common.errors import Forbidden, JobqError, OutcomeUnknown
from common.ids import new_job_id
from common.validation import check_payload
from common.web import tracing
from common.web.access import ADMIN_ONLY, ALL_TENANTS, Caller
from common.web.app import problems
from common.web.bodies import StrictJSON, SubmitJSON
from common.web.list_params import (
    LIST_PARAMETERS,
    Cursor,
    KeyFilter,
    Limit,
    QueueFilter,
    StatusFilter,
    TaskTypeFilter,
    View,
    WaitSeconds,
    refuse_unknown_parameters,
)
from common.web.queue_params import QueueAction, QueuePath, check_queue_path
from services.producer.admission import Admission
from services.producer.client import QueueServiceClient
from services.producer.tracing import submit_span


@dataclass(frozen=True, slots=True)
class Producer:
    """What a route works with: the queue service's client, the caller (its role and tenant)
    and the admission rules for submits. One dependency, so Litestar resolves it inline."""

    queue: QueueServiceClient
    caller: Caller
    admission: Admission


RATE_LIMITED = 429
"""Any public route may answer it (docs/architecture.md#rate-limits)."""

OUTCOME_UNKNOWN = 504
"""A submit forwarded but not answered in time (docs/architecture.md#idempotency)."""

PUBLIC_LIST_PARAMETERS = LIST_PARAMETERS - {"tenant"}
"""The public listing has no tenant parameter: the key decides."""


class JobController(Controller):
    """The public job API."""

    path = "/jobs"
    tags = ["jobs"]

    @post(
        "/",
        status_code=202,
        dto=SubmitJSON[SubmitJobRequest],
        summary="Submit a job",
        responses={
            200: ResponseSpec(SubmitJobResponse, description="Replay of an earlier submit"),
            **problems(409, 413, 415, RATE_LIMITED, OUTCOME_UNKNOWN),
        },
    )
    async def submit(
        self,
        data: JSONBody[SubmitJobRequest],
        producer: NamedDependency[Producer],
        request: Request[Any, Any, Any],
    ) -> Response[SubmitJobResponse]:
        """Validate the job and hand it to the queue service (group-committed with concurrent
        submits; the reply comes after the insert committed). The caller's tenant owns it.

        The job id is minted here, once, so a retried forward is a replay, never a duplicate,
        and a forward whose answer never came is answered 504 `outcome-unknown` with that id.
        """
        size = check_payload(data.payload)
        await producer.admission.admit_jobs(producer.caller, 1)
        await producer.admission.admit(producer.caller, data)
        fields = msgspec.structs.asdict(data)
        job = EnqueueRequest(**fields, job_id=new_job_id(), tenant=producer.caller.owner)
        if tracing.tracer is None:
            reply, created = await producer.queue.submit(job, size)
        else:
            with submit_span(tracing.tracer, request, [job]) as traced:
                reply, created = await producer.queue.submit(traced[0], size)
        return Response(
            reply,
            status_code=202 if created else 200,
            headers={"Location": f"/jobs/{reply.job_id}"},
        )

    @post(
        "/batch",
        status_code=200,
        summary="Submit up to 500 jobs",
        dto=StrictJSON[BatchSubmitRequest],
        responses=problems(413, 415, RATE_LIMITED, OUTCOME_UNKNOWN),
    )
    async def submit_batch(
        self,
        data: JSONBody[BatchSubmitRequest],
        producer: NamedDependency[Producer],
        request: Request[Any, Any, Any],
    ) -> BatchSubmitResponse:
        """Each entry is validated on its own and answered in order: 202 created, 200 replay
        (also a key repeated within the batch), 409, 413, 422 or 429 with problem details.
        Every entry counts against the tenant's job rate: a batch that does not fit in what
        is left of it is refused whole with 429. A forward whose answer never came is 504
        `outcome-unknown`, listing the id minted for each forwarded entry (`jobs`)."""
        await producer.admission.admit_jobs(producer.caller, len(data.jobs))
        decoded: list[SubmitJobRequest | JobqError] = []
        for index, candidate in enumerate(decode_entries(data.jobs, SubmitJobRequest)):
            if not isinstance(candidate, JobqError):
                try:
                    await producer.admission.admit(
                        producer.caller, candidate, f"/jobs/{index}/payload"
                    )
                except JobqError as exc:
                    candidate = exc
            decoded.append(candidate)
        indexes, valid = split_valid(decoded)
        results = [entry_result(i, d) for i, d in enumerate(decoded) if isinstance(d, JobqError)]
        if valid:
            forwarded = [
                EnqueueRequest(
                    **msgspec.structs.asdict(candidate),
                    job_id=new_job_id(),
                    tenant=producer.caller.owner,
                )
                for candidate in valid
            ]
            try:
                if tracing.tracer is None:
                    reply = await producer.queue.submit_batch(forwarded)
                else:
                    with submit_span(tracing.tracer, request, forwarded) as traced:
                        reply = await producer.queue.submit_batch(traced)
            except OutcomeUnknown as exc:
                raise OutcomeUnknown(
                    "the queue service did not answer in time, so these jobs may or may not "
                    "have been created: GET /jobs/{jobId} to find out, or retry with the same "
                    "idempotency keys",
                    jobs=[
                        {"index": index, "jobId": str(sent.job_id)}
                        | ({"idempotencyKey": sent.idempotency_key} if sent.idempotency_key else {})
                        for index, sent in zip(indexes, forwarded, strict=True)
                    ],
                ) from exc
            for entry in reply.results:
                results.append(msgspec.structs.replace(entry, index=indexes[entry.index]))
        return BatchSubmitResponse(results=sorted(results, key=lambda r: r.index))

    @get(
        "/",
        summary="List jobs (newest first); admin",
        responses=problems(403, RATE_LIMITED),
        opt=ADMIN_ONLY,
    )
    async def list_jobs(
        self,
        producer: NamedDependency[Producer],
        request: Request[Any, Any, Any],
        status: StatusFilter = None,
        queue: QueueFilter = None,
        task_type: TaskTypeFilter = None,
        idempotency_key: KeyFilter = None,
        cursor: Cursor = None,
        limit: Limit = LIST_LIMIT_DEFAULT,
        view: View = "summary",
    ) -> JobList:
        """Filter by status (`DEAD_LETTER` lists the dead-letter queue), queue and task type;
        keyset pagination, stable while new jobs arrive. A tenant's admin lists its tenant's
        jobs; an admin of `*`, every tenant's. Jobs come in the summary view (no payload,
        errors or result) unless `view=full`; a page stops at `limit` jobs or 1 MiB of JSON
        (at least one job), and `nextCursor` carries on."""
        refuse_unknown_parameters(request, PUBLIC_LIST_PARAMETERS)
        params: dict[str, str | int] = {"limit": limit}
        wanted: tuple[tuple[str, object], ...] = (
            ("status", status),
            ("queue", queue),
            ("taskType", task_type),
            ("idempotencyKey", idempotency_key),
            ("cursor", cursor),
            # Sent only when asked for: a queue service of the previous release knows no view.
            ("view", None if view == "summary" else view),
            ("tenant", producer.caller.scope),
        )
        for name, value in wanted:
            if value is not None:
                params[name] = str(value)
        return await producer.queue.list_jobs(params)

    @get("/{job_id:uuid}", summary="Read a job", responses=problems(404, RATE_LIMITED))
    async def read(
        self,
        job_id: FromPath[uuid.UUID],
        producer: NamedDependency[Producer],
        wait_seconds: WaitSeconds = 0,
    ) -> JobView:
        """The job's full view; another tenant's job is a 404, like a missing one. With
        `waitSeconds`, answered once the job is finished or the time is up."""
        return await producer.queue.get(job_id, producer.caller.scope, wait_seconds)

    @post(
        "/{job_id:uuid}/cancel",
        status_code=200,
        summary="Cancel a job",
        responses=problems(403, 404, 409, RATE_LIMITED),
        opt=ADMIN_ONLY,
    )
    async def cancel(
        self,
        job_id: FromPath[uuid.UUID],
        producer: NamedDependency[Producer],
    ) -> JobView:
        """PENDING/SCHEDULED → CANCELLED at once; PROCESSING → the worker is asked to stop and
        the job ends CANCELLED when it confirms; 409 when the job already finished."""
        return await producer.queue.act(job_id, "cancel", producer.caller.scope)

    @post(
        "/{job_id:uuid}/retry",
        status_code=200,
        summary="Run a dead-lettered or cancelled job again",
        responses=problems(403, 404, 409, RATE_LIMITED),
        opt=ADMIN_ONLY,
    )
    async def retry(
        self,
        job_id: FromPath[uuid.UUID],
        producer: NamedDependency[Producer],
    ) -> JobView:
        """DEAD_LETTER/CANCELLED → PENDING with attempts and releases reset; 409 otherwise."""
        return await producer.queue.act(job_id, "retry", producer.caller.scope)


def _global_admin(producer: Producer) -> Caller:
    """The caller, when it is an admin of every tenant (`admin:*`): a queue is shared by
    every tenant that submits to it, so pausing it is not one tenant's decision. Raises
    Forbidden otherwise."""
    caller = producer.caller
    if caller.tenant != ALL_TENANTS:
        raise Forbidden(
            "a queue serves every tenant: pausing, resuming or limiting it needs an admin key of "
            "tenant * (admin:*:<key>)"
        )
    return caller


@post(
    "/queues/{queue:str}/{action:str}",
    status_code=200,
    tags=["queues"],
    summary="Pause or resume a queue; admin of every tenant",
    responses=problems(403, 404, RATE_LIMITED),
    opt=ADMIN_ONLY,
)
async def change_queue(
    request: Request[Any, Any, Any],
    queue: QueuePath,
    action: QueueAction,
    producer: NamedDependency[Producer],
) -> QueueState:
    """`pause`: the queue keeps taking submits but hands out nothing, on every queue-service
    replica, from the next claim on; running jobs finish; workers' long polls wait. `resume`:
    it hands out jobs again, waiting workers woken at once. Recorded with the caller's key
    id. 404 for a queue that has no job and was never paused."""
    caller = _global_admin(producer)
    check_queue_path(request, queue, action)
    return await producer.queue.set_paused(queue, action == "pause", caller.actor)


@put(
    "/queues/{queue:str}/limits",
    status_code=200,
    dto=StrictJSON[LimitsRequest],
    tags=["queues"],
    summary="Set a queue's concurrency limits by task type; admin of every tenant",
    responses=problems(403, 404, 413, 415, RATE_LIMITED),
    opt=ADMIN_ONLY,
)
async def set_limits(
    request: Request[Any, Any, Any],
    queue: QueuePath,
    data: JSONBody[LimitsRequest],
    producer: NamedDependency[Producer],
) -> QueueState:
    """Replace the queue's concurrency limits, one per task type (`{"limits": [{"taskType":
    "webhook", "concurrency": 20, "tenantConcurrency": 3}]}`; `{"limits": []}` removes them):
    from the next claim on, on every queue-service replica, at most `concurrency` jobs of the
    task type run at once, and at most `tenantConcurrency` of one tenant. Recorded with the
    caller's key id. 404 for a queue that has no job and no state."""
    caller = _global_admin(producer)
    check_queue_path(request, queue, "limits")
    return await producer.queue.set_limits(queue, data, caller.actor)


@put(
    "/queues/{queue:str}/weights",
    status_code=200,
    dto=StrictJSON[WeightsRequest],
    tags=["queues"],
    summary="Set the tenants' weights in a queue's fair share; admin of every tenant",
    responses=problems(403, 404, 413, 415, RATE_LIMITED),
    opt=ADMIN_ONLY,
)
async def set_weights(
    request: Request[Any, Any, Any],
    queue: QueuePath,
    data: JSONBody[WeightsRequest],
    producer: NamedDependency[Producer],
) -> QueueState:
    """Replace the tenants' weights in the queue's fair share (`{"weights": [{"tenant":
    "acme", "weight": 3}]}`; `{"weights": []}`: every tenant weighs 1): from the next claim
    on, on every queue-service replica, tenants with ready jobs in the queue get them in
    proportion to their weights. Recorded with the caller's key id. 404 for a queue that has
    no job and no state."""
    caller = _global_admin(producer)
    check_queue_path(request, queue, "weights")
    return await producer.queue.set_weights(queue, data, caller.actor)


@post(
    "/dead-letter/redrive",
    status_code=200,
    dto=StrictJSON[RedriveRequest],
    tags=["dead-letter"],
    summary="Redrive dead-lettered jobs; admin",
    responses=problems(403, 413, 415, RATE_LIMITED),
    opt=ADMIN_ONLY,
)
async def redrive(
    data: JSONBody[RedriveRequest],
    producer: NamedDependency[Producer],
) -> RedriveResponse:
    """Move the caller's tenant's dead-lettered jobs (optionally of one queue and task type)
    back to PENDING; an admin of `*` moves every tenant's."""
    return await producer.queue.redrive(data, producer.caller.scope)
