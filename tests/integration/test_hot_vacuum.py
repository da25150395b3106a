"""The live table's own vacuum (services/queue/background.py, HotVacuum) against real
PostgreSQL: it runs once `job` holds its threshold of dead rows, not before, it removes them,
index entries included, it pauses while a snapshot keeps them, and it rebuilds the indexes
such a snapshot grew once it is gone."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from common.enqueue import ENQUEUE_ASYNCPG, encode_rows
from services.queue.background import REBUILD_LOCK_KEY, HotVacuum
from services.queue.metrics import QueueMetrics
from services.queue.repository import JobRepository
from tests.helpers import new_job

_STATS = """
SELECT n_dead_tup AS dead, vacuum_count AS vacuums
FROM pg_stat_user_tables WHERE relid = 'job'::regclass
"""


async def _churn(url: str, jobs: int) -> dict[str, int]:
    """`jobs` jobs submitted, then deleted (each leaves a dead row and dead index entries);
    the session's statistics flushed so the next reader sees them. The table's counts after."""
    connection = await asyncpg.connect(url)
    try:
        await connection.fetch(ENQUEUE_ASYNCPG, encode_rows([new_job() for _ in range(jobs)]))
        await connection.execute("DELETE FROM job")
        await connection.execute("SELECT pg_stat_force_next_flush()")
    finally:
        await connection.close()
    return await _stats(url)


async def _stats(url: str) -> dict[str, int]:
    connection = await asyncpg.connect(url)
    try:
        return dict(await connection.fetchrow(_STATS))
    finally:
        await connection.close()


async def test_vacuums_the_live_table_from_its_threshold_of_dead_rows(
    repository: JobRepository, clean_database: str
) -> None:
    metrics = QueueMetrics(CollectorRegistry())
    before = await _churn(clean_database, 600)
    assert before["dead"] >= 600, before

    assert not await HotVacuum(repository, metrics, before["dead"] + 1, interval=5.0).tick()
    assert (await _stats(clean_database))["vacuums"] == before["vacuums"]

    assert await HotVacuum(repository, metrics, before["dead"], interval=5.0).tick()
    after = await _stats(clean_database)
    assert after["vacuums"] == before["vacuums"] + 1
    assert after["dead"] == 0, after
    assert metrics.registry.get_sample_value("jobq_hot_vacuum_duration_seconds_count") == 1


async def _claim_walk_buffers(url: str) -> int:
    """Buffers the executor read for the claim's first job by an index walk of ix_job_claim
    (planning's reads left out)."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        plan = [
            row[0]
            for row in await connection.fetch(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF)"
                " SELECT id FROM job WHERE status = 'PENDING' AND queue = 'default'"
                " ORDER BY priority DESC, ready_at, id LIMIT 1"
            )
        ]
    finally:
        await connection.close()
    planning = [i for i, line in enumerate(plan) if line.strip() == "Planning:"]
    executed = plan[: planning[0]] if planning else plan
    assert any("ix_job_claim" in line for line in executed), plan
    return max(int(line.split("hit=")[1].split()[0]) for line in executed if "hit=" in line)


async def test_a_vacuum_leaves_the_claim_walk_no_dead_entry_to_read(
    repository: JobRepository, clean_database: str
) -> None:
    await _churn(clean_database, 2000)
    connection = await asyncpg.connect(clean_database)
    try:
        await connection.fetch(ENQUEUE_ASYNCPG, encode_rows([new_job()]))
    finally:
        await connection.close()
    # The one PENDING job lies behind the 2,000 dead entries the churn left at the head of
    # the claim index: the walk reads their pages and heap tuples first.
    assert await _claim_walk_buffers(clean_database) > 50
    await HotVacuum(repository, QueueMetrics(CollectorRegistry()), 1, interval=5.0).tick()
    # After the vacuum: one descent of a small index and the job's heap page.
    assert await _claim_walk_buffers(clean_database) <= 10


async def test_pauses_while_a_snapshot_keeps_the_dead_rows_and_resumes_after(
    repository: JobRepository, clean_database: str
) -> None:
    holder = await asyncpg.connect(clean_database)
    try:
        # A report's REPEATABLE READ transaction: its snapshot predates the churn, so vacuum
        # may remove none of the rows the churn leaves dead.
        reader = holder.transaction(isolation="repeatable_read")
        await reader.start()
        await holder.fetchval("SELECT count(*) FROM job")
        before = await _churn(clean_database, 600)
        vacuum = HotVacuum(repository, QueueMetrics(CollectorRegistry()), 500, interval=1.0)
        assert await vacuum.tick(), "the threshold is reached: a pass runs"
        assert (await _stats(clean_database))["dead"] >= 500, "the snapshot kept them"
        assert not await vacuum.tick(), "a futile pass pauses the next (2 x the interval)"
        assert (await _stats(clean_database))["vacuums"] == before["vacuums"] + 1
        await reader.commit()
    finally:
        await holder.close()
    await asyncio.sleep(2.2)
    assert await vacuum.tick(), "the pause is over"
    after = await _stats(clean_database)
    assert after["vacuums"] == before["vacuums"] + 2
    assert after["dead"] == 0, after


