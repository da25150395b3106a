"""Claim under history: the claim's latency as the job table fills with other rows.

The claim is timed through the queue service's own repository (`JobRepository.claim` on an
asyncpg pool made by `create_pool`, so the same statement, plan settings and decoding), ten
jobs at a time from a backlog of waiting jobs, each claim acknowledged at once. Cases:

- `empty`: the backlog alone;
- `completed_1m`: plus 1,000,000 COMPLETED rows (vacuumed, as autovacuum leaves them; in
  `job_history` on a schema that has it, where finished jobs live since issue 20);
- `scheduled_100k`: plus 100,000 SCHEDULED rows due in a day (inserted by the enqueue
  statement);
- `rr_hold`: a burn-down by 2 workers x 4 slots (10 ms sleep jobs, so it lasts at a steady
  rate of at most 800 jobs/s) while a REPEATABLE READ
  transaction holds its snapshot for a minute: dead index entries pile up at the head of the
  claim index until it ends. Claim latency is sampled every 50 ms, and p50/p99 per second are
  plotted.

The first three are probed in rounds, claim by claim in a new random order (`_interleaved`),
so they share the machine's moments; each case's p50 and p99 are of all its rounds' claims
together (a p99 of one round's 500 claims was its fifth slowest, a stall of the machine), and
the target is p99 with 1,000,000 finished rows at most 1.5 times the empty table's.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from benchmark import database
from benchmark.context import Context
from benchmark.stats import latency_summary, percentile
from services.queue.repository import JobRepository, create_pool

CLAIM_BATCH = 10
HISTORY_TASK = "history"

_COMPLETED_HISTORY = """
INSERT INTO job (id, queue, task_type, payload, status, attempts, max_attempts, visible_at,
                 claimed_at, ready_at, request_hash, result, created_at, updated_at,
                 finished_at)
SELECT gen_random_uuid(), 'default', $2, '{}', 'COMPLETED', 1, 5, t, t, t, $3, '{}', t, t, t
FROM (SELECT now() - interval '1 day' + g * interval '10 ms' AS t
      FROM generate_series(1, $1) AS g) AS times
"""


# Where finished jobs live on a schema with the history (issue 20): `job_history`, so the claim
# table holds the backlog alone, as it would in production.
_COMPLETED_HISTORY_PARTITIONED = """
INSERT INTO job_history (id, tenant, queue, task_type, payload, status, priority, attempts,
                         releases, max_attempts, visible_at, claimed_at, ready_at,
                         cancel_requested, awaited, errors, request_hash, result, created_at,
                         updated_at, finished_at)
SELECT gen_random_uuid(), 'default', 'default', $2, '{}', 'COMPLETED', 0, 1, 0, 5, t, t, t,
       false, false, '[]', $3, '{}', t, t, t
FROM (SELECT now() - interval '1 day' + g * interval '10 ms' AS t
      FROM generate_series(1, $1) AS g) AS times
"""


@dataclass(frozen=True)
class HistorySizes:
    """Rows besides the backlog: COMPLETED (0 skips the case) and SCHEDULED."""

    completed: int
    scheduled: int


async def _claim_once(repository: JobRepository) -> float | None:
    """One claim of `CLAIM_BATCH` jobs, acknowledged at once; its latency in ms, or None when
    the backlog is empty."""
    began = time.perf_counter()
    claimed = await repository.claim(["default"], "probe", CLAIM_BATCH, 30)
    elapsed = (time.perf_counter() - began) * 1000
    if not claimed:
        return None
    await repository.ack_many([(c.id, c.receipt_handle, None) for c in claimed])
    return elapsed


async def _fill(connection: asyncpg.Connection, case: str, sizes: HistorySizes) -> None:
    if case == "completed_1m":
        digest = database.job_rows(1, HISTORY_TASK)[0].request_hash
        partitioned = await connection.fetchval("SELECT to_regclass('job_history') IS NOT NULL")
        statement = _COMPLETED_HISTORY_PARTITIONED if partitioned else _COMPLETED_HISTORY
        await connection.execute(statement, sizes.completed, HISTORY_TASK, digest)
    elif case == "scheduled_100k":
        await database.insert_jobs(connection, sizes.scheduled, HISTORY_TASK, delay=86_400)
    await connection.execute("VACUUM ANALYZE job")


async def history_cases(
    ctx: Context, sizes: HistorySizes, claims: int, rounds: int
) -> dict[str, Any]:
    """The `empty`, `completed_1m` (when `sizes.completed`) and `scheduled_100k` cases,
    in `rounds` rounds of `claims` claims each (`_interleaved`). Returns `{cases: {name: {rounds:
    [latency_summary…], p50_ms, p99_ms (of every round's claims together)}},
    p99_ratio_1m_to_empty}`."""
    names = ["empty", "scheduled_100k"] + (["completed_1m"] if sizes.completed else [])
    urls: dict[str, str] = {}
    for name in names:
        ctx.progress.tick(f"claims: filling {name}", force=True)
        urls[name] = await ctx.database(f"claims_{name}")
        connection = await asyncpg.connect(urls[name])
        try:
            await _fill(connection, name, sizes)
        finally:
            await connection.close()
    rounds_of: dict[str, list[list[float]]] = {name: [] for name in names}
    for round_ in range(rounds):
        ctx.progress.tick(f"claims: round {round_ + 1}/{rounds}, {', '.join(names)}", force=True)
        for name, samples in (await _interleaved(urls, claims)).items():
            rounds_of[name].append(samples)
    cases: dict[str, Any] = {}
    for name, runs in rounds_of.items():
        pooled = latency_summary([ms for run in runs for ms in run])
        cases[name] = {
            "rounds": [latency_summary(run) for run in runs],
            "p50_ms": pooled["p50_ms"],
            "p99_ms": pooled["p99_ms"],
        }
    result: dict[str, Any] = {"claim_batch": CLAIM_BATCH, "claims": claims, "cases": cases}
    if "completed_1m" in cases and cases["empty"]["p99_ms"] > 0:
        ratio = cases["completed_1m"]["p99_ms"] / cases["empty"]["p99_ms"]
        result["p99_ratio_1m_to_empty"] = round(ratio, 2)
    return result


async def _interleaved(urls: dict[str, str], claims: int) -> dict[str, list[float]]:
    """A fresh backlog on each case's database, then `claims` claims on each, interleaved
    claim by claim in a new random order each time, so every case meets the machine's same
    moments (a case probed after another read p99 0.75-1.71x it on identical job tables, one
    `make bench` to the next). Returns each case's latencies in ms."""
    for url in urls.values():
        connection = await asyncpg.connect(url)
        try:
            await connection.execute("DELETE FROM job WHERE task_type <> $1", HISTORY_TASK)
            await database.insert_jobs(connection, claims * CLAIM_BATCH + CLAIM_BATCH)
            await connection.execute("VACUUM ANALYZE job")
        finally:
            await connection.close()
    pools = {name: await create_pool(url, size=1) for name, url in urls.items()}
    samples: dict[str, list[float]] = {name: [] for name in urls}
    try:
        repositories = {name: JobRepository(pool) for name, pool in pools.items()}
        order = list(urls)
        for _ in range(claims):
            random.shuffle(order)
            for name in order:
                elapsed = await _claim_once(repositories[name])
                if elapsed is not None:
                    samples[name].append(elapsed)
    finally:
        for pool in pools.values():
            await pool.close()
    return samples


