"""`python -m benchmark`: the whole suite, one JSON result, PNG plots, the README table.

Phases, in order: burn-down rounds (jobq's default shape alternating with each peer), the
burn-down matrix, the `kill -9` run, the raw-protocol client, pgbench, ingest steps, the full
stack (idle and loaded resources, pickup latency), claims under history. Each phase starts
its own processes and databases and stops them; a failure stops the suite with the logs.

    python -m benchmark                  # the full suite (make bench)
    python -m benchmark --preset quick   # the smoke-test size (make bench-quick)
    python -m benchmark --render benchmark/results/full-….json   # README table from a result
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from benchmark import RESULTS, burndown, claims, ingest, peers, pgbench, plots, rawclient, report
from benchmark import resources as resources_phase
from benchmark.burndown import Shape
from benchmark.context import Context
from benchmark.machine import describe, load_average
from benchmark.presets import DEFAULT_SHAPE, PRESETS, Preset
from benchmark.progress import Progress
from benchmark.stats import median
from infra.servers import ensure_postgres, ensure_redis

PHASES = 9


async def _burn_rounds(ctx: Context, preset: Preset, python: Path | None) -> dict[str, Any]:
    """jobq's default shape and every peer, alternating, `preset.rounds` times."""
    runs: dict[str, list[dict[str, Any]]] = {"jobq": [], **{p: [] for p in preset.peers}}
    url = await ctx.database("burn")
    stack = ctx.stack("burn", url, workers=DEFAULT_SHAPE.replicas)
    await stack.start(workers=0)
    connection = await asyncpg.connect(url)
    try:
        for round_ in range(preset.rounds):
            ctx.progress.note(f"round {round_ + 1}/{preset.rounds}")
            runs["jobq"].append(
                await burndown.burn_once(
                    ctx, stack, connection, DEFAULT_SHAPE, preset.burn_jobs, 600
                )
            )
            for name in preset.peers:
                assert python is not None
                peer = peers.PEERS[name]
                runs[name].append(await peers.burn(ctx, python, peer, preset.peer_jobs[name], 900))
    finally:
        await connection.close()
        stack.stop()
    return {
        name: {"jobs_per_s": median([r["jobs_per_s"] for r in results]), "rounds": results}
        for name, results in runs.items()
    }


async def _matrix(ctx: Context, preset: Preset) -> list[dict[str, Any]]:
    if not preset.matrix:
        return []
    url = await ctx.database("matrix")
    most = max(shape.replicas for shape in preset.matrix)
    stack = ctx.stack("matrix", url, workers=most)
    await stack.start(workers=0)
    connection = await asyncpg.connect(url)
    try:
        return [
            await burndown.burn_once(ctx, stack, connection, shape, preset.matrix_jobs, 900)
            for shape in preset.matrix
        ]
    finally:
        await connection.close()
        stack.stop()


async def _raw(ctx: Context, preset: Preset) -> list[dict[str, Any]]:
    url = await ctx.database("raw")
    stack = ctx.stack("raw", url)
    await stack.start()
    connection = await asyncpg.connect(url)
    try:
        return [
            await rawclient.raw_once(ctx, stack, connection, loops, preset.raw_jobs)
            for loops in preset.raw_loops
        ]
    finally:
        await connection.close()
        stack.stop()


async def _ingest(ctx: Context, preset: Preset) -> dict[str, Any]:
    stacks = await ingest.start_stacks(ctx)
    rounds: dict[str, list[dict[str, Any]]] = {t: [] for t in preset.ingest_targets}
    try:
        targets = stacks.targets()
        for name in preset.ingest_targets:
            await ingest.warm_up(targets[name])
        for round_ in range(preset.ingest_rounds):
            for name in preset.ingest_targets:
                target = targets[name]
                table = "bare_job" if name == "bare" else "job"
                await ingest.truncate(target.database_url, table)
                ctx.progress.note(f"ingest round {round_ + 1}/{preset.ingest_rounds}: {name}")
                run = await ingest.stepped(
                    ctx, target, preset.ingest_rates, preset.ingest_seconds, ctx.logs
                )
                await ingest.truncate(target.database_url, table)
                run["closed"] = await ingest.closed_loop(
                    ctx, target, preset.ingest_seconds, ctx.logs
                )
                rounds[name].append(run)
    finally:
        stacks.stop()
    result: dict[str, Any] = {}
    for name, runs in rounds.items():
        for run in runs:
            for step in [*run["steps"], run["closed"]]:
                step.pop("usage", None)
        result[name] = {
            "knee_per_s": median([r["knee_per_s"] for r in runs]),
            "closed_per_s": median([r["closed"]["achieved_per_s"] for r in runs]),
            "rounds": runs,
        }
    return result


