"""Per-queue metric labels stay bounded without one tenant blinding the others
(docs/architecture.md#metrics): the depth gauges rank queues by live jobs at every refresh and
sum the rest into `other`; the counters admit the ranked queues."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from services.queue.app import create_app
from services.queue.settings import QueueSettings
from tests.conftest import serving
from tests.helpers import eventually

JUNK = [f"junk-{n:03d}" for n in range(120)]
_SAMPLE = re.compile(r'^jobq_jobs\{queue="([^"]+)",status="([A-Z_]+)"\} (\S+)$', re.MULTILINE)


@pytest.fixture
async def client(clean_database: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = QueueSettings(
        database_url=clean_database, redis_url=redis_url, queue_depth_interval=0.2
    )
    async with serving(create_app(settings)) as client:
        yield client


async def submit(client: httpx.AsyncClient, queues: list[str]) -> None:
    """One PENDING `noop` job in each of `queues` (repeats make more), in one batch."""
    jobs = [{"taskType": "noop", "payload": {}, "queue": queue} for queue in queues]
    reply = await client.post("/jobs/batch", json={"jobs": jobs})
    assert reply.status_code == 200, reply.text
    assert all(r["status"] == 202 for r in reply.json()["results"]), reply.text


async def pending_series(client: httpx.AsyncClient) -> dict[str, float]:
    """`jobq_jobs{status="PENDING"}` by queue label, as the replica exports it now."""
    text = (await client.get("/metrics")).text
    return {q: float(v) for q, status, v in _SAMPLE.findall(text) if status == "PENDING"}


async def test_a_queue_with_live_jobs_keeps_its_series_after_100_junk_names(
    client: httpx.AsyncClient,
) -> None:
    # One tenant names 120 queues first (one job each), filling every first-come label...
    await submit(client, JUNK)
    # ...then a real queue gets jobs.
    await submit(client, ["real"] * 5)
    series = await eventually(
        lambda: pending_series(client),
        lambda s: s.get("real") == 5,
        what="a jobq_jobs series of the real queue",
    )
    # 100 queues of their own (the real one and 99 junk), the other 21 summed into "other".
    assert len(series) == 101 and "other" in series
    assert series["other"] == 21 == len(JUNK) - 99
    assert sum(series.values()) == len(JUNK) + 5

    # A queue that outranks a junk one takes its place; the junk queue's series goes (it is
    # now counted in "other"), and the counters give the newcomer a label of its own too.
    await submit(client, ["late", "late"])
    series = await eventually(
        lambda: pending_series(client),
        lambda s: s.get("late") == 2,
        what="a jobq_jobs series of the late queue",
    )
    assert len(series) == 101 and series["real"] == 5
    assert series["other"] == 22 and sum(series.values()) == len(JUNK) + 7
    assert set(series) - {"real", "late", "other"} < set(JUNK)

    await submit(client, ["late"])
    metrics = (await client.get("/metrics")).text
    assert 'jobq_enqueued_total{queue="late",task_type="noop",tenant="default"} 1.0' in metrics
    age = re.search(r'^jobq_oldest_pending_age_seconds\{queue="other"\} (\S+)$', metrics, re.M)
    assert age is not None and float(age.group(1)) > 0
