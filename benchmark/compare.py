"""Before and after, side by side: `python -m benchmark.compare --before REV` (`make bench-compare
BEFORE=REV`).

Runs the services of an earlier revision (checked out with `git worktree` under
`.jobq/compare/<rev>`) and of this checkout in alternating rounds on the same machine, so a
change's effect on the hot paths is measured in one run rather than against figures taken on
another day (the host's speed moves between runs; see benchmark/README.md). Per round and side:

- a burn-down of `--jobs` pre-inserted `noop` jobs by the default shape (2 workers at the
  default `WORKER_CONCURRENCY`), jobs/s and
  CPU per job across every process (`benchmark.burndown.burn_once`), after a `CHECKPOINT`, so
  a checkpoint owed to the previous side's writes does not land in this side's window; with
  `--tenants N` the backlog belongs to N tenants in turn (what fair shares cost), with
  `--limit-other` the queue limits a task type it has no job of (what a limit costs the
  others; a revision without limits runs without);
- open-loop single submits through the producer (k6) at each of `--rates`, p50/p95 and CPU
  per request by process (`benchmark.ingest.run_step`).

Prints progress, a table of medians and the ratio after/before (for the burn-down also the
ratio within each round, whose median is the figure to quote: the host's speed drifts over a
run by more than most changes move it, and the two sides of one round share its moment; the
CPU time stolen by the hypervisor during each burn-down is kept beside it, with the jobs per
claim the queue service handed out), and writes the
JSON to
`benchmark/results/compare-<stamp>.json`. Each side's databases are migrated by its own
revision's migrations, so an earlier revision runs on the schema it knows (its readiness
refuses any other).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

import asyncpg
import httpx
from aiohttp import web

from benchmark import burndown, ingest
from benchmark.context import Context, stack_pids
from benchmark.machine import load_average
from benchmark.presets import DEFAULT_SHAPE
from benchmark.progress import Progress
from benchmark.scrape import sample_total
from infra.servers import ensure_postgres, ensure_redis
from infra.stack import ROOT, LocalStack

RESULTS = ROOT / "benchmark" / "results"
CHECKOUTS = ROOT / ".jobq" / "compare"


def checkout(revision: str) -> Path:
    """A work tree of `revision` under `.jobq/compare/` (made once, reused); its path.
    SystemExit when `revision` names no commit of this repository."""
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if found.returncode != 0:
        raise SystemExit(f"{revision!r} names no commit of this repository (git rev-parse)")
    commit = found.stdout.strip()
    path = CHECKOUTS / commit[:12]
    if not (path / "services").is_dir():
        CHECKOUTS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--force", str(path), commit],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
    return path


async def _burn(
    ctx: Context,
    side: str,
    root: Path,
    jobs: int,
    tenants: int,
    limit_other: bool,
    environment: dict[str, str] | None = None,
) -> dict[str, Any]:
    url = await ctx.database(f"compare_burn_{side}", root=root)
    stack = LocalStack(
        url, ctx.redis_url, ctx.logs / f"burn-{side}", workers=DEFAULT_SHAPE.replicas,
        producer_enabled=False, smtp_enabled=False, root=root, environment=environment or {},
    )  # fmt: skip
    await stack.start(workers=0)
    connection = await asyncpg.connect(url)
    try:
        limited = await _limit_other_task_type(connection) if limit_other else None
        await _quiet_database(connection)
        result = await burndown.burn_once(
            ctx, stack, connection, DEFAULT_SHAPE, jobs, 600, tenants=tenants
        )
        if limited is not None:
            result["other_task_type_limited"] = limited
        result["jobs_per_claim"] = await _jobs_per_claim(stack.queue)
        return result
    finally:
        await connection.close()
        stack.stop()


async def _limit_other_task_type(connection: asyncpg.Connection) -> bool:
    """Give queue `default` a concurrency limit on a task type it has no job of (`other`), so
    the burn-down measures what a limit costs the task types it does not limit. False, with
    nothing done, on a revision without concurrency limits (no `queue_control.limits`)."""
    known = await connection.fetchval(
        "SELECT EXISTS (SELECT FROM information_schema.columns"
        " WHERE table_name = 'queue_control' AND column_name = 'limits')"
    )
    if known:
        await connection.execute(
            "INSERT INTO queue_control (queue, limits, changed_by, change)"
            " VALUES ('default', '{\"other\": {\"concurrency\": 10}}', 'bench-compare', 'limits')"
            " ON CONFLICT (queue) DO UPDATE SET limits = EXCLUDED.limits"
        )
    return bool(known)


async def _quiet_database(connection: asyncpg.Connection) -> None:
    """Flush dirty pages (`CHECKPOINT`) before a measurement, so a checkpoint owed to the
    previous side's writes (its submits) does not land in this side's window. Needs a
    superuser (the development server's `postgres`); skipped, with a note, without one."""
    try:
        await connection.execute("CHECKPOINT")
    except asyncpg.InsufficientPrivilegeError:
        print("bench-compare: CHECKPOINT needs a superuser; measuring without it")


async def _jobs_per_claim(queue_url: str) -> float | None:
    """Jobs per claim the queue service handed out (`jobq_claim_batch_size`'s sum / count,
    from its /metrics): equal on both sides unless a change altered how workers claim."""
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(f"{queue_url}/metrics")).text
    name = "jobq_claim_batch_size"
    count = sample_total(text, name, f"{name}_count")
    return round(sample_total(text, name, f"{name}_sum") / count, 2) if count else None


