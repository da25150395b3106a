"""The KEDA trigger queries of `infra/k8s` (read from the rendered production overlay) against a
real Prometheus scraping a real stack of two workers of 64 slots (the default): zero on an idle
queue and on a drained one (never empty or NaN), and under a backlog of 5,000 jobs exactly the
demand the database holds, so the HPA asks for the replica count README "Kubernetes" predicts."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import httpx
import pytest

from infra import tools
from infra.kubernetes import Trigger, hpa_desired, keda_triggers, render
from infra.observe import Observer
from infra.stack import LocalStack
from services.worker.settings import DEFAULT_CONCURRENCY
from tests.conftest import own_database
from tests.e2e.conftest import E2E_SETTINGS, wait_for_status

BACKLOG = 5_000
WORKERS = 2
# Long enough that the 128 jobs the workers hold stay PROCESSING for the whole test.
SLEEP_MS = 600_000


@pytest.fixture(scope="module")
def triggers() -> dict[str, Trigger]:
    """The worker ScaledObject's Prometheus triggers, by name."""
    found = keda_triggers(render("production"))
    return {name: t for (scaled, name), t in found.items() if scaled == "jobq-worker"}


@pytest.fixture(scope="module")
async def watched(
    postgres_base: str,
    template_database: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[LocalStack, Observer, str]]:
    """A stack of two default workers on a database of its own, scraped by Prometheus."""
    try:
        tools.ensure("prometheus")
        tools.ensure("postgres_exporter")
    except tools.ToolUnavailable as exc:
        pytest.fail(f"the KEDA query test needs Prometheus and postgres_exporter: {exc}")
    name = f"jobq_k8s_keda_{os.getpid()}"
    settings = {**E2E_SETTINGS, "QUEUE_DEPTH_INTERVAL": "500ms", "WORKER_SHUTDOWN_GRACE": "1s"}
    async with own_database(postgres_base, template_database, name) as database_url:
        logs = tmp_path_factory.mktemp("keda")
        stack = LocalStack(database_url, redis_url, logs, workers=WORKERS, environment=settings)
        observer = Observer(stack, database_url, tmp_path_factory.mktemp("keda-prometheus"))
        try:
            await stack.start()
            await observer.start()
            await observer.wait_for_targets()
            yield stack, observer, database_url
        finally:
            observer.stop()
            stack.stop()


async def _value(observer: Observer, trigger: Trigger) -> float:
    """The trigger's query now: exactly one finite sample (what KEDA reads)."""
    result = await observer.query(trigger.query)
    assert len(result) == 1, (trigger.name, result)
    value = float(result[0]["value"][1])
    assert math.isfinite(value), (trigger.name, result)
    return value


async def _eventually(check: Callable[[], Awaitable[Any]], what: str) -> None:
    """Poll `check` every 0.5 s until it returns something true (a scrape and a depth refresh
    behind); fail naming `what` and the last value after 60 s."""
    deadline = time.monotonic() + 60
    while not (last := await check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within 60 s, last {last}")
        await asyncio.sleep(0.5)


async def _wait_for(observer: Observer, trigger: Trigger, wanted: float) -> None:
    """Until the trigger's query returns `wanted`."""

    async def reached() -> bool:
        return await _value(observer, trigger) == wanted

    await _eventually(reached, f"{trigger.name} == {wanted}")


async def _asks_for_zero(observer: Observer, triggers: dict[str, Trigger]) -> None:
    """Every trigger reads 0, so KEDA keeps (or brings) the workers at zero."""
    for trigger in triggers.values():
        value = await _value(observer, trigger)
        assert value == 0, trigger.name
        assert not value > trigger.activation, trigger.name


async def test_an_idle_queue_asks_for_zero(
    watched: tuple[LocalStack, Observer, str], triggers: dict[str, Trigger]
) -> None:
    """Before any job, the queue has no series at all: the triggers still read 0."""
    _, observer, _ = watched
    assert set(triggers) == {"demand", "oldest-pending-age"}
    await _asks_for_zero(observer, triggers)


async def test_a_drained_queue_asks_for_zero_again(
    watched: tuple[LocalStack, Observer, str], triggers: dict[str, Trigger]
) -> None:
    """After jobs ran, the queue's own series exist and read 0; the triggers read 0 too."""
    stack, observer, _ = watched
    async with httpx.AsyncClient(base_url=stack.producer, timeout=10) as producer:
        # Jobs that stay live across a few depth refreshes, so the queue's series appear.
        jobs = [{"taskType": "sleep", "payload": {"ms": 2000, "i": i}} for i in range(20)]
        reply = await producer.post("/jobs/batch", json={"jobs": jobs})
        reply.raise_for_status()
        ids = [r["jobId"] for r in reply.json()["results"]]
        for job_id in ids:
            await wait_for_status(producer, job_id, {"COMPLETED"})
    # The queue's own PENDING and PROCESSING series exist and read 0 (a depth refresh and a
    # scrape after the last completion).
    selector = 'jobq_jobs{queue="default", status=~"PENDING|PROCESSING"}'

    async def at_zero() -> bool:
        series = await observer.query(selector)
        return len(series) == 2 and all(float(s["value"][1]) == 0 for s in series)

    await _eventually(at_zero, f"{selector} at 0")
    await _asks_for_zero(observer, triggers)


async def test_a_backlog_asks_for_the_replicas_the_formula_predicts(
    watched: tuple[LocalStack, Observer, str], triggers: dict[str, Trigger]
) -> None:
    stack, observer, database_url = watched
    async with httpx.AsyncClient(base_url=stack.producer, timeout=30) as producer:
        for start in range(0, BACKLOG, 500):
            batch = [
                {"taskType": "sleep", "payload": {"ms": SLEEP_MS, "i": i}}
                for i in range(start, start + 500)
            ]
            reply = await producer.post("/jobs/batch", json={"jobs": batch})
            reply.raise_for_status()
            assert {r["status"] for r in reply.json()["results"]} == {202}
    demand, age = triggers["demand"], triggers["oldest-pending-age"]
    slots = WORKERS * DEFAULT_CONCURRENCY
    counts: dict[str, int] = {}

    async def slots_full() -> dict[str, int]:
        connection = await asyncpg.connect(database_url)
        try:
            rows = await connection.fetch(
                "SELECT status, count(*) FROM job_all WHERE queue = 'default'"
                " AND status IN ('PENDING', 'PROCESSING') GROUP BY status"
            )
        finally:
            await connection.close()
        counts.update(dict(rows))
        return counts if counts.get("PROCESSING") == slots else {}

    # Both workers hold all their slots (10-minute jobs: nothing finishes); the rest waits.
    await _eventually(slots_full, f"{slots} jobs PROCESSING")
    assert counts == {"PROCESSING": slots, "PENDING": BACKLOG - slots}
    await _wait_for(observer, demand, BACKLOG)
    value = await _value(observer, demand)
    assert value == counts["PROCESSING"] + counts["PENDING"]
    # README: desired = ceil((pending + processing) / WORKER_CONCURRENCY), capped.
    assert math.ceil(value / DEFAULT_CONCURRENCY) == 79
    assert hpa_desired(demand, value, WORKERS, 0, 1000) == 79
    assert hpa_desired(demand, value, WORKERS, 0, 20) == 20
    waited = await _value(observer, age)
    assert waited > 0, "the oldest pending job's age"
    assert hpa_desired(age, waited, WORKERS, 0, 20) >= 1