async def _phases_run(ctx: Context, preset: Preset, python: Path | None) -> dict[str, Any]:
    """Every measuring phase in order; the results by phase."""
    progress = ctx.progress
    results: dict[str, Any] = {}
    progress.phase(f"burn-down rounds: jobq {DEFAULT_SHAPE.label} and {len(preset.peers)} peers")
    results["burn_rounds"] = await _burn_rounds(ctx, preset, python)
    progress.phase(f"burn-down matrix: {len(preset.matrix)} shapes")
    results["matrix"] = await _matrix(ctx, preset)
    progress.phase("kill -9 of a worker mid-run")
    results["kill"] = await burndown.kill_run(ctx, preset.kill_jobs, 10, 300)
    progress.phase("raw-protocol client and pgbench")
    results["raw"] = await _raw(ctx, preset)
    clients, transactions, batch = preset.pgbench
    results["pgbench"] = await pgbench.run(ctx, clients, transactions, batch)
    progress.phase(f"ingest steps: {', '.join(preset.ingest_targets)}")
    results["ingest"] = await _ingest(ctx, preset)
    progress.phase("full stack: resources idle and under load, pickup, latency under load")
    # The producer's knee (the highest step passing p95 < 50 ms); the lowest step if none did.
    knee = results["ingest"]["producer"]["knee_per_s"] or preset.ingest_rates[0]
    service = await resources_phase.run(
        ctx,
        preset.idle_seconds,
        preset.pickup_jobs,
        preset.pickup_rate,
        preset.load_rate,
        preset.load_seconds,
        [(f, max(1, round(f * knee))) for f in preset.latency_fractions],
        preset.latency_seconds,
        preset.latency_rounds,
    )
    results["latency_under_load"] = {"knee_per_s": knee, "steps": service.pop("latency")}
    results["pickup"] = service.pop("pickup")
    results["resources"] = service
    progress.phase("claims under history")
    results["claims"] = await claims.history_cases(
        ctx, preset.history, preset.claims, preset.claim_rounds
    )
    results["claims"]["rr_hold"] = await claims.rr_hold(
        ctx, preset.rr_hold, preset.rr_lead, preset.rr_tail
    )
    return results


async def run(preset: Preset, results_dir: Path, readme: bool) -> Path:
    """Run the suite; returns the path of the JSON result (PNGs beside it). With `readme`,
    regenerates the results table in benchmark/README.md."""
    started = datetime.now(UTC)
    load_start = load_average()
    progress = Progress(total=PHASES)
    logs = Path(tempfile.mkdtemp(prefix="jobq-bench-"))
    ctx = Context(ensure_postgres(), ensure_redis().rstrip("/") + "/14", logs, progress)
    machine = await describe(ctx.base_url, ingest.k6_version())
    progress.phase("template database")
    await ctx.setup()
    python = None
    if preset.peers:
        progress.phase("peers' environment (benchmark/peers.lock)")
        python = await peers.ensure_environment()
    else:
        progress.done += 1
    try:
        results = await _phases_run(ctx, preset, python)
    finally:
        await ctx.cleanup()
    document = {
        "name": preset.name,
        "command": " ".join(["python -m benchmark", *sys.argv[1:]]),
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "elapsed_s": round(time.monotonic() - progress.started),
        "settings": _settings(preset),
        "machine": machine,
        "load_average": {"start": load_start, "end": load_average()},
        "results": results,
    }
    path = _write(document, results_dir, f"{preset.name}-{started:%Y%m%dT%H%M%SZ}", readme)
    shutil.rmtree(logs, ignore_errors=True)
    progress.note(f"wrote {path}")
    return path


def _write(document: dict[str, Any], directory: Path, stem: str, readme: bool) -> Path:
    """Summary, plots, the JSON file and (with `readme`) the README table; the JSON's path."""
    document["summary"] = report.summary(document)
    directory.mkdir(parents=True, exist_ok=True)
    document["plots"] = plots.write_all(document, directory, stem)
    path = directory / f"{stem}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    if readme:
        report.update_readme(document, path)
    return path


def _settings(preset: Preset) -> dict[str, Any]:
    settings = asdict(preset)
    settings["matrix"] = [Shape(**s).label for s in settings["matrix"]]
    settings["default_shape"] = DEFAULT_SHAPE.label
    return settings


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; prints the result's path on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where JSON/PNG go")
    parser.add_argument(
        "--readme",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="regenerate benchmark/README.md's table (default: only for the full preset)",
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="run nothing: recompute the summary of a result and regenerate the README table",
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        document = json.loads(args.render.read_text())
        document["summary"] = report.summary(document)
        args.render.write_text(json.dumps(document, indent=1) + "\n")
        report.update_readme(document, args.render)
        print(args.render)
        return
    preset = PRESETS[args.preset]
    readme = args.readme if args.readme is not None else preset.name == "full"
    print(asyncio.run(run(preset, args.results, readme)))
