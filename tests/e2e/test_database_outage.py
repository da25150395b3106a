"""PostgreSQL going away and coming back, with the real processes: every "the database is not
available right now" condition is a 503 with Retry-After (never a 500), and no worker report is
lost (docs/architecture.md#guarantees). Each test runs a private cluster of its own, so
stopping it touches nothing else."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import asyncpg
import httpx

from infra.servers import ensure_database, ensure_postgres
from infra.stack import LocalStack
from tests.conftest import migrate, pg_ctlcluster

FAST_RECOVERY = {
    "WORKER_VISIBILITY_TIMEOUT": "15",
    "WORKER_WAIT_SECONDS": "2",
    "QUEUE_REAPER_INTERVAL": "1s",
    "QUEUE_POLL_INTERVAL": "100ms",
}


def _statuses(metrics: str, app: str) -> dict[str, float]:
    """Responses by status code from an HTTP service's `/metrics` text."""
    counts: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("jobq_http_requests_total{") and f'app_name="{app}"' in line:
            code = line.split('status_code="', 1)[1].split('"', 1)[0]
            counts[code] = counts.get(code, 0) + float(line.rsplit(" ", 1)[1])
    return counts


def _events(log: Path) -> list[str]:
    events = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line).get("event", ""))
        except ValueError:
            continue
    return events


async def test_a_postgres_restart_under_load_is_503s_and_loses_no_report(
    private_cluster: Path, redis_url: str, tmp_path: Path
) -> None:
    url = ensure_database(ensure_postgres(private_cluster), "jobq")
    migrate(url)
    admin = await asyncpg.connect(url)
    try:
        # Throwaway clusters run without durability; a crash-like restart must not lose a
        # commit here, or a lost claim would look like a lost report.
        await admin.execute("ALTER SYSTEM SET synchronous_commit = on")
        await admin.execute("SELECT pg_reload_conf()")
    finally:
        await admin.close()
    stack = LocalStack(url, redis_url, tmp_path, workers=2, environment=FAST_RECOVERY)
    await stack.start()
    seen: dict[int, int] = {}
    try:
        async with httpx.AsyncClient(base_url=stack.producer, timeout=30) as client:

            async def submit(index: int) -> None:
                # A client's part: retry on 503 (and on 504 outcome-unknown) with the same
                # idempotency key (a replay).
                body = {"taskType": "noop", "payload": {"i": index}, "idempotencyKey": f"k{index}"}
                while True:
                    reply = await client.post("/jobs", json=body)
                    seen[reply.status_code] = seen.get(reply.status_code, 0) + 1
                    if reply.status_code in (200, 202):
                        return
                    assert reply.status_code in (503, 504), f"{reply.text}\n{stack.log_tail(80)}"
                    assert reply.status_code == 504 or reply.headers.get("retry-after")
                    await asyncio.sleep(0.2)

            async def load() -> None:
                for start in range(0, 600, 20):
                    await asyncio.gather(*(submit(i) for i in range(start, start + 20)))
                    await asyncio.sleep(0.05)

            async def outage() -> None:
                await asyncio.sleep(1.5)
                await asyncio.to_thread(pg_ctlcluster, private_cluster, "restart", "-m", "fast")
                await asyncio.sleep(1.5)
                await asyncio.to_thread(
                    pg_ctlcluster, private_cluster, "restart", "-m", "immediate"
                )

            await asyncio.gather(load(), outage())
            connection = await asyncpg.connect(url)
            try:
                deadline = time.monotonic() + 90
                while (
                    await connection.fetchval(
                        "SELECT count(*) FROM job_all WHERE status='COMPLETED'"
                    )
                    < 600
                ):
                    if time.monotonic() > deadline:
                        counts = await connection.fetch(
                            "SELECT status, count(*) FROM job_all GROUP BY status"
                        )
                        raise AssertionError(
                            f"not every job completed: {[tuple(r) for r in counts]}\n"
                            + stack.log_tail()
                        )
                    await asyncio.sleep(0.5)
                assert await connection.fetchval("SELECT count(*) FROM job_all") == 600
            finally:
                await connection.close()
            producer = _statuses((await client.get("/metrics")).text, "producer")
            queue = _statuses((await client.get(f"{stack.queue}/metrics")).text, "queue")
    finally:
        stack.stop()

    assert seen.get(503, 0) > 0, "the outage was not noticed: nothing to test"
    assert set(seen) <= {202, 200, 503, 504}, seen
    assert not any(code.startswith("5") and code not in ("503", "504") for code in producer)
    assert not any(code.startswith("5") and code != "503" for code in queue), queue
    for worker in ("worker1", "worker2"):
        events = _events(tmp_path / f"{worker}.log")
        assert "report_failed" not in events, f"{worker} gave up a report"
        assert "lease_lost" not in events, f"{worker} lost a lease"
    assert "unhandled_error" not in _events(tmp_path / "queue.log")


async def test_a_database_refusing_connections_is_a_503_with_retry_after(
    private_cluster: Path, redis_url: str, tmp_path: Path
) -> None:
    """`pg_ctl stop -m smart` with a session still open: PostgreSQL refuses new connections
    (57P03) until the session ends. Every route that needs the database answers 503."""
    url = ensure_database(ensure_postgres(private_cluster), "jobq")
    migrate(url)
    stack = LocalStack(url, redis_url, tmp_path, workers=0, environment=FAST_RECOVERY)
    env = stack._env()
    stack._launch("queue", ["services.queue"], env)
    await stack.wait_ready(f"{stack.queue}/health/ready")
    holder = await asyncpg.connect(url)
    stopping: subprocess.Popen[bytes] | None = None
    headers = {"Authorization": f"Bearer {stack.internal_token}"}
    try:
        async with httpx.AsyncClient(base_url=stack.queue, headers=headers, timeout=20) as client:
            await client.post("/jobs", json={"taskType": "noop", "payload": {}})
            stopping = pg_ctlcluster(private_cluster, "stop", "-m", "smart", wait=False)
            await asyncio.sleep(1)
            # A smart stop lets open sessions finish: end the service's, so it must connect
            # anew, and be refused.
            await holder.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name LIKE 'jobq-queue%'"
            )
            calls = [
                client.post("/jobs", json={"taskType": "noop", "payload": {}}),
                client.post("/jobs/next", json={"worker": "w", "queues": ["default"]}),
                client.post(
                    "/jobs/ack",
                    json={"entries": [{"id": _zero(), "receiptHandle": _zero()}]},
                ),
                client.get("/jobs"),
                client.get("/queues"),
            ]
            replies = [await call for call in calls]
            ready = await client.get("/health/ready")
    finally:
        await holder.close()
        if stopping is not None:
            stopping.wait(60)
        stack.stop()
        pg_ctlcluster(private_cluster, "start")
    for reply in replies[:4]:
        assert reply.status_code == 503, (reply.request.url, reply.status_code, reply.text)
        assert reply.headers["retry-after"]
        assert reply.headers["content-type"].startswith("application/problem+json")
    assert replies[4].status_code in (200, 503)  # may answer from the Redis cache
    assert ready.status_code == 503


def _zero() -> str:
    return "00000000-0000-7000-8000-000000000000"
