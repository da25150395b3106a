"""Burn-down: N pre-inserted jobs drained by the project's own worker processes.

The jobs are inserted with the shared enqueue statement, then `VACUUM ANALYZE job`; the queue
service runs alone, then K worker replicas with S slots (`WORKER_CONCURRENCY`) start at once.
The replicas' first claims wait on a table lock the benchmark holds until every replica is
ready, so they start together and the CPU counted (from the release) is the burn-down's alone.
The window is read from the database: the first `claimed_at` to the last `finished_at`. Every
job must end COMPLETED with one attempt.

The `kill -9` variant runs `sleep` jobs on 2 replicas x 4 slots (so the run lasts long enough
to kill a worker in the middle of it, with jobs in its hands) with a short lease and a fast
reaper, SIGKILLs one replica once a third of the
jobs are done, and checks that every job still ends COMPLETED exactly once in the database
(attempts may be 2 for the jobs the killed worker held).
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from benchmark import database
from benchmark.context import Context, stack_pids
from benchmark.machine import steal_seconds
from benchmark.processes import cpu_per_job_us
from benchmark.progress import Progress
from infra.stack import LocalStack


@dataclass(frozen=True)
class Shape:
    """Worker replicas, and slots (`WORKER_CONCURRENCY`) per replica."""

    replicas: int
    slots: int

    @property
    def label(self) -> str:
        """`<replicas>x<slots>`, the key results use."""
        return f"{self.replicas}x{self.slots}"


async def wait_completed(
    connection: asyncpg.Connection,
    expected: int,
    progress: Progress,
    label: str,
    within: float,
    stack: LocalStack | None = None,
) -> None:
    """Poll until `expected` jobs are COMPLETED (twice a second, with a progress line).
    RuntimeError with the stack's logs when time runs out or a process of the stack died."""
    deadline = time.monotonic() + within
    while True:
        done = await database.completed_count(connection)
        progress.tick(f"{label}: {done:,}/{expected:,} completed")
        if done >= expected:
            return
        if stack is not None:
            dead = [
                n
                for n, p in stack.processes.items()
                if n not in stack.stopped and p.poll() is not None
            ]
            if dead:
                raise RuntimeError(f"{label}: {dead} exited\n{stack.log_tail()}")
        if time.monotonic() > deadline:
            logs = stack.log_tail() if stack is not None else ""
            raise RuntimeError(f"{label}: {done}/{expected} completed within {within}s\n{logs}")
        await asyncio.sleep(0.25)


async def prepare_backlog(
    connection: asyncpg.Connection,
    jobs: int,
    task_type: str = "noop",
    payload: dict[str, Any] | None = None,
    tenants: int = 1,
) -> None:
    """Empty the job table, insert `jobs` jobs, VACUUM ANALYZE. With `tenants` > 1 the jobs
    belong to tenants `tenant-00`, `tenant-01`, … in turn (by insertion order), so every
    tenant has a backlog of the same size all through the burn-down."""
    await database.truncate_jobs(connection)
    await database.insert_jobs(connection, jobs, task_type, payload)
    if tenants > 1:
        await connection.execute(
            "UPDATE job SET tenant = 'tenant-' || lpad((numbered.n % $1)::text, 2, '0')"
            " FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM job) AS numbered"
            " WHERE job.id = numbered.id",
            tenants,
        )
    await connection.execute("VACUUM ANALYZE job")


