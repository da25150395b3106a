"""Idempotency keys in their own table: each held for its window (idempotencyWindowSeconds,
else QUEUE_IDEMPOTENCY_WINDOW) wherever its job lives, ended early when its job is deleted or
dropped by retention, and removed when it expires."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from services.queue.app import create_app
from services.queue.history import History
from services.queue.repository import JobRepository
from services.queue.settings import QueueSettings
from tests.conftest import serving


@pytest.fixture
async def client(clean_database: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = QueueSettings(
        database_url=clean_database, redis_url=redis_url, queue_idempotency_window=3600
    )
    async with serving(create_app(settings)) as client:
        yield client


async def _submit(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/jobs", json={"taskType": "noop", "payload": {}, **fields})


async def _finish(client: httpx.AsyncClient) -> None:
    reply = await client.post("/jobs/next", json={"worker": "w", "queues": ["default"]})
    [job] = reply.json()["jobs"]
    ack = await client.post(f"/jobs/{job['id']}/ack", json={"receiptHandle": job["receiptHandle"]})
    assert ack.status_code == 200, ack.text


async def _expires(url: str, key: str) -> float:
    connection = await asyncpg.connect(url)
    try:
        seconds = await connection.fetchval(
            "SELECT EXTRACT(EPOCH FROM expires_at - now())::float8 FROM idempotency_key"
            " WHERE key = $1",
            key,
        )
        return float(seconds)
    finally:
        await connection.close()


async def _expire(url: str, key: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "UPDATE idempotency_key SET expires_at = now() - interval '1 second' WHERE key = $1",
            key,
        )
    finally:
        await connection.close()


async def test_a_key_is_held_for_its_window_and_then_free(
    client: httpx.AsyncClient, clean_database: str
) -> None:
    first = await _submit(client, idempotencyKey="k", idempotencyWindowSeconds=300)
    assert first.status_code == 202, first.text
    assert 290 < await _expires(clean_database, "k") <= 300
    await _finish(client)  # the job moves to the history; the key stays held

    replay = await _submit(client, idempotencyKey="k", idempotencyWindowSeconds=300)
    assert replay.status_code == 200 and replay.json()["jobId"] == first.json()["jobId"]
    conflict = await _submit(client, idempotencyKey="k", payload={"other": 1})
    assert conflict.status_code == 409, conflict.text

    await _expire(clean_database, "k")
    fresh = await _submit(client, idempotencyKey="k", payload={"other": 1})
    assert fresh.status_code == 202, fresh.text
    assert fresh.json()["jobId"] != first.json()["jobId"]
    # The default window is the setting's (an hour here).
    assert 3590 < await _expires(clean_database, "k") <= 3600


async def test_a_window_out_of_bounds_is_refused(client: httpx.AsyncClient) -> None:
    for window in (0, 30 * 86400 + 1, "60"):
        reply = await _submit(client, idempotencyKey="k", idempotencyWindowSeconds=window)
        assert reply.status_code == 422, reply.text
        assert reply.headers["content-type"].startswith("application/problem+json")


async def test_expired_keys_are_removed_in_batches(
    repository: JobRepository, clean_database: str, client: httpx.AsyncClient
) -> None:
    for n in range(1203):
        assert (await _submit(client, idempotencyKey=f"k{n}")).status_code == 202
    connection = await asyncpg.connect(clean_database)
    try:
        await connection.execute(
            "UPDATE idempotency_key SET expires_at = now() - interval '1 second' WHERE key <> 'k0'"
        )
        assert await History(repository, 86400, 7 * 86400, 14 * 86400).forget_keys() == 1202
        assert await connection.fetchval("SELECT count(*) FROM idempotency_key") == 1
    finally:
        await connection.close()


async def _drop_from_history(url: str, job_id: str) -> None:
    """What retention's dropped partition does to one job: gone, its key left behind."""
    connection = await asyncpg.connect(url)
    try:
        assert await connection.execute("DELETE FROM job_history WHERE id = $1", job_id) == (
            "DELETE 1"
        )
    finally:
        await connection.close()


async def test_a_key_ends_with_its_job_when_deleted_or_dropped_in_its_window(
    client: httpx.AsyncClient, clean_database: str
) -> None:
    first = await _submit(client, idempotencyKey="k")
    await _finish(client)
    deleted = await client.delete(f"/jobs/{first.json()['jobId']}")
    assert deleted.status_code == 204, deleted.text
    # The window (an hour) lasts, but its job is gone: a new job, not a 503 for the window.
    again = await _submit(client, idempotencyKey="k")
    assert again.status_code == 202, again.text
    assert again.json()["jobId"] != first.json()["jobId"]
    replay = await _submit(client, idempotencyKey="k")
    assert replay.status_code == 200 and replay.json()["jobId"] == again.json()["jobId"]

    await _finish(client)
    await _drop_from_history(clean_database, again.json()["jobId"])
    third = await _submit(client, idempotencyKey="k", payload={"other": 1})
    assert third.status_code == 202, third.text
    assert third.json()["jobId"] not in {first.json()["jobId"], again.json()["jobId"]}
    assert 3590 < await _expires(clean_database, "k") <= 3600
