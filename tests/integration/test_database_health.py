"""Database health from the queue service's /metrics (the xmin horizon, bloat, vacuum) and the
server-side limits on the service's own sessions."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from litestar import Litestar
from prometheus_client.parser import text_string_to_metric_families

from services.queue.app import create_app
from services.queue.settings import QueueSettings
from tests.conftest import serving
from tests.helpers import eventually


def gauge(metrics: str, name: str, **labels: str) -> float | None:
    """The value of sample `name` with exactly `labels` in a /metrics text, or None."""
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


@pytest.fixture
async def served(clean_database: str) -> AsyncIterator[tuple[Litestar, httpx.AsyncClient]]:
    settings = QueueSettings(
        database_url=clean_database,
        redis_url="",
        queue_depth_interval=0.2,
        queue_db_statement_timeout=0.5,
        queue_db_idle_in_transaction_timeout=0.5,
    )
    app = create_app(settings)
    async with serving(app) as client:
        yield app, client


async def test_a_held_repeatable_read_transaction_shows_in_the_oldest_transaction_gauge(
    served: tuple[Litestar, httpx.AsyncClient], clean_database: str
) -> None:
    _, client = served

    async def oldest() -> float:
        value = gauge((await client.get("/metrics")).text, "jobq_db_oldest_transaction_age_seconds")
        return -1.0 if value is None else value

    holder = await asyncpg.connect(clean_database)
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM job")
        held = await eventually(oldest, lambda age: age >= 1.0, what="the held transaction's age")
        assert held < 3600
        await holder.execute("COMMIT")
        await eventually(oldest, lambda age: 0 <= age < 1.0, what="the gauge after COMMIT")
    finally:
        await holder.close()


async def test_dead_and_live_tuples_and_vacuum_age_of_the_job_table(
    served: tuple[Litestar, httpx.AsyncClient], clean_database: str
) -> None:
    _, client = served
    for _ in range(20):
        await client.post("/jobs", json={"taskType": "noop", "payload": {}})
    writer = await asyncpg.connect(clean_database)
    try:
        await writer.execute("DELETE FROM job WHERE id IN (SELECT id FROM job LIMIT 5)")
    finally:
        await writer.close()

    async def table_stats() -> tuple[float | None, float | None]:
        metrics = (await client.get("/metrics")).text
        return (
            gauge(metrics, "jobq_db_live_tuples", table="job"),
            gauge(metrics, "jobq_db_dead_tuples", table="job"),
        )

    # The statistics are estimates (an autoanalyze may land in between), so bounds, not equality.
    await eventually(
        table_stats,
        lambda s: (s[0] or 0) >= 15 and (s[1] or 0) >= 5,
        what="at least 15 live and 5 dead tuples of job",
    )

    vacuum = await asyncpg.connect(clean_database)
    try:
        await vacuum.execute("VACUUM job")
    finally:
        await vacuum.close()

    async def since_vacuum() -> float:
        value = gauge(
            (await client.get("/metrics")).text, "jobq_db_last_vacuum_age_seconds", table="job"
        )
        return math.nan if value is None else value

    age = await eventually(since_vacuum, lambda v: not math.isnan(v), what="a vacuum age")
    assert 0 <= age < 3600
    await eventually(table_stats, lambda s: s[1] == 0.0, what="no dead tuples after VACUUM")


async def test_service_sessions_carry_statement_and_idle_in_transaction_timeouts(
    served: tuple[Litestar, httpx.AsyncClient], clean_database: str
) -> None:
    app, _ = served
    pool = app.state.pool
    async with pool.acquire() as conn:
        shown = [
            await conn.fetchval(f"SHOW {name}")
            for name in ("statement_timeout", "idle_in_transaction_session_timeout")
        ]
    assert shown == ["500ms", "500ms"]

    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.QueryCanceledError, match="statement timeout"):
            await conn.execute("SELECT pg_sleep(30)")

    observer = await asyncpg.connect(clean_database)
    try:
        conn = await pool.acquire()
        transaction = conn.transaction()
        await transaction.start()
        pid = await conn.fetchval("SELECT pg_backend_pid()")

        async def alive() -> bool:
            found = await observer.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid
            )
            return bool(found)

        # PostgreSQL ends a session left idle in a transaction past the limit.
        await eventually(alive, lambda up: not up, what="the idle transaction's end")
        # asyncpg notices the closed connection and takes it out of the pool by itself.
    finally:
        await observer.close()
