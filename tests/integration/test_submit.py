"""Submitting jobs: idempotency keys, batches, delays and priorities, on real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.queue.app import create_app
from services.queue.repository import JobRepository
from services.queue.settings import QueueSettings
from tests.conftest import serving
from tests.helpers import new_job


@pytest.fixture
async def client(clean_database: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = QueueSettings(database_url=clean_database, redis_url=redis_url)
    async with serving(create_app(settings)) as client:
        yield client


async def job_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM job"))).scalar_one())


async def test_idempotent_replay_mismatch_and_canonical_hashing(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = {"taskType": "email", "payload": {"b": 1, "a": {"y": 2, "x": 1}}, "idempotencyKey": "k1"}
    first = await client.post("/jobs", json=body)
    assert first.status_code == 202

    reordered = {
        "idempotencyKey": "k1",
        "queue": "default",
        "priority": 0,
        "delaySeconds": 0.0,
        "payload": {"a": {"x": 1, "y": 2}, "b": 1},
        "taskType": "email",
    }
    replay = await client.post("/jobs", json=reordered)
    assert replay.status_code == 200
    assert replay.json() == first.json(), "same shape, same job, current status"

    mismatch = await client.post("/jobs", json={**body, "payload": {"b": 2}})
    assert mismatch.status_code == 409
    assert first.json()["jobId"] in mismatch.json()["detail"]
    explicit_default = await client.post("/jobs", json={**body, "maxAttempts": 5})
    assert explicit_default.status_code == 409, "an omitted maxAttempts hashes as null"
    assert await job_count(engine) == 1


async def test_fifty_concurrent_identical_submissions_make_one_job(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = {"taskType": "noop", "payload": {"n": 50}, "idempotencyKey": "race"}

    replies = await asyncio.gather(*(client.post("/jobs", json=body) for _ in range(50)))

    assert sorted({r.status_code for r in replies}) == [200, 202]
    assert sum(r.status_code == 202 for r in replies) == 1
    assert len({r.json()["jobId"] for r in replies}) == 1
    assert await job_count(engine) == 1


async def test_batch_validates_each_entry_and_inserts_the_valid_ones(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    entries: list[Any] = [
        {"taskType": "noop", "payload": {"i": 0}},
        {"taskType": "noop", "payload": [1]},
        {"taskType": "noop", "payload": {"i": 2}, "idempotencyKey": "dup"},
        "not an object",
        {"taskType": "noop", "payload": {"i": 2}, "idempotencyKey": "dup"},
        {"taskType": "noop", "payload": {"i": 5}, "idempotencyKey": "dup"},
        {"taskType": "noop", "payload": {"x": "\u0000"}},
        {"taskType": "noop", "payload": {}, "priority": 5000},
    ]

    reply = await client.post("/jobs/batch", json={"jobs": entries})

    assert reply.status_code == 200
    results = reply.json()["results"]
    assert [r["index"] for r in results] == list(range(8))
    assert [r["status"] for r in results] == [202, 422, 202, 422, 200, 409, 422, 422]
    assert results[4]["jobId"] == results[2]["jobId"], "a repeated key is a replay of the first"
    assert results[1]["error"]["errors"][0]["pointer"] == "/jobs/1/payload"
    assert results[6]["error"]["errors"][0]["pointer"] == "/jobs/6/payload/x"
    assert results[7]["error"]["errors"][0]["pointer"] == "/jobs/7/priority"
    assert await job_count(engine) == 2


async def test_batch_bounds(client: httpx.AsyncClient) -> None:
    too_many = {"jobs": [{"taskType": "noop", "payload": {}}] * 501}
    assert (await client.post("/jobs/batch", json=too_many)).status_code == 422
    assert (await client.post("/jobs/batch", json={"jobs": []})).status_code == 422
    full = await client.post(
        "/jobs/batch", json={"jobs": [{"taskType": "noop", "payload": {}}] * 500}
    )
    assert full.status_code == 200 and {r["status"] for r in full.json()["results"]} == {202}


async def test_delayed_job_becomes_claimable_on_time(client: httpx.AsyncClient) -> None:
    submitted = await client.post(
        "/jobs", json={"taskType": "noop", "payload": {}, "delaySeconds": 1.5}
    )
    assert submitted.json()["status"] == "SCHEDULED"
    started = time.monotonic()
    claim = {"worker": "w", "queues": ["default"]}

    early = await client.post("/jobs/next", json={**claim, "waitSeconds": 1})
    assert early.status_code == 204, "claimable before its delay"
    reply = await client.post("/jobs/next", json={**claim, "waitSeconds": 5})
    waited = time.monotonic() - started

    assert reply.status_code == 200
    assert 1.4 <= waited <= 2.0, f"claimed {waited:.2f}s after submit, wanted ~1.5s"


async def test_many_scheduled_high_priority_jobs_do_not_slow_ready_claims(
    engine: AsyncEngine, repository: JobRepository
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO job (id, queue, task_type, payload, status, priority, max_attempts,"
                " visible_at) SELECT gen_random_uuid(), 'default', 'noop', '{}', 'SCHEDULED', 1000,"
                " 5, now() + interval '1 day' FROM generate_series(1, 100000)"
            )
        )
        await conn.execute(text("ANALYZE job"))
    ready = await repository.insert(new_job(priority=-1000))
    assert ready is not None

    async with engine.connect() as conn:
        plan = "\n".join(
            (
                await conn.execute(
                    text(
                        "EXPLAIN (ANALYZE, BUFFERS) SELECT id FROM job WHERE status = 'PENDING'"
                        " AND queue = ANY(:q) ORDER BY priority DESC, id LIMIT 10"
                        " FOR UPDATE SKIP LOCKED"
                    ),
                    {"q": ["default"]},
                )
            ).scalars()
        )
    assert "ix_job_claim" in plan and "Seq Scan" not in plan, plan
    [claimed] = await repository.claim(["default"], "w", 10, 30)
    assert claimed.id == ready.id


async def test_pagination_walk_sees_every_earlier_job_once_despite_concurrent_inserts(
    client: httpx.AsyncClient, repository: JobRepository
) -> None:
    before = {(await repository.insert(new_job(queue="walk"))).id for _ in range(230)}  # type: ignore[union-attr]
    stop = asyncio.Event()

    async def keep_inserting() -> int:
        count = 0
        while not stop.is_set():
            await client.post("/jobs", json={"taskType": "noop", "queue": "walk", "payload": {}})
            count += 1
        return count

    inserter = asyncio.create_task(keep_inserting())
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"queue": "walk", "limit": 17}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/jobs", params=params)).json()
        seen.extend(item["id"] for item in page["items"])
        assert [i["id"] for i in page["items"]] == sorted(
            (i["id"] for i in page["items"]), reverse=True
        ), "newest first"
        cursor = page["nextCursor"]
        if cursor is None:
            break
    stop.set()
    inserted_meanwhile = await inserter

    assert inserted_meanwhile > 0
    assert len(seen) == len(set(seen)), "a job appeared twice"
    assert {str(i) for i in before} <= set(seen)


async def test_listing_filters_and_bad_parameters(client: httpx.AsyncClient) -> None:
    await client.post("/jobs", json={"taskType": "a", "payload": {}, "queue": "q1"})
    await client.post("/jobs", json={"taskType": "b", "payload": {}, "queue": "q1"})
    await client.post(
        "/jobs", json={"taskType": "a", "payload": {}, "queue": "q2", "delaySeconds": 60}
    )

    def ids(reply: httpx.Response) -> int:
        assert reply.status_code == 200, reply.text
        return len(reply.json()["items"])

    assert ids(await client.get("/jobs", params={"queue": "q1"})) == 2
    assert ids(await client.get("/jobs", params={"taskType": "a"})) == 2
    assert ids(await client.get("/jobs", params={"status": "SCHEDULED"})) == 1
    assert ids(await client.get("/jobs", params={"status": "DEAD_LETTER"})) == 0
    for bad in (
        {"limit": 0},
        {"limit": 501},
        {"status": "DONE"},
        {"queue": "Bad Q"},
        {"cursor": "x"},
    ):
        reply = await client.get("/jobs", params=bad)
        assert reply.status_code == 422, (bad, reply.text)
        [name] = bad
        assert reply.json()["errors"][0]["pointer"] == f"query:{name}", reply.text
        assert reply.headers["content-type"].startswith("application/problem+json")


async def test_concurrent_batches_sharing_keys_never_fail(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    keys = [f"shared-{i}" for i in range(150)]

    def batch(order: list[str]) -> dict[str, Any]:
        return {"jobs": [{"taskType": "noop", "payload": {}, "idempotencyKey": k} for k in order]}

    orders = [keys, keys[::-1], keys[75:] + keys[:75], keys[::2] + keys[1::2]]
    replies = await asyncio.gather(*(client.post("/jobs/batch", json=batch(o)) for o in orders))

    assert [r.status_code for r in replies] == [200] * 4
    statuses = [entry["status"] for r in replies for entry in r.json()["results"]]
    assert statuses.count(202) == 150 and statuses.count(200) == 450
    assert await job_count(engine) == 150