_INDEXES = """
SELECT c.relname AS name, i.indisvalid AS valid
FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = 'job'::regclass ORDER BY 1
"""


async def _indexes(url: str) -> tuple[int, dict[str, bool]]:
    """The total size of `job`'s indexes in bytes, and each index's validity by name."""
    connection = await asyncpg.connect(url)
    try:
        size = await connection.fetchval("SELECT pg_indexes_size('job'::regclass)")
        return size, {row["name"]: row["valid"] for row in await connection.fetch(_INDEXES)}
    finally:
        await connection.close()


async def test_rebuilds_the_indexes_a_pinned_horizon_grew_once_it_moves_on(
    repository: JobRepository, clean_database: str
) -> None:
    metrics = QueueMetrics(CollectorRegistry())
    vacuum = HotVacuum(repository, metrics, 500, interval=0.5)
    await _churn(clean_database, 600)
    assert await vacuum.tick(), "a clean pass: the indexes' usual size noted"
    usual, names = await _indexes(clean_database)
    holder = await asyncpg.connect(clean_database)
    try:
        reader = holder.transaction(isolation="repeatable_read")
        await reader.start()
        await holder.fetchval("SELECT count(*) FROM job")
        await _churn(clean_database, 20_000)
        assert await vacuum.tick(), "a futile pass: the snapshot keeps every version"
        grown, _ = await _indexes(clean_database)
        assert grown > 4 * usual, (grown, usual)
        await reader.commit()
    finally:
        await holder.close()
    await asyncio.sleep(1.1)
    assert await vacuum.tick(), "the pause is over: a clean pass, then the rebuild"
    assert metrics.registry.get_sample_value("jobq_hot_reindex_duration_seconds_count") == 1
    rebuilt, after = await _indexes(clean_database)
    assert rebuilt <= usual, (rebuilt, usual, grown)
    assert after == names and all(after.values()), after

    await _churn(clean_database, 600)
    assert await vacuum.tick(), "clean passes without a pinned horizon in between"
    assert metrics.registry.get_sample_value("jobq_hot_reindex_duration_seconds_count") == 1


async def _interrupted_rebuild(url: str) -> None:
    """A `REINDEX TABLE CONCURRENTLY job` cancelled while it waits for a writer's transaction,
    after it made its `_ccnew` copies: what a rebuild killed half-way leaves."""
    writer = await asyncpg.connect(url)
    rebuilder = await asyncpg.connect(url)
    try:
        open_write = writer.transaction()
        await open_write.start()
        await writer.execute("LOCK TABLE job IN ROW EXCLUSIVE MODE")
        rebuild = asyncio.create_task(rebuilder.execute("REINDEX TABLE CONCURRENTLY job"))
        pid = rebuilder.get_server_pid()
        for _ in range(200):
            if await writer.fetchval(
                "SELECT count(*) FROM pg_class WHERE relname LIKE '%\\_ccnew%'"
            ):
                break
            await asyncio.sleep(0.05)
        await writer.execute("SELECT pg_cancel_backend($1)", pid)
        with pytest.raises(asyncpg.QueryCanceledError):
            await rebuild
        await open_write.rollback()
    finally:
        await writer.close()
        await rebuilder.close()


async def test_a_rebuild_waits_its_turn_and_drops_what_an_interrupted_one_left(
    repository: JobRepository, clean_database: str
) -> None:
    _, names = await _indexes(clean_database)
    await _interrupted_rebuild(clean_database)
    _, left = await _indexes(clean_database)
    copies = {name for name in left if name.endswith("_ccnew")}
    assert copies and not any(left[name] for name in copies), left
    vacuum = HotVacuum(repository, QueueMetrics(CollectorRegistry()), 500, interval=5.0)
    other = await asyncpg.connect(clean_database)
    try:
        await other.execute("SELECT pg_advisory_lock($1)", REBUILD_LOCK_KEY)
        assert not await vacuum.rebuild_indexes(), "another replica is at it"
        await other.execute("SELECT pg_advisory_unlock($1)", REBUILD_LOCK_KEY)
    finally:
        await other.close()
    assert await vacuum.rebuild_indexes()
    _, after = await _indexes(clean_database)
    assert after == names and all(after.values()), after
