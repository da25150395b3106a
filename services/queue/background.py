"""The queue service's periodic work: reaper, scheduler, depth (with database health)
refresh and the hot table's vacuum; retention is the history's partition maintenance
(services/queue/history.py).

Every replica runs them all; each statement is safe to run concurrently (SKIP LOCKED), so
replicas share the work without electing a leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg

from common.contracts import JobStatus
from common.errors import JobqError
from common.logging import FailureRun, RepeatedEvents
from services.queue.depth import DepthCache
from services.queue.metrics import QueueMetrics
from services.queue.repository import JobRepository

logger = logging.getLogger(__name__)

BATCH = 500


async def every(
    name: str, interval: float, step: Callable[[], Awaitable[object]], shutdown: asyncio.Event
) -> None:
    """Run `step` every `interval` seconds until `shutdown` is set; a failing step is retried
    at the next tick, never fatal. A run of failures (a database that is down fails every tick)
    is logged by `common.logging.FailureRun`: its first failure, then at most every
    `common.logging.REPEAT_LOG_SECONDS`, and when it ends, so an outage is a few lines, not a
    traceback per tick. Unexpected errors (not JobqError/OSError) keep their traceback."""
    run = FailureRun(logger, name)
    while not shutdown.is_set():
        try:
            await step()
        except Exception as exc:
            expected = isinstance(exc, (JobqError, OSError))
            run.failed(
                "%s failed: %s" if expected else "%s crashed; retrying: %s",
                name,
                exc,
                exc_info=not expected,
            )
        else:
            run.succeeded()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(shutdown.wait(), timeout=interval)


MAX_VACUUM_BACKOFF = 60.0
"""The longest pause (seconds) of HotVacuum while its passes cannot remove the dead rows:
autovacuum's default naptime."""

REBUILD_GROWTH = 2.0
"""How many times its size after the last clean pass `job`'s indexes must have grown while a
pinned horizon kept HotVacuum's passes futile before the first clean pass after it rebuilds
them (REINDEX TABLE CONCURRENTLY)."""

REBUILD_LOCK_KEY = 0x6A6F6271_00000002
"""The session advisory lock one replica holds while it rebuilds `job`'s indexes (the
migrations hold 0x6A6F6271_00000001)."""

_INDEX_BYTES = "SELECT pg_indexes_size('job'::regclass) AS bytes"

# What an interrupted REINDEX CONCURRENTLY leaves behind: invalid copies named <index>_ccnew
# (or _ccold after the swap), still maintained by every write until dropped.
_REBUILD_LEFTOVERS = r"""
SELECT quote_ident(c.relname) AS name
FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = 'job'::regclass AND NOT i.indisvalid AND c.relname ~ '_cc(new|old)[0-9]*$'
"""


