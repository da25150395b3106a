"""Where a burn-down's CPU goes: `python -m benchmark.profile` (`make profile`).

Runs one burn-down of `--jobs` pre-inserted `noop` jobs by `--replicas` x `--slots` worker
processes against a queue service of this checkout (`benchmark.burndown`'s backlog and gate),
samples the queue service and every worker with py-spy (`--rate` Hz for `--seconds` seconds,
starting half a second after the gate opens; only while a thread holds the GIL, so waiting in
epoll is not counted) and reads each process class's CPU time
(psutil, `benchmark.processes`: PostgreSQL's backends of the benchmark database included,
which py-spy cannot see). Prints, per process class, CPU microseconds per job, where one
worker's claim cycle goes (`claim_cycle`, from the queue service's own metrics), and the frames
with the most samples (their own, and including what they call), and writes the whole
summary to `.jobq/profile-<stamp>/profile.json` beside py-spy's raw files, so the next
person sees where the time goes without setting up a profiler (issue 17's "profile first").

Samples are proportions of a process's busy time, so they hold on a busy machine; the
jobs/s figure does not (see benchmark/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from benchmark import database
from benchmark.burndown import prepare_backlog, wait_completed
from benchmark.context import Context, stack_pids
from benchmark.processes import cpu_per_job_us
from benchmark.progress import Progress
from benchmark.scrape import sample_total
from infra.servers import ensure_postgres, ensure_redis
from infra.stack import ROOT
from services.worker.settings import DEFAULT_CONCURRENCY

PY_SPY = Path(sys.executable).with_name("py-spy")
TOP = 15
"""Frames listed per process and kind (own samples, inclusive samples)."""


def summarise(raw: Path, top: int = TOP) -> dict[str, Any]:
    """Reads py-spy's `--format raw` output (`frame;frame;… count` per line, outermost
    first) and returns `{samples, own: [[frame, share]], inclusive: [[frame, share]]}`, the
    `top` frames by samples spent in the frame itself and by samples with the frame anywhere
    on the stack; shares are fractions of all samples (0..1)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        frames = stack.split(";")
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    if total == 0:
        return {"samples": 0, "own": [], "inclusive": []}

    def shares(counter: Counter[str]) -> list[list[Any]]:
        return [[frame, round(n / total, 4)] for frame, n in counter.most_common(top)]

    return {"samples": total, "own": shares(own), "inclusive": shares(inclusive)}


async def profile(
    jobs: int,
    replicas: int,
    slots: int,
    seconds: int,
    rate: int,
    out: Path,
    synchronous_commit: bool = True,
) -> dict[str, Any]:
    """One profiled burn-down; the summary document (see the module docstring). Without
    `synchronous_commit`, the benchmark's database commits without waiting for its WAL to
    reach the disk (`ALTER DATABASE … SET synchronous_commit = off`): not a setting for jobq
    (a crash would undo settles already answered), a measure of what the flush costs the
    claim cycle."""
    progress = Progress(total=1)
    ctx = Context(ensure_postgres(), ensure_redis().rstrip("/") + "/13", out / "logs", progress)
    await ctx.setup()
    try:
        url = await ctx.database("profile")
        if not synchronous_commit:
            await database.admin_execute(
                ctx.base_url, "ALTER DATABASE jobq_bench_profile SET synchronous_commit = off"
            )
        stack = ctx.stack("profile", url, workers=replicas)
        await stack.start(workers=0)
        connection = await asyncpg.connect(url)
        try:
            # What the stack's sessions commit with (a server `infra.servers` started itself
            # runs without fsync: there the flush costs nothing either way).
            flush = {
                name: await connection.fetchval(f"SHOW {name}")
                for name in ("fsync", "synchronous_commit")
            }
            progress.phase(f"profile: burn-down of {jobs:,} jobs by {replicas}x{slots}")
            await prepare_backlog(connection, jobs)
            gate = await asyncpg.connect(url)
            hold = gate.transaction()
            await hold.start()
            await gate.execute("LOCK TABLE job IN SHARE MODE")
            await stack.start_workers(range(replicas), WORKER_CONCURRENCY=str(slots))
            classes = stack_pids(stack, "queue", "workers")
            own = frozenset({connection.get_server_pid(), gate.get_server_pid()})
            meter = ctx.meter(classes, url, own).start()
            await hold.commit()
            await gate.close()
            await asyncio.sleep(0.5)
            spies = {
                f"{klass}-{index}": _spy(pid, rate, seconds, out / f"{klass}-{index}.txt")
                for klass, pids in classes.items()
                for index, pid in enumerate(pids)
            }
            # The claim cycle over the sampled seconds, while the backlog lasts: the first
            # claims (which waited at the gate) and the last (on a drained queue) left out.
            timings, since = await claim_timings(stack.queue), time.monotonic()
            done = asyncio.ensure_future(
                wait_completed(connection, jobs, progress, "profile", 900, stack)
            )
            try:
                await asyncio.wait({done}, timeout=seconds)
                timings = _minus(await claim_timings(stack.queue), timings)
                sampled = time.monotonic() - since
                await done
            finally:
                done.cancel()
                usage = meter.stop()
                for spy in spies.values():
                    spy.wait(timeout=seconds + 30)
            window = await database.burn_window(connection)
        finally:
            await connection.close()
            stack.stop()
    finally:
        await ctx.cleanup()
    return {
        "name": "profile",
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {
            "jobs": jobs,
            "replicas": replicas,
            "slots": slots,
            "seconds": seconds,
            "rate_hz": rate,
            "synchronous_commit": synchronous_commit,
        },
        "server": flush,
        "jobs_per_s": round(jobs / window, 1) if window > 0 else 0.0,
        "cpu_us_per_job": cpu_per_job_us(usage, jobs),
        "claim_cycle": claim_cycle(timings, sampled, replicas),
        "processes": {name: summarise(out / f"{name}.txt") for name in spies},
    }


