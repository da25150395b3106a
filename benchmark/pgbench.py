"""The database's own ceiling: pgbench running jobq's claim and ack statements.

The script is built from the repository's statements themselves (`CLAIM_STATEMENT` and
`ACK_STATEMENT`), with literal queue, batch size, worker name and lease: one transaction claims a
batch (its ids and receipt handles kept with `\\gset`) and acknowledges it, which is what the
raw-protocol client does over HTTP, minus HTTP and Python. Several clients drain a backlog of
exactly `clients * transactions * batch` jobs.
"""

from __future__ import annotations

import asyncio
import glob
import os
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from benchmark import database
from benchmark.burndown import prepare_backlog
from benchmark.context import Context
from services.queue import repository


def pgbench_binary() -> str:
    """pgbench from PATH, else the newest `/usr/lib/postgresql/<v>/bin/pgbench` (Debian's
    postgresql-client). RuntimeError when there is none."""
    found = shutil.which("pgbench")
    if found:
        return found
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pgbench"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    if not candidates:
        raise RuntimeError("pgbench not found: apt-get install postgresql-client")
    return candidates[-1]


def script(batch: int) -> str:
    """The pgbench script: claim `batch` jobs of queue `default` (the claim statement's CTEs,
    its probe of other tenants included), then acknowledge them."""
    claim = (
        f"WITH {repository.CLAIM_CTES} SELECT coalesce(array_agg(id), '{{}}') AS ids,"
        " coalesce(array_agg(lease_id), '{}') AS leases,"
        " (SELECT bool_or(shared) FROM probe) AS shared FROM claimed"
    )
    literals = {"$1": "'{default}'", "$2": str(batch), "$3": "'pgbench'", "$4": "30"}
    claim = re.sub(r"\$[1-4]\b", lambda m: literals[m.group(0)], claim)
    results = "array_fill(NULL::text, ARRAY[cardinality(:ids::uuid[])])"
    acked = {"$1": ":ids", "$2": ":leases", "$3": results}
    ack = re.sub(r"\$[1-3]\b", lambda m: acked[m.group(0)], repository.ACK_STATEMENT)
    return f"{_one_line(claim)} \\gset\n{_one_line(ack)};\n"


def _one_line(statement: str) -> str:
    """The statement on one line, its `--` comments dropped (the statements have no `--` in
    a string literal): pgbench reads a command to its `;` or `\\gset`."""
    lines = (line.split("--", 1)[0].strip() for line in statement.strip().splitlines())
    return " ".join(line for line in lines if line)


async def run(ctx: Context, clients: int, transactions: int, batch: int) -> dict[str, Any]:
    """Drain `clients * transactions * batch` jobs with pgbench (`-M prepared`, generic plans
    as the queue service uses). Returns `{clients, transactions, batch, jobs, tps, seconds,
    jobs_per_s, verified}`. RuntimeError with pgbench's output when it fails."""
    url = await ctx.database("pgbench")
    jobs = clients * transactions * batch
    connection = await asyncpg.connect(url)
    try:
        await prepare_backlog(connection, jobs)
        path = ctx.logs / "pgbench-claim-ack.sql"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(script(batch))
        parts = urlsplit(url)
        command = [
            pgbench_binary(), "-n", "-M", "prepared", "-c", str(clients),
            "-j", str(min(clients, os.cpu_count() or 1)), "-t", str(transactions),
            "-f", str(path), "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432),
            "-U", parts.username or "postgres", parts.path.lstrip("/"),
        ]  # fmt: skip
        env = {**os.environ, "PGOPTIONS": "-c plan_cache_mode=force_generic_plan"}
        ctx.progress.tick(f"pgbench: {clients} clients, {jobs:,} jobs", force=True)
        process = await asyncio.create_subprocess_exec(
            *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output = (await process.communicate())[0].decode(errors="replace")
        match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", output)
        if process.returncode != 0 or match is None:
            raise RuntimeError(f"pgbench failed ({process.returncode}):\n{output[-3000:]}")
        verified = database.verify(await database.outcome(connection), jobs)
    finally:
        await connection.close()
    tps = float(match.group(1))
    seconds = clients * transactions / tps
    result = {
        "clients": clients,
        "transactions_per_client": transactions,
        "batch": batch,
        "jobs": jobs,
        "tps": round(tps, 1),
        "seconds": round(seconds, 3),
        "jobs_per_s": round(verified["completed"] / seconds, 1),
        "verified": verified,
        "script": str(Path(path).name),
    }
    ctx.progress.note(f"pgbench claim+ack: {result['jobs_per_s']:,} jobs/s")
    return result
