"""The claim statements of two revisions, interleaved call by call: `python -m
benchmark.statements --before REV` (`make bench-statements BEFORE=REV`).

A burn-down's throughput moves by 10-30 % between rounds on a shared machine, more than a
change to one statement does. This measures the statements alone, without services or
workers: one asyncpg connection runs the worker's cycle (`JobRepository.ack_and_claim`: the
last claim's acks and the next claim of 32, one statement) over a backlog of `--jobs` `noop`
jobs of `--tenants` tenants in turn (`burndown.prepare_backlog`), cycling through four
claimers call by call: REV's usual claim, this checkout's, REV's fair claim
(docs/architecture.md#fair-shares), this checkout's, in a new random order each cycle: a
claim's cost depends on the claim before it (it walks past the index entries that claim
left), and with the same statements on both sides a fixed order read 0.97. Each claimer
acks its own jobs; all four share the backlog, the table and the moment, so the machine's
drift lands on all four alike, and the ratios are read within each burn. A claimer whose
backlog share ran out keeps being called (claiming nothing) until all four have, so its
PostgreSQL CPU per job includes those few empty calls.

Per claimer it reports the median wall time of a call per job claimed (only calls that
claimed a full 32, so every claimer's calls carry the same work) and PostgreSQL's CPU per job
(the backend's `/proc` ticks around each call, summed: sampled, unbiased over hundreds of
calls). Both revisions' statements run on this checkout's schema through this checkout's
repository (`services.queue.repository`, its module statements swapped per call), so REV
must have the same migrations (a revision that differs is refused) and claim statements
returning the same columns. Writes `benchmark/results/statements-<stamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

import asyncpg

from benchmark import database
from benchmark.burndown import prepare_backlog
from benchmark.compare import RESULTS, checkout, head_revision
from benchmark.progress import Progress
from infra.servers import ensure_postgres
from infra.stack import ROOT
from services.queue import repository
from services.queue.repository import JobRepository, create_pool

CLAIM = 32
"""Jobs per claim, as a worker of 32 slots asks for (the default until 2026-12-07; kept at 32 so
runs compare with the earlier ones in benchmark/README.md)."""

KINDS = ("plain", "fair")
"""The usual claim (`ACK_AND_CLAIM_STATEMENT`) and the fair one (`…_FAIR_STATEMENT`)."""

_MODULE_NAMES = {"plain": "_ACK_AND_CLAIM", "fair": "_ACK_AND_CLAIM_FAIR"}
_PUBLIC_NAMES = {"plain": "ACK_AND_CLAIM_STATEMENT", "fair": "ACK_AND_CLAIM_FAIR_STATEMENT"}
_MIGRATIONS = Path("services/queue/migrations/versions")
_TICK = os.sysconf("SC_CLK_TCK")


class _Claimer(JobRepository):
    """The repository with the statement kind fixed (`fair`), instead of learnt from the
    probe: both kinds run on the same backlog of many tenants."""

    fair = False

    def _fair(self, queues: Sequence[str]) -> bool:
        return self.fair


def statements_of(root: Path, revision: str) -> dict[str, str]:
    """The two claim statements of the checkout at `root` (of `revision`), by kind.
    SystemExit when it has none, or migrations other than this checkout's (its statements
    would not run on this checkout's schema)."""
    mine = {p.name for p in (ROOT / _MIGRATIONS).glob("*.py")}
    theirs = {p.name for p in (root / _MIGRATIONS).glob("*.py")}
    if mine != theirs:
        raise SystemExit(
            f"{revision} has other migrations than this checkout (only there: "
            f"{sorted(theirs - mine) or 'none'}; only here: {sorted(mine - theirs) or 'none'}), "
            "so its statements cannot run on this checkout's schema: choose a revision after "
            "the last migration"
        )
    names = ", ".join(f"{kind!r}: R.{name}" for kind, name in _PUBLIC_NAMES.items())
    script = (
        f"import json; from services.queue import repository as R; print(json.dumps({{{names}}}))"
    )
    found = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
    )  # fmt: skip
    if found.returncode != 0:
        raise SystemExit(
            f"{revision} has no {' or '.join(_PUBLIC_NAMES.values())}:\n{found.stderr}"
        )
    statements: dict[str, str] = json.loads(found.stdout)
    return statements


@contextlib.contextmanager
def _statement(kind: str, text: str) -> Iterator[None]:
    """This checkout's repository runs `text` as its `kind` claim statement meanwhile."""
    name = _MODULE_NAMES[kind]
    saved = getattr(repository, name)
    setattr(repository, name, text)
    try:
        yield
    finally:
        setattr(repository, name, saved)


