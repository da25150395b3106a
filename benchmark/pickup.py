"""Pickup latency: how long a job waits for an idle, long-polling worker.

Two worker replicas with the default slots wait on `POST /jobs/next`; jobs are submitted one at
a time through the producer at a low, open-loop rate (each POST starts at its scheduled time).
From the database: created → claimed (`claimed_at - created_at`) and created → completed
(`finished_at - created_at`), one clock for both ends. Also POST → completed, from the moment
the client began the POST (client clock) to `finished_at` (same host, same system clock).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import asyncpg

from benchmark import database
from benchmark.burndown import wait_completed
from benchmark.context import Context
from benchmark.stats import latency_summary
from infra.stack import LocalStack


async def _submit_all(url: str, key: str, jobs: int, rate: float) -> dict[str, float]:
    """Submit `jobs` noop jobs at `rate` per second; job id → wall-clock time its POST began."""
    began: dict[str, float] = {}
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as session:

        async def one(index: int, at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            start = time.time()
            body = f'{{"taskType":"noop","payload":{{"i":{index}}}}}'
            async with session.post(url, data=body) as reply:
                if reply.status != 202:
                    raise RuntimeError(f"submit: {reply.status} {await reply.text()}")
                began[(await reply.json())["jobId"]] = start

        origin = time.monotonic() + 0.1
        await asyncio.gather(*(one(i, origin + i / rate) for i in range(jobs)))
    return began


async def run(
    ctx: Context, stack: LocalStack, submit_key: str, jobs: int, rate: float
) -> dict[str, Any]:
    """On a running `stack` (queue service, producer, two idle workers; `submit_key` a submit
    API key) whose job table is empty. Returns `{jobs, rate_per_s, workers, created_to_claimed,
    created_to_completed, post_to_completed, verified}`, latencies as `latency_summary` (ms)."""
    connection = await asyncpg.connect(stack.database_url)
    try:
        ctx.progress.tick(f"pickup: {jobs} jobs at {rate:g}/s", force=True)
        began = await _submit_all(f"{stack.producer}/jobs", submit_key, jobs, rate)
        await wait_completed(connection, jobs, ctx.progress, "pickup", 60, stack)
        claimed = await database.latencies_ms(connection, "created_at", "claimed_at")
        completed = await database.latencies_ms(connection, "created_at", "finished_at")
        jobs_relation = await database.jobs_relation(connection)
        rows = await connection.fetch(
            "SELECT id::text AS id, EXTRACT(EPOCH FROM finished_at)::float8 AS f"
            f" FROM {jobs_relation}"
            " WHERE status = 'COMPLETED'"
        )
        post = [(r["f"] - began[r["id"]]) * 1000 for r in rows if r["id"] in began]
        verified = database.verify(await database.outcome(connection), jobs)
    finally:
        await connection.close()
    to_claim = latency_summary(claimed)
    result: dict[str, Any] = {
        "jobs": jobs,
        "rate_per_s": rate,
        "workers": "2 replicas, default slots",
        "created_to_claimed": to_claim,
        "created_to_completed": latency_summary(completed),
        "post_to_completed": latency_summary(post),
        "verified": verified,
    }
    ctx.progress.note(
        f"pickup: created→claimed p50 {to_claim['p50_ms']} ms, p99 {to_claim['p99_ms']} ms"
    )
    return result