async def _ingest(
    ctx: Context,
    side: str,
    root: Path,
    rates: list[int],
    seconds: int,
    environment: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    key = secrets.token_urlsafe(24)
    url = await ctx.database(f"compare_ingest_{side}", root=root)
    stack = LocalStack(
        url, ctx.redis_url, ctx.logs / f"ingest-{side}", smtp_enabled=False, root=root,
        environment={"JOBQ_API_KEYS": f"submit:{key}", **(environment or {})},
    )  # fmt: skip
    await stack.start()
    try:
        target = ingest.Target(
            "producer", f"{stack.producer}/jobs", key, stack_pids(stack, "producer", "queue"), url
        )
        await ingest.warm_up(target)
        steps = []
        for rate in rates:
            await ingest.truncate(url, "job")
            connection = await asyncpg.connect(url)
            try:
                await _quiet_database(connection)
            finally:
                await connection.close()
            steps.append(await ingest.run_step(ctx, target, rate, seconds, ctx.logs))
            await asyncio.sleep(1.0)
        return steps
    finally:
        stack.stop()


def _summary(rounds: list[dict[str, Any]], rates: list[int]) -> dict[str, Any]:
    """Medians per side over the rounds, and after/before ratios."""
    sides: dict[str, dict[str, Any]] = {}
    for side in ("before", "after"):
        burns = [r[side]["burn"] for r in rounds]
        entry: dict[str, Any] = {
            "burn_jobs_per_s": median(b["jobs_per_s"] for b in burns),
            "burn_cpu_us_per_job": median(b["cpu_us_per_job"].get("total", 0) for b in burns),
            "burn_wal_bytes_per_job": median(b.get("wal_bytes_per_job", 0) for b in burns),
            "burn_steal_seconds": [b.get("steal_seconds", 0.0) for b in burns],
            "burn_jobs_per_claim": [b.get("jobs_per_claim") for b in burns],
        }
        for index, rate in enumerate(rates):
            steps = [r[side]["ingest"][index] for r in rounds]
            entry[f"ingest_{rate}"] = {
                "p50_ms": median(s["p50_ms"] for s in steps),
                "p95_ms": median(s["p95_ms"] for s in steps),
                "failed": sum(s["failed"] for s in steps),
                "dropped": sum(s["dropped"] for s in steps),
                "server_cpu_us": median(
                    s["cpu_us_per_request"].get("server_total", 0) for s in steps
                ),
            }
        sides[side] = entry
    before, after = sides["before"], sides["after"]
    # Each round's two burn-downs ran minutes apart, on the same host: their ratio is the
    # paired figure, less moved by the host's drift over the run than a ratio of medians.
    paired = [
        round(r["after"]["burn"]["jobs_per_s"] / r["before"]["burn"]["jobs_per_s"], 3)
        for r in rounds
    ]
    ratios = {
        "burn_jobs_per_s": round(after["burn_jobs_per_s"] / before["burn_jobs_per_s"], 3),
        "burn_jobs_per_s_per_round": paired,
        "burn_jobs_per_s_paired_median": median(paired),
        "burn_cpu_us_per_job": round(
            after["burn_cpu_us_per_job"] / max(before["burn_cpu_us_per_job"], 1e-9), 3
        ),
        "burn_wal_bytes_per_job": (
            round(after["burn_wal_bytes_per_job"] / before["burn_wal_bytes_per_job"], 3)
            if before["burn_wal_bytes_per_job"]
            else None
        ),
    }
    for rate in rates:
        for key in ("p95_ms", "server_cpu_us"):
            b, a = before[f"ingest_{rate}"][key], after[f"ingest_{rate}"][key]
            ratios[f"ingest_{rate}_{key}"] = round(a / b, 3) if b else None
    return {**sides, "ratio_after_to_before": ratios}


async def compare(
    revision: str,
    rounds: int,
    jobs: int,
    rates: list[int],
    seconds: int,
    tenants: int = 1,
    limit_other: bool = False,
    after_tracing: bool = False,
) -> dict[str, Any]:
    """Run the alternating rounds; the result document (see the module docstring). With
    `after_tracing`, this checkout's processes trace every job (OTLP/HTTP, 100 % sampling) to
    a sink in this process that accepts and discards the spans."""
    roots = {"before": checkout(revision), "after": ROOT}
    progress = Progress(total=rounds * 2)
    logs = Path(tempfile.mkdtemp(prefix="jobq-compare-"))
    ctx = Context(ensure_postgres(), ensure_redis().rstrip("/") + "/14", logs, progress)
    started, load_start = datetime.now(UTC), load_average()
    await ctx.setup()
    results: list[dict[str, Any]] = []
    sink = await _span_sink() if after_tracing else None
    environments: dict[str, dict[str, str]] = {"before": {}, "after": {}}
    if sink is not None:
        environments["after"] = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink[1],
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_SAMPLER": "always_on",
        }
    try:
        for round_ in range(rounds):
            entry: dict[str, Any] = {}
            # Alternate which side goes first, so a drift of the host favours neither.
            order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
            for side in order:
                progress.phase(f"round {round_ + 1}/{rounds}: {side}")
                env = environments[side]
                entry[side] = {
                    "burn": await _burn(ctx, side, roots[side], jobs, tenants, limit_other, env),
                    "ingest": await _ingest(ctx, side, roots[side], rates, seconds, env),
                }
            results.append(entry)
    finally:
        await ctx.cleanup()
        if sink is not None:
            await sink[0].cleanup()
    for entry in results:
        for side in entry.values():
            side["burn"].pop("usage", None)
            for step in side["ingest"]:
                step.pop("usage", None)
    return {
        "name": "compare",
        "before": revision,
        "before_commit": roots["before"].name,
        "after": head_revision(),
        "started": started.isoformat(timespec="seconds"),
        "load_average": {"start": load_start, "end": load_average()},
        "settings": {
            "rounds": rounds,
            "jobs": jobs,
            "rates": rates,
            "seconds": seconds,
            "tenants": tenants,
            "limit_other": limit_other,
            "after_tracing": after_tracing,
        },
        "rounds": results,
        "summary": _summary(results, rates),
    }


