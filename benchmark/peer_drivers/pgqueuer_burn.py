"""Burn-down of N no-op jobs by pgqueuer (one QueueManager on one asyncpg connection).

python -m benchmark.peer_drivers.pgqueuer_burn --dsn … --jobs N --phase enqueue
python -m benchmark.peer_drivers.pgqueuer_burn --dsn … --jobs N --phase burn --batch 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import timedelta
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

ENQUEUE_BATCH = 5_000


async def enqueue(dsn: str, jobs: int) -> None:
    """Install pgqueuer's schema and insert `jobs` jobs for the `noop` entrypoint (the caller
    vacuums)."""
    connection = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        for start in range(0, jobs, ENQUEUE_BATCH):
            count = min(ENQUEUE_BATCH, jobs - start)
            await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
    finally:
        await connection.close()


async def burn(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    """Drain the queue with dequeue batches of `batch`; see the package docstring."""
    connection = await asyncpg.connect(dsn)
    manager = QueueManager(Queries(AsyncpgDriver(connection)))
    state: dict[str, float] = {"processed": 0}

    @manager.entrypoint("noop")
    async def noop(job: Job) -> None:
        state.setdefault("first", time.monotonic())
        state["processed"] += 1

    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await manager.run(
        batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=0.1)
    )
    ended = time.monotonic()
    remaining = await connection.fetchval("SELECT count(*) FROM pgqueuer")
    await connection.close()
    return {
        "processed": int(state["processed"]),
        "seconds": ended - state.get("first", ended),
        "remaining": int(remaining),
    }


def main() -> None:
    """CLI; the burn phase prints its JSON result on stdout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--phase", choices=["enqueue", "burn"], required=True)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()
    if args.phase == "enqueue":
        asyncio.run(enqueue(args.dsn, args.jobs))
    else:
        print(json.dumps(asyncio.run(burn(args.dsn, args.jobs, args.batch))), flush=True)


if __name__ == "__main__":
    main()
