"""The queue service's own ceiling: asyncio loops speaking the worker protocol directly.

Each loop asks `POST /jobs/next` for up to 100 jobs without waiting (`waitSeconds` 0) and
acknowledges what it got with one `POST /jobs/ack`, until a claim comes back empty. No job
runs, so the figure is what the queue service and PostgreSQL can move, whatever the worker
runtime costs.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp
import asyncpg
import msgspec

from benchmark import database
from benchmark.burndown import prepare_backlog
from benchmark.context import Context, stack_pids
from benchmark.processes import cpu_per_job_us
from infra.stack import LocalStack

CLAIM_MAX = 100


async def _loop(session: aiohttp.ClientSession, name: str) -> int:
    """Claim and acknowledge until the queue is empty; the number of jobs acknowledged."""
    acked = 0
    claim = msgspec.json.encode(
        {"worker": name, "queues": ["default"], "max": CLAIM_MAX, "waitSeconds": 0}
    )
    while True:
        async with session.post("/jobs/next", data=claim) as reply:
            if reply.status == 204:
                return acked
            reply.raise_for_status()
            jobs = msgspec.json.decode(await reply.read())["jobs"]
        if not jobs:
            return acked
        entries = [{"id": j["id"], "receiptHandle": j["receiptHandle"]} for j in jobs]
        async with session.post(
            "/jobs/ack", data=msgspec.json.encode({"entries": entries})
        ) as reply:
            reply.raise_for_status()
            results = msgspec.json.decode(await reply.read())["results"]
        acked += sum(1 for r in results if r["status"] == 200)


async def raw_once(
    ctx: Context, stack: LocalStack, connection: asyncpg.Connection, loops: int, jobs: int
) -> dict[str, Any]:
    """Drain `jobs` noop jobs with `loops` concurrent raw loops against the running queue
    service of `stack`. Returns `{loops, jobs, seconds, jobs_per_s, cpu_us_per_job, usage,
    verified}` (the `client` class is this process)."""
    await prepare_backlog(connection, jobs)
    headers = {
        "Authorization": f"Bearer {stack.internal_token}",
        "Content-Type": "application/json",
    }
    classes = {**stack_pids(stack, "queue"), "client": [os.getpid()]}
    own = frozenset({connection.get_server_pid()})
    meter = ctx.meter(classes, stack.database_url, own).start()
    connector = aiohttp.TCPConnector(limit=loops)
    try:
        async with aiohttp.ClientSession(stack.queue, headers=headers, connector=connector) as s:
            ctx.progress.tick(f"raw client, {loops} loops", force=True)
            await asyncio.gather(*(_loop(s, f"raw-{i}") for i in range(loops)))
    finally:
        usage = meter.stop()
    seconds = await database.burn_window(connection)
    verified = database.verify(await database.outcome(connection), jobs)
    result = {
        "loops": loops,
        "jobs": jobs,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(jobs / seconds, 1) if seconds > 0 else 0.0,
        "cpu_us_per_job": cpu_per_job_us(usage, jobs),
        "usage": usage,
        "verified": verified,
    }
    ctx.progress.note(f"raw client {loops} loops: {result['jobs_per_s']:,} jobs/s")
    return result