class HotVacuum:
    """Vacuums `job` whenever it holds `dead_rows` dead rows or more, checked every
    `interval` seconds (`QUEUE_VACUUM_DEAD_ROWS`, `QUEUE_VACUUM_INTERVAL`;
    docs/architecture.md#storage).

    Every job leaves two dead rows in `job` (its claim's old version and the move's delete),
    and their index entries stay until a vacuum: a claim walks `ix_job_claim` from its head,
    where the jobs claimed since the last vacuum lie, and a settle's lookups walk the same
    kind of entries. Autovacuum visits a table at most once per `autovacuum_naptime` (1 min
    by default, a server-wide setting), so at 1,000 jobs/s ~120,000 dead entries pile up
    between its visits and every claim pays more as the minute goes on; PostgreSQL's planner
    does not count dead entries, so a plan made when the table looked small reads them all.
    Vacuuming every few thousand dead rows keeps that bounded; a pass over the small live
    table costs milliseconds. `VACUUM (SKIP_LOCKED)` leaves the table to a vacuum already
    running (autovacuum's, another replica's) instead of waiting for it; the statement
    timeout is off for it (a pass after a large backlog may take longer). A pass that leaves
    `dead_rows` or more behind (an open transaction's snapshot still sees them, or another
    vacuum held the table) doubles the pause before the next one, up to
    `MAX_VACUUM_BACKOFF`, so a pinned horizon does not make every replica read the table
    again every few seconds for nothing. As awa's notes on a claimable table put it, expect
    rate x vacuum cycle dead rows there: this shortens the cycle without touching the
    server's settings.

    A vacuum frees index pages for reuse but never gives them back, so while a horizon is
    pinned (a report's 60 s REPEATABLE READ snapshot at 1,000 jobs/s keeps ~180,000 dead
    versions) the indexes grow to hold every version and stay that size after: four times
    the table's usual size in the soak of benchmark/README.md. So the first clean pass after
    futile ones, if the indexes have grown `REBUILD_GROWTH` times their size after the last
    clean pass, rebuilds them with `REINDEX TABLE CONCURRENTLY`, which blocks no claim or
    write (PostgreSQL's own remedy for index bloat, as pg_repack's is for tables); one replica
    at a time, under the advisory lock `REBUILD_LOCK_KEY`, dropping first what an interrupted
    rebuild left. A large backlog that grows the indexes without a pinned horizon is left
    alone: its pages are in use."""

    def __init__(
        self, repository: JobRepository, metrics: QueueMetrics, dead_rows: int, interval: float
    ) -> None:
        self._repository = repository
        self._metrics = metrics
        self._dead_rows = dead_rows
        self._interval = interval
        self._pause = 0.0
        self._resume_at = 0.0
        self._pinned = False
        self._settled_bytes: int | None = None

    async def _dead(self) -> int:
        # The statistics collector's count (it lags by up to a second), from the same reading
        # the depth refresh exports as jobq_db_dead_tuples.
        return (await self._repository.health()).dead_tuples

    async def tick(self) -> bool:
        """Vacuum `job` if it holds `dead_rows` dead rows or more and no pause is running;
        whether it ran VACUUM (which skips the table at once if another vacuum holds it).

        Raises: ServiceUnavailable (common.errors) when the database cannot be reached."""
        if time.monotonic() < self._resume_at or await self._dead() < self._dead_rows:
            return False
        started = time.perf_counter()
        async with self._untimed() as connection:
            await connection.execute("VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) job")
        self._metrics.hot_vacuum.observe(time.perf_counter() - started)
        if await self._dead() >= self._dead_rows:
            self._pause = min(max(2 * self._pause, 2 * self._interval), MAX_VACUUM_BACKOFF)
            self._resume_at = time.monotonic() + self._pause
            self._pinned = True
        else:
            self._pause = 0.0
            await self._after_clean_pass()
        return True

    @contextlib.asynccontextmanager
    async def _untimed(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection without a statement timeout, reset before it goes back (VACUUM
        and REINDEX CONCURRENTLY cannot run in a transaction, where SET LOCAL would scope it)."""
        async with self._repository.connection() as connection:
            await connection.execute("SET statement_timeout = 0")
            try:
                yield connection
            finally:
                await connection.execute("RESET statement_timeout")

    async def _index_bytes(self) -> int:
        return int((await self._repository.fetch(_INDEX_BYTES))[0]["bytes"])

    async def _after_clean_pass(self) -> None:
        size = await self._index_bytes()
        grown = self._settled_bytes is not None and size > REBUILD_GROWTH * self._settled_bytes
        if self._pinned and grown:
            size = await self.rebuild_indexes() or size
        self._pinned = False
        self._settled_bytes = size

    async def rebuild_indexes(self) -> int | None:
        """Rebuild every index of `job` with `REINDEX TABLE CONCURRENTLY` (writes and claims go
        on; no statement timeout), after dropping the invalid copies an interrupted rebuild
        left; the indexes' bytes after it, or None when another replica holds
        `REBUILD_LOCK_KEY` (nothing done).

        Raises: ServiceUnavailable (common.errors) when the database cannot be reached;
        asyncpg.PostgresError when the rebuild fails (its copies are dropped by the next)."""
        started = time.perf_counter()
        async with self._untimed() as connection:
            if not await connection.fetchval("SELECT pg_try_advisory_lock($1)", REBUILD_LOCK_KEY):
                return None
            try:
                before = await connection.fetchval(_INDEX_BYTES)
                for row in await connection.fetch(_REBUILD_LEFTOVERS):
                    await connection.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {row['name']}")
                await connection.execute("REINDEX TABLE CONCURRENTLY job")
                after = int(await connection.fetchval(_INDEX_BYTES))
            finally:
                await connection.execute("SELECT pg_advisory_unlock($1)", REBUILD_LOCK_KEY)
        elapsed = time.perf_counter() - started
        self._metrics.hot_reindex.observe(elapsed)
        logger.info(
            "rebuilt the indexes of job after a pinned horizon: %.1f -> %.1f MiB in %.2f s",
            before / 2**20,
            after / 2**20,
            elapsed,
            extra={"event": "hot_reindex"},
        )
        return after


class Reaper:
    """Returns expired leases to PENDING, or dead-letters jobs that are out of attempts."""

    def __init__(self, repository: JobRepository, metrics: QueueMetrics) -> None:
        self._repository = repository
        self._metrics = metrics
        self._repeats = RepeatedEvents()

    async def sweep(self) -> int:
        """Reap every expired lease, in batches; returns how many were reaped (the statement
        also wakes claimers of the queues that got jobs back)."""
        total = 0
        while True:
            reaped = await self._repository.reap_expired(BATCH)
            for job in reaped:
                queue, task = self._metrics.seed(job.queue, job.task_type)
                self._metrics.lease_expired.labels(queue).inc()
                extra = {"event": "lease_expired", "job_id": str(job.id), "status": job.status}
                # Folded per queue: a crashed worker expires its whole batch of leases.
                if job.status is JobStatus.DEAD_LETTER:
                    self._metrics.processed.labels(queue, task, "dead_letter").inc()
                    self._repeats.log(
                        logger,
                        logging.ERROR,
                        job.queue,
                        "lease expired on the last attempt; dead-lettered",
                        extra=extra,
                    )
                else:
                    self._repeats.log(
                        logger,
                        logging.WARNING,
                        job.queue,
                        "lease expired; job is ready again",
                        extra=extra,
                    )
            total += len(reaped)
            if len(reaped) < BATCH:
                return total


class Scheduler:
    """Promotes due SCHEDULED jobs (delays, backoff) to PENDING and wakes claimers."""

    def __init__(self, repository: JobRepository) -> None:
        self._repository = repository

    async def promote(self) -> int:
        """Promote every due job, in batches; returns how many were promoted."""
        total = 0
        while True:
            counts = await self._repository.promote_due(BATCH)
            promoted = sum(counts.values())
            total += promoted
            if promoted < BATCH:
                return total


async def refresh_depth(
    repository: JobRepository, cache: DepthCache, metrics: QueueMetrics
) -> None:
    """Read depth, the queues' pause states and their limits' slots in use from PostgreSQL,
    publish them as gauges (and the jobs handed out by tenant since the last refresh as a
    counter) and cache depth and states in Redis; then read the database's
    health (one cheap statement) and publish it too. The freshness gauges record
    when the depth read and the cache write last succeeded (the staleness alerts read them)."""
    rows = await repository.depth()
    states = await repository.queue_states()
    metrics.observe_depth(rows)
    metrics.observe_paused(states)
    if any(state.limits for state in states):
        metrics.observe_limits(await repository.limit_readings())
    else:
        metrics.observe_limits([])
    metrics.count_claimed(repository.take_claimed_by_tenant())
    metrics.depth_refreshed.set_to_current_time()
    if await cache.store(rows, states) and metrics.depth_cache_written is not None:
        metrics.depth_cache_written.set_to_current_time()
    metrics.observe_health(await repository.health())
