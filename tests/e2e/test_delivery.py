"""Delivery guarantees with real worker processes: crashes, poison jobs, heartbeats, timeouts,
cancel and graceful shutdown."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from infra.stack import LocalStack
from tests.e2e.conftest import E2E_SETTINGS, wait_for_status


@asynccontextmanager
async def running_stack(
    database_url: str, redis_url: str, logs: Path, workers: int = 1, **settings: str
) -> AsyncIterator[tuple[LocalStack, httpx.AsyncClient]]:
    stack = LocalStack(
        database_url, redis_url, logs, workers=workers, environment={**E2E_SETTINGS, **settings}
    )
    await stack.start()
    try:
        async with httpx.AsyncClient(base_url=stack.producer, timeout=10) as client:
            yield stack, client
    finally:
        stack.stop()


async def submit(client: httpx.AsyncClient, **body: Any) -> str:
    response = await client.post("/jobs", json={"payload": {}, **body})
    assert response.status_code == 202, response.text
    job_id: str = response.json()["jobId"]
    return job_id


async def wait_until(
    client: httpx.AsyncClient,
    job_id: str,
    accept: Callable[[dict[str, Any]], bool],
    within: float = 30,
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        view: dict[str, Any] = (await client.get(f"/jobs/{job_id}")).json()
        if accept(view):
            return view
        assert time.monotonic() < deadline, f"condition not reached within {within}s: {view}"
        await asyncio.sleep(0.05)


async def test_kill_9_mid_job_another_worker_completes_it_once(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with running_stack(
        database_url, redis_url, tmp_path, workers=2, WORKER_VISIBILITY_TIMEOUT="2"
    ) as (stack, client):
        job_id = await submit(client, taskType="sleep", payload={"ms": 3000})
        view = await wait_until(client, job_id, lambda v: v["status"] == "PROCESSING")
        victim = view["lockedBy"]

        stack.stop_process(victim, signal.SIGKILL)
        done = await wait_for_status(client, job_id, {"COMPLETED", "DEAD_LETTER"}, within=30)

        assert done["status"] == "COMPLETED", stack.log_tail()
        assert done["attempts"] == 2
        assert done["lockedBy"] is None and done["result"] == {"sleptMs": 3000}
        assert "lease expired" in done["errors"][-1]["error"]


async def test_poison_job_that_kills_its_worker_ends_dead_lettered(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with running_stack(
        database_url,
        redis_url,
        tmp_path,
        workers=1,
        WORKER_VISIBILITY_TIMEOUT="1",
        WORKER_PROCESSOR_MODULES="tests.e2e.crash_processors",
    ) as (stack, client):
        job_id = await submit(client, taskType="crash", maxAttempts=2)
        restarts = 0
        deadline = time.monotonic() + 60
        while (await client.get(f"/jobs/{job_id}")).json()["status"] != "DEAD_LETTER":
            assert time.monotonic() < deadline, stack.log_tail()
            if stack.processes["worker1"].poll() is not None:
                restarts += 1
                assert restarts <= 5, "the poison job kept being claimed"
                stack.start_worker(0, WORKER_PROCESSOR_MODULES="tests.e2e.crash_processors")
            await asyncio.sleep(0.1)

        view = (await client.get(f"/jobs/{job_id}")).json()
        assert view["attempts"] == 2 and "lease expired" in view["lastError"]
        await asyncio.sleep(1.5)
        assert (await client.get(f"/jobs/{job_id}")).json()["attempts"] == 2, "claimed again"


async def test_heartbeats_keep_a_5s_lease_alive_for_20s(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with running_stack(
        database_url, redis_url, tmp_path, workers=2, WORKER_VISIBILITY_TIMEOUT="5"
    ) as (stack, client):
        job_id = await submit(client, taskType="sleep", payload={"ms": 20_000})

        view = await wait_for_status(client, job_id, {"COMPLETED", "DEAD_LETTER"}, within=60)

        assert view["status"] == "COMPLETED", stack.log_tail()
        assert view["attempts"] == 1 and view["errors"] == [], "the job was delivered twice"


async def test_processor_exceeding_its_timeout_is_stopped_and_retried(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with running_stack(database_url, redis_url, tmp_path) as (stack, client):
        started = time.monotonic()
        job_id = await submit(
            client, taskType="sleep", payload={"ms": 30_000}, timeoutSeconds=1, maxAttempts=2
        )

        view = await wait_for_status(client, job_id, {"COMPLETED", "DEAD_LETTER"}, within=30)

        assert view["status"] == "DEAD_LETTER", stack.log_tail()
        assert [e["error"] for e in view["errors"]] == ["timed out after 1s (timeoutSeconds)"] * 2
        assert time.monotonic() - started < 20, "the processor was not stopped at its timeout"


async def test_cancel_of_a_running_job_stops_it(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with running_stack(database_url, redis_url, tmp_path, WORKER_VISIBILITY_TIMEOUT="2") as (
        stack,
        client,
    ):
        job_id = await submit(client, taskType="sleep", payload={"ms": 60_000})
        await wait_until(client, job_id, lambda v: v["status"] == "PROCESSING")

        requested = await client.post(f"/jobs/{job_id}/cancel")
        asked = time.monotonic()
        view = await wait_for_status(client, job_id, {"CANCELLED", "COMPLETED", "DEAD_LETTER"})

        assert requested.status_code == 200 and requested.json()["cancelRequested"] is True
        assert view["status"] == "CANCELLED", stack.log_tail()
        assert time.monotonic() - asked < 3, "not stopped within about one heartbeat interval"


async def test_sigterm_lets_a_slow_job_finish_within_the_grace_period(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with running_stack(database_url, redis_url, tmp_path, WORKER_SHUTDOWN_GRACE="10s") as (
        stack,
        client,
    ):
        job_id = await submit(client, taskType="sleep", payload={"ms": 2000})
        await wait_until(client, job_id, lambda v: v["status"] == "PROCESSING")

        exit_code = await asyncio.to_thread(stack.stop_process, "worker1")

        view = (await client.get(f"/jobs/{job_id}")).json()
        assert view["status"] == "COMPLETED" and view["attempts"] == 1, stack.log_tail()
        assert exit_code == 0


async def test_job_outliving_the_grace_period_is_released_and_finished_elsewhere(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with running_stack(
        database_url, redis_url, tmp_path, workers=2, WORKER_SHUTDOWN_GRACE="1s"
    ) as (stack, client):
        stack.stop_process("worker2")
        job_id = await submit(client, taskType="sleep", payload={"ms": 4000})
        await wait_until(client, job_id, lambda v: v["status"] == "PROCESSING")

        await asyncio.to_thread(stack.stop_process, "worker1")
        released = (await client.get(f"/jobs/{job_id}")).json()
        stack.start_worker(1)
        view = await wait_for_status(client, job_id, {"COMPLETED", "DEAD_LETTER"}, within=30)

        assert released["status"] == "PENDING" and released["releases"] == 1, stack.log_tail()
        assert released["errors"][-1]["error"] == "released: shutdown"
        assert view["status"] == "COMPLETED" and view["lockedBy"] is None
        assert view["attempts"] == 2 and view["releases"] == 1
