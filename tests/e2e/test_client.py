"""The client library against a real stack: the HTTP `Client`, and `enqueue` inside the
caller's own transaction (asyncpg and SQLAlchemy)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from common.errors import IdempotencyConflict, InvalidInput, JobNotFound, ServiceUnavailable
from infra.stack import LocalStack, free_port
from jobq import AsyncClient, Client, enqueue
from jobq.request import build_request
from services.queue.settings import async_database_url


class Rollback(Exception):
    """Raised to roll a test transaction back."""


async def wait_status(client: Client, job_id: uuid.UUID, status: str, within: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while (view := await asyncio.to_thread(client.get, job_id)).status != status:
        assert loop.time() < deadline, f"job {job_id} stayed {view.status}, wanted {status}"
        await asyncio.sleep(0.05)


async def test_rolled_back_enqueue_never_exists(stack: LocalStack) -> None:
    connection = await asyncpg.connect(stack.database_url)
    try:
        with pytest.raises(Rollback):
            async with connection.transaction():
                reply = await enqueue(connection, "noop", {"order": 1})
                raise Rollback
        row = await connection.fetchrow("SELECT id FROM job_all WHERE id = $1", reply.job_id)
    finally:
        await connection.close()
    assert row is None
    with Client(stack.producer) as client, pytest.raises(JobNotFound):
        client.get(reply.job_id)


async def test_committed_enqueue_is_picked_up_by_a_long_polling_worker(stack: LocalStack) -> None:
    engine = create_async_engine(async_database_url(stack.database_url))
    try:
        async with engine.begin() as conn:
            reply = await enqueue(conn, "noop", {"order": 2}, idempotency_key=f"o-{uuid.uuid4()}")
            assert reply.status == "PENDING"
    finally:
        await engine.dispose()
    with Client(stack.producer) as client:
        await wait_status(client, reply.job_id, "COMPLETED")


async def test_enqueue_validates_and_honours_idempotency(stack: LocalStack) -> None:
    connection = await asyncpg.connect(stack.database_url)
    key = f"k-{uuid.uuid4()}"
    try:
        first = await enqueue(connection, "noop", {"a": 1}, idempotency_key=key, delay_seconds=60)
        again = await enqueue(connection, "noop", {"a": 1}, idempotency_key=key, delay_seconds=60)
        assert again.job_id == first.job_id
        with pytest.raises(IdempotencyConflict):
            await enqueue(connection, "noop", {"a": 2}, idempotency_key=key)
        # Keys are unique per tenant: another tenant's same key is its own job.
        other = await enqueue(connection, "noop", {"a": 2}, idempotency_key=key, tenant="acme")
        assert other.job_id != first.job_id
        replay = await enqueue(connection, "noop", {"a": 2}, idempotency_key=key, tenant="acme")
        assert replay.job_id == other.job_id
        owner = await connection.fetchval("SELECT tenant FROM job_all WHERE id = $1", other.job_id)
        assert owner == "acme"
        with pytest.raises(InvalidInput):
            await enqueue(connection, "noop", {}, tenant="Not A Tenant")
        with pytest.raises(InvalidInput) as bad:
            await enqueue(connection, "Bad Name", {})
        assert bad.value.errors[0]["pointer"] == "/taskType"
        with pytest.raises(InvalidInput):
            await enqueue(connection, "noop", {"x": "\x00"})
    finally:
        await connection.close()


async def test_http_client_round_trip(stack: LocalStack) -> None:
    with Client(stack.producer) as client:
        created = await asyncio.to_thread(client.submit, "noop", {"n": 1}, priority=3)
        await wait_status(client, created.job_id, "COMPLETED")
        later = client.submit("noop", {"n": 2}, delay_seconds=600)
        assert client.cancel(later.job_id).status == "CANCELLED"
        assert client.retry(later.job_id).status == "PENDING"
        page = client.list(limit=5)
        assert len(page.items) <= 5 and page.items
        with pytest.raises(InvalidInput):
            client.submit("noop", {}, priority=5000)


async def test_async_client_round_trip(stack: LocalStack) -> None:
    async with AsyncClient(stack.producer) as client:
        created = await client.submit("noop", {"n": 1}, priority=3)
        deadline = asyncio.get_running_loop().time() + 20
        while (await client.get(created.job_id)).status != "COMPLETED":
            assert asyncio.get_running_loop().time() < deadline, "the job did not complete"
            await asyncio.sleep(0.05)
        later = await client.submit("noop", {"n": 2}, delay_seconds=600)
        assert (await client.cancel(later.job_id)).status == "CANCELLED"
        assert (await client.retry(later.job_id)).status == "PENDING"
        page = await client.list(limit=5, view="full")
        assert 0 < len(page.items) <= 5
        batch = await client.submit_batch(
            [build_request("noop", {"i": i}, queue="async-batch") for i in range(3)]
        )
        assert [result.status for result in batch.results] == [202, 202, 202]
        assert await client.redrive(queue="async-batch") == 0
        assert (await client.pause("async-batch")).paused
        state = await client.set_limits("async-batch", {"noop": {"concurrency": 2}})
        assert state.limits[0].concurrency == 2
        state = await client.set_weights("async-batch", {"acme": 2})
        assert state.weights[0].weight == 2
        assert not (await client.resume("async-batch")).paused
        with pytest.raises(InvalidInput):
            await client.submit("noop", {}, priority=5000)
        with pytest.raises(JobNotFound):
            await client.get(uuid.uuid4())
    unreachable = AsyncClient(f"http://127.0.0.1:{free_port()}", retries=0, submit_retries=0)
    async with unreachable:
        with pytest.raises(ServiceUnavailable, match="unreachable"):
            await unreachable.get(uuid.uuid4())
