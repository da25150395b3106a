"""HTTP routes of the queue service for the operator views (docs/architecture.md#operator-views):
bulk changes, delete, purge, workers, schedules, per-minute counts. Thin: `Operator` decides."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from litestar import Request, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter

from common.contracts import NAME_PATTERN
from common.operations import (
    BulkRequest,
    BulkResponse,
    PurgeRequest,
    PurgeResponse,
    SchedulesResponse,
    ThroughputResponse,
    WorkersResponse,
)
from common.web.app import problems
from common.web.bodies import StrictJSON
from common.web.list_params import Minutes, TenantScope
from common.web.queue_params import QueuePath, check_queue_path
from services.queue.operator import Operator

QueueNames = Annotated[
    list[Annotated[str, QueryParameter(pattern=NAME_PATTERN)]] | None,
    QueryParameter(name="queue", max_items=1000, description="Only these queues (repeatable)."),
]


@post(
    "/jobs/bulk",
    status_code=200,
    dto=StrictJSON[BulkRequest],
    tags=["jobs"],
    summary="Retry, cancel or delete every matching job",
    responses=problems(413, 415),
)
async def bulk_change(
    data: JSONBody[BulkRequest], operator: NamedDependency[Operator], tenant: TenantScope = None
) -> BulkResponse:
    """Count the matching jobs, then (unless `dryRun`) change at most `limit` of them in
    chunks of 500, each its own short statement."""
    return await operator.bulk(data, tenant)


@delete(
    "/jobs/{job_id:uuid}",
    status_code=204,
    tags=["jobs"],
    summary="Delete a finished job",
    responses=problems(404, 409),
)
async def delete_job(
    job_id: FromPath[uuid.UUID], operator: NamedDependency[Operator], tenant: TenantScope = None
) -> None:
    """Delete a COMPLETED, DEAD_LETTER or CANCELLED job; 409 for a live one."""
    await operator.delete(job_id, tenant)


@post(
    "/queues/{queue:str}/pending/purge",
    status_code=200,
    dto=StrictJSON[PurgeRequest],
    tags=["queues"],
    summary="Delete a queue's waiting jobs",
    responses=problems(413, 415),
)
async def purge(
    request: Request[Any, Any, Any],
    queue: QueuePath,
    data: JSONBody[PurgeRequest],
    operator: NamedDependency[Operator],
    tenant: TenantScope = None,
) -> PurgeResponse:
    """Delete the queue's PENDING and SCHEDULED jobs once `confirm` repeats its name."""
    check_queue_path(request, queue, "pending/purge")
    return await operator.purge(queue, data, tenant)


@get("/workers", tags=["operator"], summary="Live workers", responses=problems())
async def workers(operator: NamedDependency[Operator]) -> WorkersResponse:
    """Every worker that claimed or touched a lease within `QUEUE_WORKER_LIVE`."""
    return await operator.workers()


@get("/schedules", tags=["operator"], summary="Recurring schedules", responses=problems())
async def schedules(operator: NamedDependency[Operator]) -> SchedulesResponse:
    """Every configured schedule, its last fired bucket and job, and its next fire time."""
    return SchedulesResponse(schedules=await operator.schedule_views())


@get("/throughput", tags=["operator"], summary="Per-minute counts", responses=problems())
async def throughput(
    operator: NamedDependency[Operator], minutes: Minutes = 60, queue: QueueNames = None
) -> ThroughputResponse:
    """Completed and failed attempts per queue and minute over the last `minutes` minutes."""
    return ThroughputResponse(minutes=minutes, points=await operator.throughput(minutes, queue))


OPERATOR_ROUTES = [bulk_change, delete_job, purge, workers, schedules, throughput]
"""Registered by `services.queue.app`."""
