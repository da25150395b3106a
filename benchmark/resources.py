"""RSS and CPU per process, idle and under load, the pickup latency and the latency under load,
on one full stack.

The stack is what `make run` starts minus the SMTP sink: the queue service, the producer (with
an API key) and two worker replicas with default settings. Idle: nothing submitted for a few
seconds. Under load: k6 submits `noop` jobs through the producer at a constant rate while the
workers run them. CPU is a percentage of one core over the window; RSS is summed per class (the
peak seen, sampled twice a second). Latency under load (as Hatchet publishes it): k6 submits at
given fractions of the producer's knee while the workers run the jobs, and each job's submit →
COMPLETED time is read from the database once the step's jobs are done.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from typing import Any

import asyncpg

from benchmark import database, pickup
from benchmark.burndown import wait_completed
from benchmark.context import Context, stack_pids
from benchmark.ingest import Target, run_step
from benchmark.stats import latency_summary, median
from infra.stack import LocalStack


def _shares(usage: dict[str, dict[str, Any]], seconds: float) -> dict[str, dict[str, float]]:
    return {
        klass: {
            "cpu_percent": round(entry["cpu_seconds"] / seconds * 100, 1),
            "rss_mb": entry["rss_peak_mb"],
        }
        for klass, entry in usage.items()
    }


async def run(
    ctx: Context,
    idle_seconds: float,
    pickup_jobs: int,
    pickup_rate: float,
    load_rate: int,
    load_seconds: int,
    latency_rates: Sequence[tuple[float, int]] = (),
    latency_seconds: int = 0,
    latency_rounds: int = 1,
) -> dict[str, Any]:
    """Returns `{idle, load, pickup, latency}`: `idle`/`load` map each class to `{cpu_percent,
    rss_mb}` (load also has the k6 step), `pickup` is `pickup.run`'s result, `latency` one
    entry per `(fraction of the knee, rate)` of `latency_rates`: `latency_rounds` rounds, each
    round one k6 step `latency_seconds` long per rate in order (`_latency_step`), summed up by
    `_by_rate`. Every job submitted under load must complete (`load.verified`, and `verified`
    of each latency step)."""
    key = secrets.token_urlsafe(24)
    url = await ctx.database("service")
    stack = ctx.stack(
        "service", url, workers=2, producer=True, environment={"JOBQ_API_KEYS": f"submit:{key}"}
    )
    await stack.start()
    connection = await asyncpg.connect(url)
    try:
        classes = stack_pids(stack)
        own = frozenset({connection.get_server_pid()})
        ctx.progress.tick(f"resources: idle for {idle_seconds:g} s", force=True)
        meter = ctx.meter(classes, url, own).start()
        await asyncio.sleep(idle_seconds)
        idle = _shares(meter.stop(), idle_seconds)
        picked = await pickup.run(ctx, stack, key, pickup_jobs, pickup_rate)
        await database.truncate_jobs(connection)
        target = Target("producer", f"{stack.producer}/jobs", key, classes, url)
        step = await run_step(ctx, target, load_rate, load_seconds, ctx.logs)
        accepted = step["requests"] - step["failed"]
        await wait_completed(connection, accepted, ctx.progress, "load", 120, stack)
        verified = database.verify(await database.outcome(connection), accepted)
        rounds = [
            [
                await _latency_step(ctx, stack, connection, target, fraction, rate, latency_seconds)
                for fraction, rate in latency_rates
            ]
            for _ in range(latency_rounds)
        ]
    finally:
        await connection.close()
        stack.stop()
    usage = step.pop("usage")
    load = {"step": step, "classes": _shares(usage, load_seconds), "verified": verified}
    return {
        "idle": {"seconds": idle_seconds, "classes": idle},
        "load": load,
        "pickup": picked,
        "latency": [_by_rate(list(steps)) for steps in zip(*rounds, strict=True)],
    }


def _by_rate(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One rate's latency steps over the rounds as one entry shaped like a step: the median of
    the rounds' submit p50/p95 and of their submit → COMPLETED p50/p95/p99 (the issue 17
    method: medians of rounds, so one round's stall is seen but does not decide), the max of
    their maxima, the sums of counts, drops and failures, `verified` ok only when every round's
    was; the rounds themselves under `rounds`."""
    done = [r["submit_to_completed"] for r in rounds]
    checks = [r["verified"] for r in rounds]
    return {
        "fraction": rounds[0]["fraction"],
        "rate": rounds[0]["rate"],
        "submit_p50_ms": median([r["submit_p50_ms"] for r in rounds]),
        "submit_p95_ms": median([r["submit_p95_ms"] for r in rounds]),
        "dropped": sum(r["dropped"] for r in rounds),
        "failed": sum(r["failed"] for r in rounds),
        "submit_to_completed": {
            "count": sum(d["count"] for d in done),
            **{k: median([d[k] for d in done]) for k in ("p50_ms", "p95_ms", "p99_ms")},
            "max_ms": max(d["max_ms"] for d in done),
        },
        "verified": {
            "ok": all(c["ok"] for c in checks),
            **{k: sum(c[k] for c in checks) for k in checks[0] if k != "ok"},
        },
        "rounds": rounds,
    }


async def _latency_step(
    ctx: Context,
    stack: LocalStack,
    connection: asyncpg.Connection,
    target: Target,
    fraction: float,
    rate: int,
    seconds: int,
) -> dict[str, Any]:
    """One step of the latency under load: `{fraction, rate, submit_p50_ms, submit_p95_ms,
    dropped, failed, submit_to_completed: {count, p50_ms, p95_ms, p99_ms, max_ms}, verified}`."""
    await database.truncate_jobs(connection)
    ctx.progress.note(f"latency under load: {rate}/s ({fraction:.0%} of the knee)")
    step = await run_step(ctx, target, rate, seconds, ctx.logs)
    accepted = step["requests"] - step["failed"]
    await wait_completed(connection, accepted, ctx.progress, f"latency @ {rate}/s", 120, stack)
    return {
        "fraction": fraction,
        "rate": rate,
        "submit_p50_ms": step["p50_ms"],
        "submit_p95_ms": step["p95_ms"],
        "dropped": step["dropped"],
        "failed": step["failed"],
        "submit_to_completed": latency_summary(
            await database.latencies_ms(connection, "created_at", "finished_at")
        ),
        "verified": database.verify(await database.outcome(connection), accepted),
    }