_CLAIM_ROUTE = {"method": "POST", "path": "/jobs/next"}


async def claim_timings(queue_url: str) -> dict[str, float]:
    """The queue service's running totals for claims, from its `/metrics`: `requests` and
    `request_seconds` (`POST /jobs/next`, from its arrival to its response) and `statements`
    and `statement_seconds` (`jobq_claim_duration_seconds`: the claim statements, a free
    connection included)."""
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{queue_url}/metrics", timeout=10)
    response.raise_for_status()
    text = response.text
    http, claim = "jobq_http_request_duration_seconds", "jobq_claim_duration_seconds"
    return {
        "requests": sample_total(text, http, f"{http}_count", **_CLAIM_ROUTE),
        "request_seconds": sample_total(text, http, f"{http}_sum", **_CLAIM_ROUTE),
        "statements": sample_total(text, claim, f"{claim}_count"),
        "statement_seconds": sample_total(text, claim, f"{claim}_sum"),
    }


def _minus(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in after}


def claim_cycle(timings: dict[str, float], window: float, replicas: int) -> dict[str, float]:
    """Where one worker's claim cycle goes, in milliseconds, from the queue service's totals
    over `window` seconds (`claim_timings` at its start and end, subtracted): `cycle` (the
    window over each worker's claims: one claim's request, the jobs it brought and the next
    claim's start), of which `in_queue_service` (from the request's arrival to its response)
    and, within that, `statement` (the ack-and-claim statement); `outside` is the rest (the
    worker's own work and both directions on the sockets). {} when no claim was counted."""
    requests, statements = timings.get("requests", 0.0), timings.get("statements", 0.0)
    if requests <= 0 or statements <= 0 or window <= 0:
        return {}
    cycle = window * replicas / requests * 1000
    server = timings["request_seconds"] / requests * 1000
    return {
        "claims": int(requests),
        "cycle_ms": round(cycle, 3),
        "in_queue_service_ms": round(server, 3),
        "statement_ms": round(timings["statement_seconds"] / statements * 1000, 3),
        "outside_ms": round(cycle - server, 3),
    }


def _spy(pid: int, rate: int, seconds: int, path: Path) -> subprocess.Popen[bytes]:
    command = [str(PY_SPY), "record", "-p", str(pid), "-r", str(rate), "-d", str(seconds)]
    # --gil: only samples holding the GIL, so a process waiting in epoll is not counted busy.
    command += ["--nonblocking", "--gil", "-f", "raw", "-o", str(path)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def report(document: dict[str, Any]) -> str:
    """The summary as text: throughput and CPU per job by class, then each process's top
    frames (percent of its samples)."""
    cpu = document["cpu_us_per_job"]
    server = document.get("server", {})
    lines = [
        f"{document['jobs_per_s']:,} jobs/s; CPU µs per job: "
        + ", ".join(f"{klass} {value}" for klass, value in cpu.items())
        + "; the stack's sessions: "
        + ", ".join(f"{name} {value}" for name, value in server.items()),
    ]
    if server.get("fsync") == "off":
        lines.append("(this server runs without fsync: the WAL flush costs nothing here)")
    elif server.get("synchronous_commit") == "off" and document["settings"].get(
        "synchronous_commit", True
    ):
        lines.append("(the sessions already commit without waiting for the WAL flush)")
    cycle = document.get("claim_cycle")
    if cycle:
        lines.append(
            f"one worker's claim cycle {cycle['cycle_ms']:.2f} ms "
            f"({cycle['claims']:,} claims in the sampled seconds): "
            f"{cycle['in_queue_service_ms']:.2f} ms in the queue service, of which "
            f"{cycle['statement_ms']:.2f} ms the statement; "
            f"{cycle['outside_ms']:.2f} ms outside the queue service"
        )
    for name, frames in document["processes"].items():
        lines.append(f"\n{name} ({frames['samples']} samples)")
        for kind in ("own", "inclusive"):
            lines.append(f"  {kind}:")
            lines += [f"    {share * 100:5.1f}%  {frame[:110]}" for frame, share in frames[kind]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: runs the profiled burn-down, prints the report and the JSON's path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=150_000, help="burn-down backlog")
    parser.add_argument("--replicas", type=int, default=2, help="worker processes")
    parser.add_argument(
        "--slots", type=int, default=DEFAULT_CONCURRENCY, help="WORKER_CONCURRENCY of each"
    )
    parser.add_argument("--seconds", type=int, default=10, help="py-spy sampling time")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        default="on",
        help="off: the benchmark database commits without waiting for the WAL flush, to "
        "measure what the flush costs (never in production: a crash would undo settles "
        "already answered)",
    )
    args = parser.parse_args(argv)
    for name in ("jobs", "replicas", "slots", "seconds", "rate"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not PY_SPY.exists():
        parser.error(f"py-spy not found at {PY_SPY} (make install)")
    out = ROOT / ".jobq" / f"profile-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    out.mkdir(parents=True)
    document = asyncio.run(
        profile(
            args.jobs,
            args.replicas,
            args.slots,
            args.seconds,
            args.rate,
            out,
            args.synchronous_commit == "on",
        )
    )
    path = out / "profile.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(report(document))
    print(path)


if __name__ == "__main__":
    main()
