"""`jobq.enqueue` over every connection kind the adapters take (an asyncpg connection, an
asyncpg pool's proxy, a SQLAlchemy AsyncConnection and AsyncSession), and the service's
repository over the same function: one path, the same replays and conflicts."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from common.drivers import executor_for
from common.enqueue import JobRow, Submitted, insert_jobs
from common.errors import IdempotencyConflict
from jobq import enqueue
from services.queue.repository import JobRepository
from tests.helpers import new_job

Connect = Callable[[str, AsyncEngine], AbstractAsyncContextManager[Any]]


@asynccontextmanager
async def plain_asyncpg(url: str, engine: AsyncEngine) -> AsyncIterator[Any]:
    connection = await asyncpg.connect(url)
    try:
        async with connection.transaction():
            yield connection
    finally:
        await connection.close()


@asynccontextmanager
async def pooled_asyncpg(url: str, engine: AsyncEngine) -> AsyncIterator[Any]:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as connection, connection.transaction():
            yield connection
    finally:
        await pool.close()


@asynccontextmanager
async def sqlalchemy_connection(url: str, engine: AsyncEngine) -> AsyncIterator[Any]:
    async with engine.begin() as connection:
        yield connection


@asynccontextmanager
async def sqlalchemy_session(url: str, engine: AsyncEngine) -> AsyncIterator[Any]:
    async with AsyncSession(engine) as session, session.begin():
        yield session


EVERY_CONNECTION_KIND = pytest.mark.parametrize(
    "connect", [plain_asyncpg, pooled_asyncpg, sqlalchemy_connection, sqlalchemy_session]
)


@EVERY_CONNECTION_KIND
async def test_enqueue_replays_and_conflicts_on_every_connection_kind(
    connect: Connect, clean_database: str, engine: AsyncEngine
) -> None:
    key = f"k-{uuid.uuid4()}"
    async with connect(clean_database, engine) as connection:
        first = await enqueue(connection, "noop", {"a": 1}, idempotency_key=key)
        again = await enqueue(connection, "noop", {"a": 1}, idempotency_key=key)
        assert again.job_id == first.job_id and first.status == "PENDING"
        with pytest.raises(IdempotencyConflict, match=f"idempotency key '{key}'"):
            await enqueue(connection, "noop", {"a": 2}, idempotency_key=key)


@EVERY_CONNECTION_KIND
async def test_a_key_whose_job_is_gone_is_taken_again_on_every_connection_kind(
    connect: Connect, clean_database: str, engine: AsyncEngine
) -> None:
    key = f"k-{uuid.uuid4()}"
    async with connect(clean_database, engine) as connection:
        first = await enqueue(connection, "noop", {"a": 1}, idempotency_key=key)
        executor = executor_for(connection)
        # The job goes (as an admin's delete or retention would take it); its key stays.
        removed = enqueue_row(first.job_id, key)
        assert not await executor.release_key(removed)  # its job still exists: kept
        await _run(connection, "DELETE FROM job WHERE id = $1", first.job_id)
        again = await enqueue(connection, "noop", {"a": 2}, idempotency_key=key)
        assert again.job_id != first.job_id and again.status == "PENDING"


async def _run(connection: Any, statement: str, job_id: uuid.UUID) -> None:
    """`statement` with one id parameter, on either driver's connection."""
    if isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        await connection.execute(statement, job_id)
    else:
        await connection.execute(text(statement.replace("$1", ":id")), {"id": job_id})


def enqueue_row(job_id: uuid.UUID, key: str) -> JobRow:
    return dataclasses.replace(new_job(), id=job_id, idempotency_key=key)


async def test_the_repository_runs_the_same_path(repository: JobRepository) -> None:
    row = new_job()
    [created] = await insert_jobs(repository, [row])
    [replay] = await insert_jobs(repository, [row])
    assert isinstance(created, Submitted) and created.created
    assert replay == Submitted(created.response, False)
