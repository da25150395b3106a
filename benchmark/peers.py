"""Peer burn-downs in the same run: pgqueuer (dequeue batches of 10 and 100) and
procrastinate, each on its own fresh database on the same PostgreSQL.

The peers live in a separate virtual environment, `.jobq/bench-peers`, made by this module from
`benchmark/peers.lock` (pinned and hashed; `make lock` resolves it from `benchmark/peers.in`)
and remade whenever the lock changes; nothing of theirs enters the project's environment. The
drivers are `benchmark/peer_drivers/*_burn.py`. CPU is metered as for jobq: the peer's process plus
the PostgreSQL processes of its database, from the moment the worker is ready to run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from benchmark import database
from benchmark.context import Context
from benchmark.processes import cpu_per_job_us
from infra.stack import ROOT

LOCK = Path(__file__).parent / "peers.lock"
VENV = ROOT / ".jobq" / "bench-peers"


@dataclass(frozen=True)
class Peer:
    """A peer configuration: the driver module and its burn-phase arguments."""

    name: str
    module: str
    arguments: tuple[str, ...]


_PGQUEUER = "benchmark.peer_drivers.pgqueuer_burn"
_PROCRASTINATE = "benchmark.peer_drivers.procrastinate_burn"
PEERS = {
    "pgqueuer_b100": Peer("pgqueuer_b100", _PGQUEUER, ("--batch", "100")),
    "pgqueuer_b10": Peer("pgqueuer_b10", _PGQUEUER, ("--batch", "10")),
    "procrastinate_c10": Peer("procrastinate_c10", _PROCRASTINATE, ("--concurrency", "10")),
}


def _install(python: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--require-hashes", "-r", str(LOCK)],
        check=True,
    )  # fmt: skip


async def ensure_environment() -> Path:
    """The peers' Python interpreter, installing the environment first when it is missing or
    was made from another lock. subprocess.CalledProcessError when pip fails."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".peers-lock-sha256"
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    if not (python.exists() and stamp.exists() and stamp.read_text() == digest):
        await asyncio.to_thread(_install, python)
        stamp.write_text(digest)
    return python


async def _enqueue(python: Path, peer: Peer, url: str, jobs: int) -> None:
    process = await asyncio.create_subprocess_exec(
        str(python), "-m", peer.module, "--dsn", url, "--jobs", str(jobs), "--phase", "enqueue",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output = (await process.communicate())[0].decode(errors="replace")
    if process.returncode != 0:
        raise RuntimeError(f"{peer.name} enqueue failed:\n{output[-3000:]}")
    connection = await asyncpg.connect(url)
    try:
        await connection.execute("VACUUM ANALYZE")
    finally:
        await connection.close()


async def _wal_position(url: str) -> int:
    connection = await asyncpg.connect(url)
    try:
        return await database.wal_position(connection)
    finally:
        await connection.close()


async def burn(ctx: Context, python: Path, peer: Peer, jobs: int, within: float) -> dict[str, Any]:
    """One burn-down of `jobs` no-op jobs by `peer` on a fresh database. Returns `{peer, jobs,
    processed, seconds, jobs_per_s, cpu_us_per_job, wal_bytes_per_job, usage, verified}`
    (`wal_bytes_per_job`: the server's WAL from "go" to the result, as jobq's burn-down
    counts it); `verified.ok` when every job ran once and the peer holds none unfinished.
    RuntimeError when the driver fails or runs past `within` seconds."""
    url = await ctx.database(f"peer_{peer.name}", migrated=False)
    ctx.progress.tick(f"{peer.name}: enqueue {jobs:,}", force=True)
    await _enqueue(python, peer, url, jobs)
    process = await asyncio.create_subprocess_exec(
        str(python), "-m", peer.module, "--dsn", url, "--jobs", str(jobs), "--phase", "burn",
        *peer.arguments, cwd=ROOT, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    try:
        ready = await asyncio.wait_for(process.stdout.readline(), 60)
        if ready.strip() != b"ready":
            raise RuntimeError(f"{peer.name}: expected 'ready', got {ready!r}")
        meter = ctx.meter({peer.name.split("_")[0]: [process.pid]}, url).start()
        wal = await _wal_position(url)
        process.stdin.write(b"go\n")
        await process.stdin.drain()
        started = time.monotonic()
        line = b""
        while not line:
            try:
                line = await asyncio.wait_for(process.stdout.readline(), 2.0)
            except TimeoutError:
                elapsed = time.monotonic() - started
                if elapsed > within:
                    raise RuntimeError(f"{peer.name}: no result within {within}s") from None
                ctx.progress.tick(f"{peer.name}: burning, {elapsed:.0f} s")
        usage = meter.stop()
        wal = await _wal_position(url) - wal
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0 or not line:
        stderr = await process.stderr.read() if process.stderr else b""
        raise RuntimeError(f"{peer.name} exited {process.returncode}: {stderr[-3000:]!r}")
    outcome = json.loads(line)
    seconds = float(outcome["seconds"])
    verified = {
        "ok": outcome["processed"] == jobs and outcome["remaining"] == 0,
        "expected": jobs,
        "completed": outcome["processed"],
        "not_completed": outcome["remaining"],
    }
    result = {
        "peer": peer.name,
        "jobs": jobs,
        "processed": outcome["processed"],
        "seconds": round(seconds, 3),
        "jobs_per_s": round(jobs / seconds, 1) if seconds > 0 else 0.0,
        "cpu_us_per_job": cpu_per_job_us(usage, jobs),
        "wal_bytes_per_job": round(wal / jobs),
        "usage": usage,
        "verified": verified,
    }
    ctx.progress.note(f"{peer.name}: {result['jobs_per_s']:,} jobs/s, ok={verified['ok']}")
    return result