async def burn_once(
    ctx: Context,
    stack: LocalStack,
    connection: asyncpg.Connection,
    shape: Shape,
    jobs: int,
    within: float,
    tenants: int = 1,
) -> dict[str, Any]:
    """One burn-down of `jobs` noop jobs (of `tenants` tenants, see `prepare_backlog`) by
    `shape` on a running queue-service-only `stack` (its workers are started here and
    stopped after). Returns `{shape, jobs, seconds,
    jobs_per_s, cpu_us_per_job, wal_bytes_per_job, steal_seconds, usage, verified}`;
    `wal_bytes_per_job` is the server's WAL written from the gate's opening to the last
    completion (the whole server's: nothing else runs beside a burn-down) per job, a figure
    the machine's speed does not move; `steal_seconds` is the CPU time the hypervisor gave
    other guests during the burn (`machine.steal_seconds`)."""
    label = f"burn-down {shape.label}"
    await prepare_backlog(connection, jobs, tenants=tenants)
    indexes = range(shape.replicas)
    gate = await asyncpg.connect(stack.database_url)
    try:
        # The gate: claims wait on this lock until every replica is up, so they start
        # together and the CPU counted is the burn-down's, not the replicas' start-up.
        hold = gate.transaction()
        await hold.start()
        await gate.execute("LOCK TABLE job IN SHARE MODE")
        await stack.start_workers(indexes, WORKER_CONCURRENCY=str(shape.slots))
        own = frozenset({connection.get_server_pid(), gate.get_server_pid()})
        classes = stack_pids(stack, "queue", "workers")
        meter = ctx.meter(classes, stack.database_url, own).start()
        stolen = steal_seconds()
        before = await database.completed_count(connection)
        wal = await database.wal_position(connection)
        await hold.commit()
    finally:
        await gate.close()
    try:
        await wait_completed(connection, jobs, ctx.progress, label, within, stack)
    finally:
        usage = meter.stop()
        stolen = steal_seconds() - stolen
        for index in indexes:
            stack.stop_process(f"worker{index + 1}")
    wal = await database.wal_position(connection) - wal
    seconds = await database.burn_window(connection)
    verified = database.verify(await database.outcome(connection), jobs)
    cpu = cpu_per_job_us(usage, jobs - before)
    result: dict[str, Any] = {
        "shape": shape.label,
        "replicas": shape.replicas,
        "slots": shape.slots,
        "jobs": jobs,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(jobs / seconds, 1) if seconds > 0 else 0.0,
        "cpu_us_per_job": cpu,
        "wal_bytes_per_job": round(wal / max(jobs - before, 1)),
        "steal_seconds": round(stolen, 2),
        "usage": usage,
        "verified": verified,
    }
    ctx.progress.note(
        f"{label}: {result['jobs_per_s']:,} jobs/s, "
        f"{cpu.get('total', 0):,} µs CPU/job, ok={verified['ok']}"
    )
    return result


async def kill_run(ctx: Context, jobs: int, sleep_ms: int, within: float) -> dict[str, Any]:
    """The `kill -9` variant on its own stack (2 replicas x 4 slots, 3 s lease, 200 ms
    reaper). Returns `{jobs, killed, killed_at_completed, seconds, by_attempts, verified}`;
    `verified.ok` is False if a job was lost, left unfinished or ran more than twice."""
    url = await ctx.database("kill")
    stack = ctx.stack(
        "kill",
        url,
        workers=2,
        environment={
            "WORKER_CONCURRENCY": "4",
            "WORKER_VISIBILITY_TIMEOUT": "3",
            "QUEUE_REAPER_INTERVAL": "200ms",
        },
    )
    connection = await asyncpg.connect(url)
    try:
        await prepare_backlog(connection, jobs, "sleep", {"ms": sleep_ms})
        await stack.start(workers=0)
        await stack.start_workers(range(2))
        deadline = time.monotonic() + within
        done = 0
        while done < jobs // 3:
            if time.monotonic() > deadline:
                raise RuntimeError(f"kill run: {done}/{jobs} completed\n{stack.log_tail()}")
            await asyncio.sleep(0.02)
            done = await database.completed_count(connection)
        stack.stop_process("worker1", signal.SIGKILL)
        ctx.progress.note(f"kill -9 worker1 at {done:,}/{jobs:,} completed")
        await wait_completed(connection, jobs, ctx.progress, "after kill -9", within, stack)
        # The reaper and the late acks have settled; read the final state.
        outcome = await database.outcome(connection)
        seconds = await database.burn_window(connection)
    finally:
        await connection.close()
        stack.stop()
    verified = database.verify(outcome, jobs, max_attempts=2)
    return {
        "jobs": jobs,
        "task": f"sleep {sleep_ms} ms",
        "killed": "worker1",
        "killed_at_completed": done,
        "seconds": round(seconds, 3),
        "by_attempts": outcome["by_attempts"],
        "by_status": outcome["by_status"],
        "verified": verified,
    }