async def rr_hold(
    ctx: Context, hold: float, lead: float, tail: float, sleep_ms: int = 10
) -> dict[str, Any]:
    """The `rr_hold` case. A backlog of sleep jobs large enough for 2 workers x 4 slots to
    stay busy for `lead + hold + tail` seconds; the snapshot is taken `lead` seconds
    in and held `hold` seconds. Returns `{hold_s, series: [[t, p50_ms, p99_ms, claims]…] per
    second, before, during_last_10s, after}` (the last three latency summaries in ms; "last
    10 s" is the whole hold when it is shorter)."""
    url = await ctx.database("claims_rr")
    total = lead + hold + tail
    backlog = int(2 * 4 * (1000 / sleep_ms) * total * 1.2) + 1000
    connection = await asyncpg.connect(url)
    holder = await asyncpg.connect(url)
    stack = ctx.stack("claims_rr", url, workers=2, environment={"WORKER_CONCURRENCY": "4"})
    pool = await create_pool(url, size=1)
    samples: list[tuple[float, float]] = []
    try:
        ctx.progress.tick(f"claims under a held snapshot: {backlog:,} sleep jobs", force=True)
        await database.insert_jobs(connection, backlog, "sleep", {"ms": sleep_ms})
        await connection.execute("VACUUM ANALYZE job")
        await stack.start()
        repository = JobRepository(pool)
        origin = time.monotonic()
        snapshot = holder.transaction(isolation="repeatable_read")
        state = "before"
        while (now := time.monotonic() - origin) < total:
            if state == "before" and now >= lead:
                await snapshot.start()
                await holder.fetchval("SELECT count(*) FROM job")  # takes the snapshot
                state = "holding"
            elif state == "holding" and now >= lead + hold:
                await snapshot.commit()
                state = "after"
            began = time.perf_counter()
            claimed = await repository.claim(["default"], "probe", CLAIM_BATCH, 30)
            samples.append((now, (time.perf_counter() - began) * 1000))
            if claimed:
                await repository.ack_many([(c.id, c.receipt_handle, None) for c in claimed])
            ctx.progress.tick(f"claims under a held snapshot: {now:.0f}/{total:.0f} s")
            await asyncio.sleep(0.05)
    finally:
        if holder.is_in_transaction():
            await holder.execute("ROLLBACK")
        await pool.close()
        stack.stop()
        await holder.close()
        await connection.close()
    return {
        "hold_s": hold,
        "lead_s": lead,
        "backlog": backlog,
        "series": _per_second(samples),
        "before": latency_summary([ms for t, ms in samples if t < lead]),
        "during_last_10s": latency_summary(
            [ms for t, ms in samples if max(lead, lead + hold - 10) <= t < lead + hold]
        ),
        "after": latency_summary([ms for t, ms in samples if t >= lead + hold + 1]),
    }


def _per_second(samples: list[tuple[float, float]]) -> list[list[float]]:
    buckets: dict[int, list[float]] = {}
    for at, ms in samples:
        buckets.setdefault(int(at), []).append(ms)
    return [
        [second, round(percentile(v, 0.5), 3), round(percentile(v, 0.99), 3), len(v)]
        for second, v in sorted(buckets.items())
    ]