def _backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the server process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def _burn(
    claimers: dict[str, tuple[_Claimer, str, str]],
    connection: asyncpg.Connection,
    backend: int,
    jobs: int,
    tenants: int,
    seed: int,
) -> dict[str, dict[str, float | None]]:
    """One backlog claimed to the end by the claimers in turn, each cycle in a new order
    (shuffled, from `seed`), since a claim's cost depends on the claim before it; per claimer
    the median wall µs per job of its full claims, PostgreSQL's CPU µs per job and the jobs
    it claimed."""
    await prepare_backlog(connection, jobs, tenants=tenants)
    walls: dict[str, list[float]] = {name: [] for name in claimers}
    cpu = dict.fromkeys(claimers, 0.0)
    claimed = dict.fromkeys(claimers, 0)
    acks: dict[str, list[tuple[Any, Any, None]]] = {name: [] for name in claimers}
    empty: set[str] = set()
    order, shuffle = list(claimers), random.Random(seed).shuffle
    while len(empty) < len(claimers):
        shuffle(order)
        for name in order:
            claimer, kind, text = claimers[name]
            with _statement(kind, text):
                cpu_before, started = _backend_cpu(backend), time.perf_counter()
                got, _ = await claimer.ack_and_claim(acks[name], ["default"], "bench", CLAIM, 30)
                wall = time.perf_counter() - started
                cpu[name] += _backend_cpu(backend) - cpu_before
            acks[name] = [(job.id, job.receipt_handle, None) for job in got]
            claimed[name] += len(got)
            if len(got) == CLAIM:
                walls[name].append(wall / CLAIM * 1e6)
            if not got:
                empty.add(name)
    return {
        name: {
            "wall_us_per_job": round(median(walls[name]), 2) if walls[name] else None,
            "postgres_cpu_us_per_job": round(cpu[name] / max(claimed[name], 1) * 1e6, 2),
            "jobs": claimed[name],
            "full_claims": len(walls[name]),
        }
        for name in claimers
    }


async def run(revision: str, burns: int, jobs: int, tenants: int) -> dict[str, Any]:
    """The result document: settings, each burn's figures per claimer, and the summary."""
    before = statements_of(checkout(revision), revision)
    after = {kind: getattr(repository, _MODULE_NAMES[kind]) for kind in KINDS}
    base = ensure_postgres()
    await database.make_template(base)
    url = await database.fresh_database(base, "jobq_bench_statements")
    pool = await create_pool(url, size=1)
    connection = await asyncpg.connect(url)
    progress = Progress(total=burns)
    started = datetime.now(UTC)
    try:
        claimers: dict[str, tuple[_Claimer, str, str]] = {}
        for kind in KINDS:
            for side, texts in (("before", before), ("after", after)):
                claimer = _Claimer(pool)
                claimer.fair = kind == "fair"
                claimers[f"{kind} {side}"] = (claimer, kind, texts[kind])
        async with claimers["plain before"][0].connection() as session:
            backend = await session.fetchval("SELECT pg_backend_pid()")
        results = []
        for burn in range(burns):
            progress.phase(f"burn {burn + 1}/{burns}: {jobs:,} jobs of {tenants} tenant(s)")
            results.append(await _burn(claimers, connection, backend, jobs, tenants, burn))
            progress.note(
                "  " + ", ".join(f"{n} {r['wall_us_per_job']} µs" for n, r in results[-1].items())
            )
    finally:
        await connection.close()
        await pool.close()
        for name in ("jobq_bench_statements", database.TEMPLATE):
            await database.drop_database(base, name)
    return {
        "name": "statements",
        "before": revision,
        "before_commit": checkout(revision).name,
        "after": head_revision(),
        "started": started.isoformat(timespec="seconds"),
        "settings": {"burns": burns, "jobs": jobs, "tenants": tenants, "claim": CLAIM},
        "burns": results,
        "summary": summary(results),
    }


def summary(burns: list[dict[str, dict[str, float | None]]]) -> dict[str, dict[str, float | None]]:
    """Per claimer, the medians over burns of its wall and CPU µs per job, and the median over
    burns of the within-burn ratios to `plain before` (`x_plain_before`) and, for the after
    sides, to the same kind's before (`x_before`)."""

    def ratio(burn: dict[str, dict[str, float | None]], name: str, reference: str) -> float | None:
        value, base = burn[name]["wall_us_per_job"], burn[reference]["wall_us_per_job"]
        return value / base if value and base else None

    def middle(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return round(median(present), 3) if present else None

    out: dict[str, dict[str, float | None]] = {}
    for name in burns[0]:
        kind, side = name.split()
        out[name] = {
            "wall_us_per_job": middle([b[name]["wall_us_per_job"] for b in burns]),
            "postgres_cpu_us_per_job": middle([b[name]["postgres_cpu_us_per_job"] for b in burns]),
            "x_plain_before": middle([ratio(b, name, "plain before") for b in burns]),
            "x_before": middle([ratio(b, name, f"{kind} before") for b in burns])
            if side == "after"
            else None,
        }
    return out


def _table(document: dict[str, Any]) -> str:
    lines = [
        "| claimer | wall µs per job | PostgreSQL CPU µs per job | x plain before "
        "| x same kind before |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in document["summary"].items():
        cells = [row["wall_us_per_job"], row["postgres_cpu_us_per_job"], row["x_plain_before"]]
        cells.append(row["x_before"])
        lines.append(
            f"| {name} | " + " | ".join("—" if c is None else f"{c}" for c in cells) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: runs the burns, prints the table and the JSON's path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the earlier revision (a commit, tag…)")
    parser.add_argument("--burns", type=int, default=6, help="backlogs claimed to the end, 1-50")
    parser.add_argument(
        "--jobs", type=int, default=30_000, help="backlog per burn, 1,000-1,000,000"
    )
    parser.add_argument("--tenants", type=int, default=20, help="tenants owning it in turn, 1-100")
    args = parser.parse_args(argv)
    if not 1 <= args.burns <= 50 or not 1_000 <= args.jobs <= 1_000_000:
        parser.error("--burns must be 1 to 50 and --jobs 1,000 to 1,000,000")
    if not 1 <= args.tenants <= 100:
        parser.error("--tenants must be 1 to 100")
    document = asyncio.run(run(args.before, args.burns, args.jobs, args.tenants))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"statements-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(_table(document))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