async def _span_sink() -> tuple[web.AppRunner, str]:
    """An OTLP/HTTP endpoint on loopback that answers every export 200 and keeps nothing (what
    a collector costs the services, without a collector's own CPU); its runner and URL."""

    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v1/traces", accept)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def head_revision(root: Path = ROOT) -> str:
    """The commit of the work tree at `root` (this checkout by default) as `git describe
    --always --dirty` names it: `-dirty` when its files differ from the commit."""
    head = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True, text=True
    )
    return head.stdout.strip()


def _table(summary: dict[str, Any], rates: list[int]) -> str:
    before, after, ratio = summary["before"], summary["after"], summary["ratio_after_to_before"]
    rows = [
        "| figure | before | after | after/before |",
        "|---|---|---|---|",
        f"| burn-down {DEFAULT_SHAPE.replicas} x {DEFAULT_SHAPE.slots}, jobs/s | "
        f"{before['burn_jobs_per_s']:,.0f} | "
        f"{after['burn_jobs_per_s']:,.0f} | {ratio['burn_jobs_per_s']} |",
        f"| burn-down, after/before within each round | | | "
        f"{' / '.join(str(r) for r in ratio['burn_jobs_per_s_per_round'])} "
        f"(median {ratio['burn_jobs_per_s_paired_median']}) |",
        f"| burn-down, jobs per claim (each round) | "
        f"{' / '.join(str(j) for j in before['burn_jobs_per_claim'])} | "
        f"{' / '.join(str(j) for j in after['burn_jobs_per_claim'])} | |",
        f"| CPU per job, µs (every process) | {before['burn_cpu_us_per_job']:,.0f} | "
        f"{after['burn_cpu_us_per_job']:,.0f} | {ratio['burn_cpu_us_per_job']} |",
        f"| WAL per job, bytes | {before['burn_wal_bytes_per_job']:,.0f} | "
        f"{after['burn_wal_bytes_per_job']:,.0f} | {ratio['burn_wal_bytes_per_job']} |",
    ]
    for rate in rates:
        b, a = before[f"ingest_{rate}"], after[f"ingest_{rate}"]
        lost_b, lost_a = b["failed"] + b["dropped"], a["failed"] + a["dropped"]
        rows.append(
            f"| submits {rate}/s: p95 ms (failed+dropped) | {b['p95_ms']} ({lost_b}) | "
            f"{a['p95_ms']} ({lost_a}) | {ratio[f'ingest_{rate}_p95_ms']} |"
        )
        rows.append(
            f"| submits {rate}/s: server CPU µs per request | {b['server_cpu_us']} | "
            f"{a['server_cpu_us']} | {ratio[f'ingest_{rate}_server_cpu_us']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: runs the comparison, prints the table and the JSON's path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the earlier revision (a commit, tag…)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=50_000, help="burn-down backlog")
    parser.add_argument("--rates", default="500,800", help="submits per second, comma-separated")
    parser.add_argument("--seconds", type=int, default=10, help="per ingest step")
    parser.add_argument(
        "--tenants", type=int, default=1, help="tenants sharing the burn-down's backlog evenly"
    )
    parser.add_argument(
        "--limit-other",
        action="store_true",
        help="a concurrency limit on a task type the burn-down has no job of (where known)",
    )
    parser.add_argument(
        "--after-tracing",
        action="store_true",
        help="this checkout traces every job (OTLP/HTTP to a discarding sink, 100 %% sampled)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.tenants <= 100:
        parser.error("--tenants must be 1 to 100")
    rates = [int(rate) for rate in args.rates.split(",")]
    document = asyncio.run(
        compare(
            args.before,
            args.rounds,
            args.jobs,
            rates,
            args.seconds,
            args.tenants,
            args.limit_other,
            args.after_tracing,
        )
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"compare-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(_table(document["summary"], rates))
    print(path)


if __name__ == "__main__":
    main()
