"""Waiting for a job's outcome (`GET /jobs/{id}?waitSeconds=N`) without polling.

A waiter watches the job's id in the replica's `WakeupHub`, then flags the job as awaited in
PostgreSQL; the settle that ends the job fires the trigger `job_settled_awaited`, whose
`jobq_settled` notification wakes the watchers of that id on every replica. A waiter holds no
database connection while it sleeps, and costs the settle of a job nobody waits for nothing
but the trigger's WHEN test (docs/adr/008-waiting-for-outcomes.md). The idea is pgqueuer's
CompletionWatcher and River's job output, with SQS's long-poll bound of 20 seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from common.coalesce import Coalescer
from common.contracts import FINISHED_STATUSES, JobView
from common.errors import JobNotFound
from services.queue.repository import JobRepository
from services.queue.wakeup import WakeupHub

_READS_MAX = 500
"""Woken waiters' jobs read by one statement at most."""


class OutcomeWaiters:
    """The waiters of one replica. Waiters woken together (one ack statement settles up to
    100 awaited jobs, whose notifications arrive together) read their jobs with one statement
    (`common.coalesce.Coalescer` with `gather`), not one each, nor a first one alone."""

    def __init__(self, repository: JobRepository, hub: WakeupHub, shutdown: asyncio.Event) -> None:
        self._repository = repository
        self._hub = hub
        self._shutdown = shutdown
        self._reads: Coalescer[uuid.UUID, JobView | None] = Coalescer(
            self._read_many, max_batch=_READS_MAX, max_in_flight=2, gather=True
        )

    async def aclose(self) -> None:
        """Finish the reads under way."""
        await self._reads.aclose()

    async def wait(self, job_id: uuid.UUID, tenant: str | None, within: float) -> JobView:
        """The job's view once it is COMPLETED, DEAD_LETTER or CANCELLED, or after `within`
        seconds (then as it is), or at once when a shutdown begins. Raises JobNotFound for a
        missing job, also (with a `tenant`) for another tenant's job."""
        deadline = time.monotonic() + within
        with self._hub.watch(job_id) as settled:
            while True:
                settled.clear()
                flagged = await self._repository.mark_awaited(job_id, tenant)
                view = flagged if flagged is not None else await self._read(job_id, tenant)
                while True:
                    remaining = deadline - time.monotonic()
                    if (
                        view.status in FINISHED_STATUSES
                        or remaining <= 0
                        or self._shutdown.is_set()
                    ):
                        return view
                    if flagged is None:
                        break  # live again without the flag (retried meanwhile): flag it
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(remaining):
                            await settled.wait()
                    settled.clear()
                    view = await self._read(job_id, tenant)

    async def _read(self, job_id: uuid.UUID, tenant: str | None) -> JobView:
        view = await self._reads.submit(job_id)
        if view is None or (tenant is not None and view.tenant != tenant):
            raise JobNotFound(f"no job has id {job_id}")
        return view

    async def _read_many(self, ids: list[uuid.UUID]) -> list[JobView | None]:
        found = {view.id: view for view in await self._repository.get_many(ids)}
        return [found.get(job_id) for job_id in ids]
