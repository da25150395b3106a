"""Resource bounds that hold whatever the data (issue 16, items 1-3), on both public doors: a
listing page is bounded in bytes as well as jobs, a payload or result is bounded as PostgreSQL
stores and serves it, and an oversized payload is refused before it is decoded."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from common.contracts import LIST_PAGE_MAX_BYTES, PAYLOAD_MAX_BYTES, RESULT_MAX_BYTES
from common.text import stored_number_growth
from services.queue.app import create_app as create_queue
from services.queue.repository import JobRepository
from services.queue.settings import QueueSettings
from tests.conftest import serving
from tests.helpers import new_job

JSON = {"content-type": "application/json"}


async def job_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM job_all"))).scalar_one())


# --- item 1: listings -------------------------------------------------------------------------


async def test_a_listing_shows_the_summary_view_unless_asked_for_the_full_one(
    door: httpx.AsyncClient, repository: JobRepository
) -> None:
    await repository.insert(new_job(payload={"secret": "s" * 1000}))

    summary = (await door.get("/jobs")).json()["items"]
    full = (await door.get("/jobs", params={"view": "full"})).json()["items"]
    bad = await door.get("/jobs", params={"view": "everything"})

    assert len(summary) == 1 and not {"payload", "errors", "result"} & summary[0].keys()
    assert summary[0]["status"] == "PENDING" and "lastError" in summary[0]
    assert full[0]["payload"] == {"secret": "s" * 1000}
    assert full[0]["errors"] == [] and full[0]["result"] is None
    assert full[0].keys() - {"payload", "errors", "result"} == summary[0].keys()
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "query:view"


async def test_a_listing_page_stops_at_its_byte_budget_and_the_cursor_walks_every_job(
    door: httpx.AsyncClient, repository: JobRepository
) -> None:
    # 20 jobs of ~250 KiB: 5 MB in one page before; now at most 1 MiB a page.
    created = set()
    for index in range(20):
        job = await repository.insert(new_job(payload={"i": index, "blob": "b" * 250_000}))
        assert job is not None
        created.add(str(job.id))

    seen: list[str] = []
    pages = 0
    cursor = None
    while True:
        params: dict[str, Any] = {"view": "full", "limit": 500}
        if cursor:
            params["cursor"] = cursor
        reply = await door.get("/jobs", params=params)
        assert reply.status_code == 200, reply.text[:300]
        assert len(reply.content) <= LIST_PAGE_MAX_BYTES
        page = reply.json()
        assert page["items"], "a page holds at least one job"
        assert all(len(item["payload"]["blob"]) == 250_000 for item in page["items"])
        seen.extend(item["id"] for item in page["items"])
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            break

    assert sorted(seen) == sorted(created) and len(seen) == len(set(seen))
    assert pages >= 5
    summary = (await door.get("/jobs", params={"limit": 500})).json()
    assert len(summary["items"]) == 20 and summary["nextCursor"] is None


async def test_summary_pages_are_bounded_too_however_their_texts_escape(
    door: httpx.AsyncClient, repository: JobRepository, engine: AsyncEngine
) -> None:
    for _ in range(60):
        await repository.insert(new_job())
    async with engine.begin() as conn:
        # 8 KiB of control characters: 48 KiB each as JSON (\u0001), 2.9 MB for the 60.
        await conn.execute(text("UPDATE job SET last_error = repeat(chr(1), 8192)"))

    seen = 0
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        reply = await door.get("/jobs", params=params)
        assert reply.status_code == 200, reply.text[:300]
        assert len(reply.content) <= LIST_PAGE_MAX_BYTES
        seen += len(reply.json()["items"])
        cursor = reply.json()["nextCursor"]
        if cursor is None:
            break

    assert seen == 60


async def test_a_job_larger_than_the_budget_still_gets_a_page_of_its_own(
    repository: JobRepository,
) -> None:
    for index in range(3):
        await repository.insert(new_job(payload={"i": index, "blob": "b" * 100_000}))

    items, cut = await repository.list_jobs(
        status=None,
        queue=None,
        task_type=None,
        before=None,
        limit=50,
        full=True,
        max_bytes=1000,
    )

    assert len(items) == 1 and cut


# --- item 2: the stored form --------------------------------------------------------------


async def test_stored_number_growth_is_what_postgresql_adds(engine: AsyncEngine) -> None:
    numbers = [1e308, 1e16, 9.5e15, 1.5e-7, 1.25e-5, 1e-4, 5e-324, -1e300, 0.1, 0.0, 3.0, 1e22]
    async with engine.connect() as conn:
        for number in numbers:
            written = msgspec.json.encode(number).decode()
            stored = (
                await conn.execute(
                    text("SELECT octet_length(CAST(CAST(:x AS text) AS jsonb)::text)"),
                    {"x": written},
                )
            ).scalar_one()
            assert len(written) + stored_number_growth(number) == stored, written


LARGE_EXPONENTS = '{"n":[' + ",".join(["1e308"] * 37_000) + "]}"
"""222 KB of JSON, under the 256 KiB bound; 11.4 MB as jsonb stores it."""


async def test_a_payload_that_grows_past_its_bound_when_stored_is_refused(
    door: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = '{"taskType":"noop","payload":' + LARGE_EXPONENTS + "}"
    assert len(LARGE_EXPONENTS) < PAYLOAD_MAX_BYTES

    single = await door.post("/jobs", content=body, headers=JSON)
    batch = await door.post(
        "/jobs/batch",
        content='{"jobs":[' + body + ',{"taskType":"noop","payload":{}}]}',
        headers=JSON,
    )

    assert single.status_code == 413, single.text[:300]
    assert single.headers["content-type"].startswith("application/problem+json")
    assert "as stored" in single.json()["detail"]
    assert single.json()["errors"][0]["pointer"] == "/payload"
    assert batch.status_code == 200, batch.text[:300]
    first, second = batch.json()["results"]
    assert first["status"] == 413 and first["error"]["errors"][0]["pointer"] == "/jobs/0/payload"
    assert second["status"] == 202
    assert await job_count(engine) == 1


async def test_a_result_that_grows_past_its_bound_when_stored_is_a_stub(
    clean_database: str, redis_url: str, engine: AsyncEngine
) -> None:
    settings = QueueSettings(database_url=clean_database, redis_url=redis_url)
    async with serving(create_queue(settings)) as client:
        await client.post("/jobs", json={"taskType": "noop", "payload": {}})
        claim = await client.post("/jobs/next", json={"worker": "w", "queues": ["default"]})
        job = claim.json()["jobs"][0]
        body = f'{{"receiptHandle":"{job["receiptHandle"]}","result":{LARGE_EXPONENTS}}}'
        acked = await client.post(f"/jobs/{job['id']}/ack", content=body, headers=JSON)

    assert acked.status_code == 200, acked.text[:300]
    assert acked.json()["result"]["truncated"] is True
    assert acked.json()["result"]["bytes"] > 11_000_000
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT octet_length(result::text) FROM job_all"))).one()
    assert stored[0] <= RESULT_MAX_BYTES


# --- item 3: the payload's byte span before decoding -------------------------------------------


def _ints_then_unparseable_number(size: int) -> bytes:
    """A payload of `size` bytes of small integers ending in 1e400, a number msgspec refuses
    to decode (422 "out of range"): a payload that was decoded cannot be answered 413."""
    count = (size - 20) // 2
    return b'{"a":[' + b"1," * count + b"1e400]}"


async def test_an_oversized_payload_is_refused_before_it_is_decoded(
    door: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    payload = _ints_then_unparseable_number(8 * 1024 * 1024 - 100)
    single = b'{"taskType":"noop","payload":' + payload + b"}"
    entry = b'{"taskType":"noop","payload":' + _ints_then_unparseable_number(300_000) + b"}"
    batch = b'{"jobs":[{"taskType":"noop","payload":{}},' + entry + b"]}"

    reply = await door.post("/jobs", content=single, headers=JSON)
    batched = await door.post("/jobs/batch", content=batch, headers=JSON)

    assert reply.status_code == 413, reply.text[:300]
    assert reply.headers["content-type"].startswith("application/problem+json")
    assert reply.json()["errors"][0]["pointer"] == "/payload"
    assert batched.status_code == 200, batched.text[:300]
    first, second = batched.json()["results"]
    assert first["status"] == 202
    assert second["status"] == 413, second
    assert second["error"]["errors"][0]["pointer"] == "/jobs/1/payload"
    assert await job_count(engine) == 1
