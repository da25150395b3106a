"""The queue service's HTTP surface: submit, replay, problem details, long polling, depth."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg
import httpx
import pytest

from common.ids import new_job_id
from services.queue.app import create_app
from services.queue.repository import JobRepository
from services.queue.settings import QueueSettings
from tests.conftest import serving
from tests.helpers import eventually


@pytest.fixture
async def client(clean_database: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = QueueSettings(
        database_url=clean_database, redis_url=redis_url, queue_depth_interval=0.2
    )
    async with serving(create_app(settings)) as client:
        yield client


async def count_jobs(repository: JobRepository) -> int:
    return sum(row.count for row in await repository.depth())


async def test_submit_then_read(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/jobs", json={"taskType": "email", "payload": {"to": "a@example.com"}}
    )
    assert response.status_code == 202
    job_id = response.json()["jobId"]
    assert response.json()["status"] == "PENDING"
    assert response.headers["location"] == f"/jobs/{job_id}"

    view = (await client.get(f"/jobs/{job_id}")).json()
    assert view["payload"] == {"to": "a@example.com"}
    assert view["queue"] == "default" and view["maxAttempts"] == 5 and view["attempts"] == 0


async def test_forward_with_the_same_job_id_is_a_replay(
    client: httpx.AsyncClient, repository: JobRepository
) -> None:
    body = {"taskType": "noop", "payload": {"a": 1}, "jobId": str(new_job_id())}
    first = await client.post("/jobs", json=body)
    second = await client.post("/jobs", json=body)
    assert first.status_code == 202 and second.status_code == 200
    assert first.json() == second.json()
    assert await count_jobs(repository) == 1


async def test_malformed_json_and_unknown_routes_are_problems(client: httpx.AsyncClient) -> None:
    malformed = await client.post(
        "/jobs", content=b'{"taskType": "x",', headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 400
    assert malformed.json()["type"] == "urn:jobq:problem:malformed-request"

    missing = await client.get("/nowhere")
    assert missing.status_code == 404 and missing.json()["status"] == 404
    unknown_job = await client.get(f"/jobs/{new_job_id()}")
    assert unknown_job.status_code == 404
    assert unknown_job.json()["type"] == "urn:jobq:problem:job-not-found"


async def test_long_poll_returns_when_a_job_arrives(client: httpx.AsyncClient) -> None:
    poll = asyncio.create_task(
        client.post("/jobs/next", json={"worker": "w", "queues": ["default"], "waitSeconds": 10})
    )
    await asyncio.sleep(0.3)
    assert not poll.done()
    started = time.monotonic()
    submitted = await client.post("/jobs", json={"taskType": "noop", "payload": {}})

    response = await asyncio.wait_for(poll, timeout=5)

    assert response.status_code == 200
    assert response.json()["jobs"][0]["id"] == submitted.json()["jobId"]
    assert time.monotonic() - started < 5


async def test_long_poll_with_nothing_to_claim_answers_204(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/jobs/next", json={"worker": "w", "queues": ["default"], "waitSeconds": 0.5}
    )
    assert response.status_code == 204


async def test_queue_depth_and_metrics(client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await client.post("/jobs", json={"taskType": "noop", "payload": {}, "queue": "q1"})
    await client.post(
        "/jobs", json={"taskType": "noop", "payload": {}, "queue": "q1", "delaySeconds": 600}
    )

    async def depth() -> dict[str, Any]:
        queues = (await client.get("/queues")).json()["queues"]
        return next((q for q in queues if q["queue"] == "q1"), {})

    deadline = time.monotonic() + 10
    entry = await depth()
    while entry.get("pending") != 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        entry = await depth()
    assert entry["pending"] == 3 and entry["scheduled"] == 1
    assert entry["source"] in ("redis", "postgres")

    metrics = (await client.get("/metrics")).text
    assert 'jobq_enqueued_total{queue="q1",task_type="noop",tenant="default"} 4.0' in metrics
    assert 'jobq_jobs{queue="q1",status="PENDING"} 3.0' in metrics


async def test_queue_depth_says_where_it_came_from_even_with_no_queues(
    client: httpx.AsyncClient, clean_database: str, repository: JobRepository
) -> None:
    async def depth() -> dict[str, Any]:
        reply: dict[str, Any] = (await client.get("/queues")).json()
        return reply

    # The depth timer caches this empty database's snapshot in Redis (replacing an earlier
    # test's, which expires in a moment); until it does, PostgreSQL answers.
    reply = await eventually(
        depth,
        lambda r: r["queues"] == [] and r.get("source") == "redis",
        what="an empty snapshot from the cache",
    )
    refreshed = datetime.fromisoformat(reply["refreshedAt"])
    assert abs((await repository.now() - refreshed).total_seconds()) < 60

    without_redis = QueueSettings(database_url=clean_database, redis_url="")
    async with serving(create_app(without_redis)) as uncached:
        direct = (await uncached.get("/queues")).json()
    assert direct["queues"] == [] and direct["source"] == "postgres"
    assert (
        abs(
            (await repository.now() - datetime.fromisoformat(direct["refreshedAt"])).total_seconds()
        )
        < 60
    )


async def test_health(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health/live")).status_code == 200
    ready = await client.get("/health/ready")
    assert ready.status_code == 200, ready.text
    assert ready.json()["database"] == "ok"


async def test_empty_body_wrong_content_type_and_missing_fields_are_precise(
    client: httpx.AsyncClient, repository: JobRepository
) -> None:
    empty = await client.post("/jobs")
    assert empty.status_code == 400
    assert empty.json()["type"] == "urn:jobq:problem:malformed-request"
    assert "empty" in empty.json()["detail"]

    as_text = await client.post(
        "/jobs", content=b'{"taskType":"x","payload":{}}', headers={"content-type": "text/plain"}
    )
    assert as_text.status_code == 415
    assert as_text.json()["type"] == "urn:jobq:problem:unsupported-media-type"

    missing = await client.post("/jobs", json={"taskType": "x"})
    assert missing.status_code == 422
    assert missing.json()["errors"][0]["pointer"] == "/payload"
    assert await count_jobs(repository) == 0


async def test_absurdly_deep_bodies_are_client_errors(
    client: httpx.AsyncClient, repository: JobRepository
) -> None:
    deep = '{"taskType":"x","payload":{"a":' + "[" * 3000 + "]" * 3000 + "}}"
    reply = await client.post("/jobs", content=deep, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["type"] == "urn:jobq:problem:malformed-request"
    assert await count_jobs(repository) == 0


async def test_deep_ack_result_is_stored_as_a_stub(client: httpx.AsyncClient) -> None:
    job_id = (await client.post("/jobs", json={"taskType": "x", "payload": {}})).json()["jobId"]
    job = (await client.post("/jobs/next", json={"worker": "w", "queues": ["default"]})).json()
    result = "1"
    for _ in range(500):
        result = '{"a":' + result + "}"
    handle = job["jobs"][0]["receiptHandle"]
    body = f'{{"receiptHandle":"{handle}","result":{result}}}'

    reply = await client.post(
        f"/jobs/{job_id}/ack", content=body, headers={"content-type": "application/json"}
    )

    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "COMPLETED"
    assert reply.json()["result"]["truncated"] is True


async def _sample(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    match = re.search(rf"^{name} (\S+)$", text, flags=re.MULTILINE)
    assert match, f"{name} not exported"
    return float(match.group(1))


async def test_depth_freshness_gauges_follow_the_refresh_loop(client: httpx.AsyncClient) -> None:
    """The depth loop stamps both gauges with the Unix time of its last success (what the
    staleness alerts compare with `time()`)."""

    async def stamps() -> tuple[float, float]:
        return (
            await _sample(client, "jobq_depth_refresh_timestamp_seconds"),
            await _sample(client, "jobq_depth_cache_write_timestamp_seconds"),
        )

    refreshed, written = await eventually(
        stamps, lambda s: min(s) > 0, what="a depth refresh and a cache write"
    )
    # Unix seconds (not a monotonic clock reading): within a minute of the wall clock.
    assert abs(time.time() - refreshed) < 60 and abs(time.time() - written) < 60


def test_without_redis_the_cache_gauge_is_not_exported() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from services.queue.metrics import QueueMetrics

    registry = CollectorRegistry()
    QueueMetrics(registry, depth_cache=False)
    text = generate_latest(registry).decode()
    assert "jobq_depth_refresh_timestamp_seconds" in text
    assert "jobq_depth_cache_write_timestamp_seconds" not in text


async def test_a_dead_letter_in_the_history_still_counts_in_depth_and_the_gauge(
    client: httpx.AsyncClient, clean_database: str
) -> None:
    """A dead-lettered job leaves `job` for `job_history_dead` in the statement that settles
    it; `GET /queues` and `jobq_jobs{status="DEAD_LETTER"}` (which the JobqDeadLettersGrowing
    alert reads) must still count it."""
    job_id = (
        await client.post("/jobs", json={"taskType": "x", "payload": {}, "queue": "dlq-depth"})
    ).json()["jobId"]
    claimed = (
        await client.post("/jobs/next", json={"worker": "w", "queues": ["dlq-depth"]})
    ).json()["jobs"][0]
    failed = await client.post(
        f"/jobs/{job_id}/fail",
        json={"receiptHandle": claimed["receiptHandle"], "error": "boom", "retryable": False},
    )
    assert failed.status_code == 200, failed.text
    assert failed.json()["status"] == "DEAD_LETTER"
    connection = await asyncpg.connect(clean_database)
    try:
        live = await connection.fetchval("SELECT count(*) FROM job WHERE id = $1", job_id)
        historic = await connection.fetchval(
            "SELECT count(*) FROM job_history_dead WHERE id = $1", job_id
        )
    finally:
        await connection.close()
    assert (live, historic) == (0, 1)

    async def counted() -> tuple[Any, bool]:
        queues = (await client.get("/queues")).json()["queues"]
        entry = next((q for q in queues if q["queue"] == "dlq-depth"), {})
        metrics = (await client.get("/metrics")).text
        return entry.get("deadLetter"), (
            'jobq_jobs{queue="dlq-depth",status="DEAD_LETTER"} 1.0' in metrics
        )

    await eventually(
        counted, lambda seen: seen == (1, True), what="the historic dead letter counted"
    )


async def test_a_retention_pass_is_counted_in_the_history_metrics(
    clean_database: str, redis_url: str
) -> None:
    """The queue service's first retention pass (at startup) remakes the partitions dropped
    beforehand and stamps `jobq_history_maintained_timestamp_seconds`, the input of the
    JobqHistoryMaintenanceFailing alert; nothing failed."""
    connection = await asyncpg.connect(clean_database)
    try:
        slots = await connection.fetch(
            "SELECT child.relname FROM pg_inherits"
            " JOIN pg_class AS parent ON parent.oid = pg_inherits.inhparent"
            " JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid"
            " WHERE parent.relname = 'job_history_done'"
            " AND child.relname <> 'job_history_done_default'"
        )
        # Every slot (the test starts with an empty history): the pass must make today's.
        for slot in slots:
            await connection.execute(f'DROP TABLE "{slot["relname"]}"')
    finally:
        await connection.close()
    settings = QueueSettings(database_url=clean_database, redis_url=redis_url)
    async with serving(create_app(settings)) as client:
        stamped = await eventually(
            lambda: _sample(client, "jobq_history_maintained_timestamp_seconds"),
            lambda value: value > 0,
            what="a clean retention pass",
        )
        assert abs(stamped - time.time()) < 60
        assert await _sample(client, 'jobq_history_partitions_total{action="created"}') >= 1
        assert await _sample(client, "jobq_history_maintenance_failures_total") == 0
