"""The operator views' rules on the queue service: a tenant's queue counts, bulk changes by
filter, deleting a finished job, purging a queue's waiting jobs, workers, schedules and
per-minute counts (docs/architecture.md#operator-views). SQL lives in `bulk` and `activity`."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from common.contracts import JobStatus, QueuesResponse
from common.errors import InvalidInput, InvalidState, JobNotFound
from common.operations import (
    BulkRequest,
    BulkResponse,
    MinuteCount,
    PurgeRequest,
    PurgeResponse,
    ScheduleView,
    WorkersResponse,
)
from services.queue import bulk, statements
from services.queue.activity import Activity
from services.queue.depth import summarise, with_states
from services.queue.readings import DepthRow
from services.queue.repository import JobRepository, depth_statement
from services.queue.schedules import Schedule

logger = logging.getLogger(__name__)

_TENANT_DEPTH = depth_statement("$1")


@dataclass(frozen=True, slots=True)
class Operator:
    """What the console and the command line ask of the queue service beyond single jobs."""

    repository: JobRepository
    activity: Activity
    schedules: list[Schedule]
    worker_live: float
    """Seconds since its last claim or lease touch within which a worker is listed."""

    async def tenant_depth(self, tenant: str) -> QueuesResponse:
        """Counts per queue of `tenant`'s jobs only, counted in PostgreSQL now, with each
        queue's state (paused, limits); queues the tenant has no live job in are left out."""
        rows = [
            DepthRow(r["queue"], JobStatus(r["status"]), r["count"], r["oldest_age"])
            for r in await self.repository.fetch(_TENANT_DEPTH, tenant)
        ]
        now = await self.repository.now()
        mine = summarise(rows, "postgres", now)
        names = {depth.queue for depth in mine}
        states = [s for s in await self.repository.queue_states() if s.queue in names]
        return QueuesResponse(
            queues=with_states(mine, states, "postgres", now), source="postgres", refreshed_at=now
        )

    async def bulk(self, request: BulkRequest, tenant: str | None) -> BulkResponse:
        """Count the jobs `request` matches (of `tenant`, None: every tenant), then, unless a
        dry run, apply its action to them in chunks. Raises InvalidInput for a status the
        action never applies to."""
        where = bulk.Filter(
            bulk.narrowed(request.action, request.status),
            request.queue,
            request.task_type,
            tenant,
            request.ids,
        )
        matched = await bulk.count(self.repository, where, request.limit)
        changed = 0
        if not request.dry_run and matched:
            changed = await bulk.apply(self.repository, request.action, where, request.limit)
            logger.info(
                "bulk %s changed %d job(s)",
                request.action,
                changed,
                extra={"event": "jobs_bulk_changed", "queue": request.queue, "tenant": tenant},
            )
        return BulkResponse(
            action=request.action, matched=matched, changed=changed, dry_run=request.dry_run
        )

    async def delete(self, job_id: uuid.UUID, tenant: str | None) -> None:
        """Delete a finished job (COMPLETED, DEAD_LETTER, CANCELLED). Raises JobNotFound (also
        for another tenant's job), InvalidState (409) for a live one."""
        where = bulk.Filter(bulk.ALLOWED["delete"], tenant=tenant, ids=[job_id])
        if await bulk.apply(self.repository, "delete", where, 1):
            return
        rows = await self.repository.fetch(
            "SELECT status FROM job_all WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
            job_id,
            tenant,
        )
        if not rows:
            raise JobNotFound(f"no job has id {job_id}")
        raise InvalidState(
            f"job {job_id} is {rows[0]['status']}; only finished jobs can be deleted (cancel it "
            "first)"
        )

    async def purge(self, queue: str, request: PurgeRequest, tenant: str | None) -> PurgeResponse:
        """Delete `queue`'s PENDING and SCHEDULED jobs (of `tenant`, None: every tenant's),
        once `request.confirm` repeats the queue's name. Raises InvalidInput otherwise."""
        if request.confirm != queue:
            raise InvalidInput(
                "a purge deletes every waiting job of the queue: confirm it by sending the "
                "queue's name as `confirm`",
                errors=[{"pointer": "/confirm", "detail": f"must be {queue!r}"}],
            )
        where = bulk.Filter(bulk.ALLOWED["purge"], queue=queue, tenant=tenant)
        matched = await bulk.count(self.repository, where, 2**62)
        deleted = 0
        if not request.dry_run and matched:
            deleted = await bulk.apply(self.repository, "purge", where, matched)
            logger.warning(
                "queue %s purged: %d waiting job(s) deleted",
                queue,
                deleted,
                extra={"event": "queue_purged", "queue": queue, "tenant": tenant},
            )
        return PurgeResponse(queue=queue, matched=matched, deleted=deleted, dry_run=request.dry_run)

    async def workers(self) -> WorkersResponse:
        """Every worker seen within `worker_live` seconds."""
        return WorkersResponse(
            workers=await self.activity.workers(self.worker_live), live_seconds=self.worker_live
        )

    async def schedule_views(self) -> list[ScheduleView]:
        """Every configured schedule with its last firing and next fire time."""
        return await self.activity.schedules(self.schedules)

    async def throughput(self, minutes: int, queues: list[str] | None) -> list[MinuteCount]:
        """Per-minute counts of the last `minutes` minutes (of `queues`; None: every queue)."""
        return await self.activity.throughput(minutes, queues)


statements.register(globals())
