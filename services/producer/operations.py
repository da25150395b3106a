"""Public routes of the operator views (docs/architecture.md#operator-views): queue counts,
bulk changes, delete, purge, workers, schedules and per-minute counts, each forwarded to the
queue service with the caller's tenant scope. The console and `jobq` use these and nothing
else."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Request, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from common.contracts import QueuesResponse
from common.operations import (
    BulkRequest,
    BulkResponse,
    PurgeRequest,
    PurgeResponse,
    SchedulesResponse,
    ThroughputResponse,
    WorkersResponse,
)
from common.web.access import ADMIN_ONLY
from common.web.app import problems
from common.web.bodies import StrictJSON
from common.web.list_params import Minutes
from common.web.queue_params import QueuePath, check_queue_path
from services.producer.routes import RATE_LIMITED, Producer


@get("/queues", tags=["queues"], summary="Queue counts", responses=problems(RATE_LIMITED))
async def queues(producer: NamedDependency[Producer]) -> QueuesResponse:
    """Per-queue counts (pending, scheduled, processing, dead-letter, oldest pending age) and
    each queue's state. A tenant's key sees its own jobs' counts (counted now); an admin of
    `*` sees every job's (from the depth cache when fresh)."""
    return await producer.queue.depth(producer.caller.scope)


@post(
    "/jobs/bulk",
    status_code=200,
    dto=StrictJSON[BulkRequest],
    tags=["jobs"],
    summary="Retry, cancel or delete every matching job; admin",
    responses=problems(403, 413, 415, RATE_LIMITED),
    opt=ADMIN_ONLY,
)
async def bulk_change(
    data: JSONBody[BulkRequest], producer: NamedDependency[Producer]
) -> BulkResponse:
    """`{"action": "retry"|"cancel"|"delete", "status"?, "queue"?, "taskType"?, "ids"?,
    "limit"?, "dryRun"?}`: count the caller's tenant's matching jobs (`dryRun`: only that),
    then change at most `limit` of them in chunks of 500. Jobs the action does not apply to
    are not matched; `422` for a status it never applies to."""
    return await producer.queue.bulk(data, producer.caller.scope)


@delete(
    "/jobs/{job_id:uuid}",
    status_code=204,
    tags=["jobs"],
    summary="Delete a finished job; admin",
    responses=problems(403, 404, 409, RATE_LIMITED),
    opt=ADMIN_ONLY,
)
async def delete_job(job_id: FromPath[uuid.UUID], producer: NamedDependency[Producer]) -> None:
    """Delete a COMPLETED, DEAD_LETTER or CANCELLED job; `409` for a live one (cancel it
    first); another tenant's job is a 404."""
    await producer.queue.delete(job_id, producer.caller.scope)


@post(
    "/queues/{queue:str}/pending/purge",
    status_code=200,
    dto=StrictJSON[PurgeRequest],
    tags=["queues"],
    summary="Delete a queue's waiting jobs; admin",
    responses=problems(403, 413, 415, RATE_LIMITED),
    opt=ADMIN_ONLY,
)
async def purge(
    request: Request[Any, Any, Any],
    queue: QueuePath,
    data: JSONBody[PurgeRequest],
    producer: NamedDependency[Producer],
) -> PurgeResponse:
    """Delete the queue's PENDING and SCHEDULED jobs of the caller's tenant (an admin of `*`:
    every tenant's) once `confirm` repeats the queue's name; `dryRun` only counts."""
    check_queue_path(request, queue, "pending/purge")
    return await producer.queue.purge(queue, data, producer.caller.scope)


@get(
    "/workers",
    tags=["operator"],
    summary="Live workers; admin",
    responses=problems(403, RATE_LIMITED),
    opt=ADMIN_ONLY,
)
async def workers(producer: NamedDependency[Producer]) -> WorkersResponse:
    """Every worker that claimed or held a lease recently: name, queues, slots in use and
    total, jobs claimed in the last minute, last seen."""
    return await producer.queue.workers()


@get(
    "/schedules",
    tags=["operator"],
    summary="Recurring schedules; admin",
    responses=problems(403, RATE_LIMITED),
    opt=ADMIN_ONLY,
)
async def schedules(producer: NamedDependency[Producer]) -> SchedulesResponse:
    """Every recurring schedule: cron, last fired bucket and job, next fire time."""
    return await producer.queue.schedules()


@get(
    "/throughput",
    tags=["operator"],
    summary="Completions and failures per queue and minute",
    responses=problems(RATE_LIMITED),
)
async def throughput(
    producer: NamedDependency[Producer], minutes: Minutes = 60
) -> ThroughputResponse:
    """Per-queue, per-minute counts of completed and failed attempts over the last `minutes`
    minutes (at most 1440), oldest first. A tenant's key gets the queues it has jobs in
    (their counts are the queue's, every tenant's)."""
    scope = producer.caller.scope
    if scope is None:
        return await producer.queue.throughput(minutes, None)
    mine = [depth.queue for depth in (await producer.queue.depth(scope)).queues]
    if not mine:
        return ThroughputResponse(minutes=minutes, points=[])
    return await producer.queue.throughput(minutes, mine)


OPERATOR_ROUTES = [queues, bulk_change, delete_job, purge, workers, schedules, throughput]
"""Registered by `services.producer.app`."""
