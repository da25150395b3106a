"""Burn-down of N no-op jobs by procrastinate (one async worker, `--concurrency` jobs at once).

python -m benchmark.peer_drivers.procrastinate_burn --dsn … --jobs N --phase enqueue
python -m benchmark.peer_drivers.procrastinate_burn --dsn … --jobs N --phase burn --concurrency 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

import procrastinate

ENQUEUE_BATCH = 5_000
QUEUE = "bench"


def make_app(dsn: str, state: dict[str, float]) -> tuple[procrastinate.App, Any]:
    """The app and its `noop` task, which counts into `state`."""
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue=QUEUE)
    async def noop() -> None:
        state.setdefault("first", time.monotonic())
        state["processed"] = state.get("processed", 0) + 1

    return app, noop


async def enqueue(dsn: str, jobs: int) -> None:
    """Apply procrastinate's schema and defer `jobs` jobs in batches (the caller vacuums)."""
    app, noop = make_app(dsn, {})
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, jobs, ENQUEUE_BATCH):
            await noop.batch_defer_async(*({} for _ in range(min(ENQUEUE_BATCH, jobs - start))))


async def burn(dsn: str, concurrency: int) -> dict[str, Any]:
    """Run one worker until the queue is drained (`wait=False`); see the package docstring."""
    state: dict[str, float] = {"processed": 0}
    app, _ = make_app(dsn, state)
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    async with app.open_async():
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await app.run_worker_async(
            queues=[QUEUE], concurrency=concurrency, wait=False, install_signal_handlers=False
        )
        ended = time.monotonic()
        rows = await app.connector.execute_query_all_async(
            "SELECT count(*) AS n FROM procrastinate_jobs WHERE status <> 'succeeded'"
        )
    return {
        "processed": int(state["processed"]),
        "seconds": ended - state.get("first", ended),
        "remaining": int(rows[0]["n"]),
    }


def main() -> None:
    """CLI; the burn phase prints its JSON result on stdout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--phase", choices=["enqueue", "burn"], required=True)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    if args.phase == "enqueue":
        asyncio.run(enqueue(args.dsn, args.jobs))
    else:
        print(json.dumps(asyncio.run(burn(args.dsn, args.concurrency))), flush=True)


if __name__ == "__main__":
    main()
