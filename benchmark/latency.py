"""Median POST→COMPLETED latency of `noop` jobs through a real local stack.

Starts its own stack (queue service, producer, `--workers` worker replicas) on free loopback
ports against a fresh, migrated database, submits `--jobs` jobs through the producer one at a
time at `--rate` per second (open loop: each POST starts at its scheduled time, whatever the
previous one did), and measures each job from the moment its POST began (client clock) to
`finished_at` (database clock; same host, same system clock). It also reports the server-side
part (`created_at` → `finished_at`). Writes a JSON result with the settings and the machine.

    python -m benchmark.latency --jobs 100          # what `make bench` runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from benchmark.plot import latency_histogram
from infra.servers import ensure_database, ensure_postgres, ensure_redis
from infra.stack import ROOT, LocalStack
from services.worker.settings import DEFAULT_CONCURRENCY

RESULTS = Path(__file__).parent / "results"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(values_ms: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values_ms), 2),
        "p95_ms": round(_percentile(values_ms, 0.95), 2),
        "max_ms": round(max(values_ms), 2),
        "min_ms": round(min(values_ms), 2),
    }


async def fresh_database(base: str, name: str) -> str:
    admin = await asyncpg.connect(f"{base}/postgres")
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
    url = ensure_database(base, name)
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        check=True,
        capture_output=True,
    )
    return url


async def run(jobs: int, rate: float, workers: int) -> dict[str, Any]:
    """Run the measurement; returns the result document (also written to benchmark/results)."""
    base = ensure_postgres()
    database_url = await fresh_database(base, "jobq_bench")
    stack = LocalStack(
        database_url,
        ensure_redis() + "/14",
        Path(tempfile.mkdtemp(prefix="jobq-bench-")),
        workers=workers,
        environment={"LOG_LEVEL": "WARNING"},
    )
    await stack.start()
    started: dict[str, float] = {}
    try:
        async with httpx.AsyncClient(base_url=stack.producer, timeout=10) as client:
            await client.post("/jobs", json={"taskType": "noop", "payload": {"warmup": True}})

            async def submit(index: int, at: float) -> None:
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                began = time.time()
                reply = await client.post(
                    "/jobs", json={"taskType": "noop", "payload": {"i": index}}
                )
                reply.raise_for_status()
                started[reply.json()["jobId"]] = began

            origin = time.monotonic() + 0.2
            tasks = [asyncio.create_task(submit(i, origin + i / rate)) for i in range(jobs)]
            for done, task in enumerate(asyncio.as_completed(tasks), start=1):
                await task
                if done % 20 == 0 or done == jobs:
                    print(f"submitted {done}/{jobs}", file=sys.stderr)
        rows = await _wait_completed(database_url, set(started), within=60)
    finally:
        stack.stop()
    post_to_completed = [(r["finished"] - started[str(r["id"])]) * 1000 for r in rows]
    server_side = [(r["finished"] - r["created"]) * 1000 for r in rows]
    result = {
        "benchmark": "post_to_completed_latency",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {
            "jobs": jobs,
            "rate_per_second": rate,
            "workers": workers,
            "worker_concurrency": DEFAULT_CONCURRENCY,
            "task_type": "noop",
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "completed": len(rows),
        "post_to_completed": _summary(post_to_completed),
        "created_to_finished_server_side": _summary(server_side),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"latency-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    latency_histogram(
        post_to_completed,
        f"POST→COMPLETED, {jobs} noop jobs, {workers} workers, {rate:g}/s",
        path.with_suffix(".svg"),
    )
    print(f"wrote {path.relative_to(ROOT)} and its .svg histogram", file=sys.stderr)
    return result


async def _wait_completed(database_url: str, ids: set[str], within: float) -> list[Any]:
    connection = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + within
        while True:
            rows = await connection.fetch(
                "SELECT id, EXTRACT(EPOCH FROM created_at) AS created,"
                " EXTRACT(EPOCH FROM finished_at) AS finished FROM job"
                " WHERE status = 'COMPLETED' AND id = ANY($1::uuid[])",
                list(ids),
            )
            if len(rows) == len(ids):
                return [
                    {
                        "id": r["id"],
                        "created": float(r["created"]),
                        "finished": float(r["finished"]),
                    }
                    for r in rows
                ]
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(rows)}/{len(ids)} jobs completed in {within}s")
            await asyncio.sleep(0.2)
    finally:
        await connection.close()


def main() -> None:
    """CLI entry point; prints the result JSON on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100, help="jobs to submit (default 100)")
    parser.add_argument("--rate", type=float, default=20.0, help="submits per second (default 20)")
    parser.add_argument("--workers", type=int, default=2, help="worker replicas (default 2)")
    args = parser.parse_args()
    if args.jobs < 1 or args.rate <= 0 or args.workers < 1:
        parser.error("--jobs, --rate and --workers must be positive")
    print(json.dumps(asyncio.run(run(args.jobs, args.rate, args.workers)), indent=2))


if __name__ == "__main__":
    main()
