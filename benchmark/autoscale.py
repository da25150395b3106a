"""Scaling simulation: a bursty arrival trace against the real stack, once with workers started
and stopped by KEDA's algorithm on the real metrics, once with a fixed fleet of the peak size.

    python -m benchmark.autoscale      # `make bench-autoscale`: JSON + PNG in benchmark/results

Each run: a fresh database, a queue service, a producer, a real Prometheus scraping them
(`infra.observe.Observer`, 1 s), and worker processes (`python -m services.worker`, as a pod
runs it). The arrival trace (`TRACE`) submits `sleep` jobs of `JOB_MS` through the producer.

*Scaled*: every polling interval, a controller (`benchmark.keda.Controller`) asks Prometheus
the worker ScaledObject's own trigger queries, read from the rendered production overlay, and
applies KEDA's and the HPA's algorithm with the ScaledObject's own settings, then starts
workers or stops them with SIGTERM (they drain, as a pod does). Everything the ScaledObject
states in seconds (polling, cooldown, stabilisation windows, policy periods, the age target) is
divided by `--time-scale` (10) so a few minutes show a day's shape; jobs and arrivals run in
real time. A replica has `SLOTS` slots (the demand threshold is the slots of one replica, as
in the manifest) and the maximum is `MAX_REPLICAS` (this machine has two cores).

*Fixed*: the peak replica count of the scaled run, all the time.

Reported per run: each job's wait (created -> claimed, from the database) p50/p95/max, the
oldest pending age over time (what the age trigger reads), replicas over time, and
worker-seconds (the lifetime of every worker process, draining included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt

from benchmark import database
from benchmark.database import drop_database, migrated_database
from benchmark.keda import Controller, Scaling
from benchmark.stats import percentile
from infra.kubernetes import render
from infra.observe import Observer
from infra.servers import ensure_postgres, ensure_redis
from infra.stack import ROOT, LocalStack

RESULTS = ROOT / "benchmark" / "results"
TRACE = ((0, 20, 2.0), (20, 40, 40.0), (40, 70, 0.0), (70, 85, 60.0), (85, 115, 4.0))
"""(from s, to s, jobs per second): quiet, a burst, silence, a bigger burst, a trickle."""
JOB_MS = 500
SLOTS = 4
MAX_REPLICAS = 8
SETTINGS = {
    "WORKER_CONCURRENCY": str(SLOTS),
    "WORKER_SHUTDOWN_GRACE": "5s",
    "WORKER_WAIT_SECONDS": "2",
    "QUEUE_DEPTH_INTERVAL": "500ms",
    "LOG_LEVEL": "WARNING",
}
SAMPLE_SECONDS = 0.5
SUBMIT_SECONDS = 0.25


def arrival_rate(second: float) -> float:
    """Jobs per second the trace submits at `second` of the run."""
    return next((rate for start, end, rate in TRACE if start <= second < end), 0.0)


@dataclass
class Fleet:
    """Worker processes of `stack`, started and stopped by index; keeps each one's lifetime."""

    stack: LocalStack
    running: list[int] = field(default_factory=list)
    lifetimes: list[tuple[float, float | None]] = field(default_factory=list)
    stopping: set[asyncio.Task[None]] = field(default_factory=set)
    _started: dict[int, int] = field(default_factory=dict)

    def scale(self, replicas: int, now: float) -> None:
        """Start or stop (SIGTERM, in the background) workers until `replicas` run."""
        while len(self.running) < replicas:
            index = next(i for i in range(MAX_REPLICAS) if i not in self.running)
            self.stack.start_worker(index)
            self.running.append(index)
            self._started[index] = len(self.lifetimes)
            self.lifetimes.append((now, None))
        while len(self.running) > replicas:
            index = self.running.pop()
            task = asyncio.create_task(self._stop(index))
            self.stopping.add(task)
            task.add_done_callback(self.stopping.discard)

    async def _stop(self, index: int) -> None:
        slot = self._started.pop(index)
        await asyncio.to_thread(self.stack.stop_process, f"worker{index + 1}")
        self.lifetimes[slot] = (self.lifetimes[slot][0], time.monotonic())

    async def close(self) -> None:
        """Stop every worker and wait for the ones draining."""
        self.scale(0, time.monotonic())
        while self.stopping:
            await asyncio.gather(*list(self.stopping))

    def worker_seconds(self, end: float) -> float:
        """Seconds of worker processes alive, until `end` for those still running."""
        return sum((stop or end) - start for start, stop in self.lifetimes)


def arrivals_until(second: float) -> float:
    """Jobs the trace has submitted by `second` of the run (the integral of its rate)."""
    return sum(rate * max(0.0, min(second, end) - start) for start, end, rate in TRACE)


async def _submit(producer: httpx.AsyncClient, started: float, until: float) -> int:
    """Follow `TRACE` until `until` seconds into the run, catching up whatever a slow reply
    delayed; the number of jobs submitted."""
    sent = 0
    while (now := time.monotonic() - started) < until:
        count = int(arrivals_until(now)) - sent
        if count > 0:
            jobs = [{"taskType": "sleep", "payload": {"ms": JOB_MS}} for _ in range(count)]
            reply = await producer.post("/jobs/batch", json={"jobs": jobs})
            reply.raise_for_status()
            sent += count
        await asyncio.sleep(SUBMIT_SECONDS)
    return sent


async def _value(observer: Observer, query: str) -> float:
    result = await observer.query(query)
    return float(result[0]["value"][1]) if result else 0.0


async def run(mode: str, fixed: int, scratch: Path, time_scale: float) -> dict[str, Any]:
    """One run (`mode` "scaled" or "fixed" with `fixed` workers); its samples and summary."""
    base = ensure_postgres()
    name = f"jobq_bench_autoscale_{mode}"
    database_url = await migrated_database(base, name)
    worker = next(
        o
        for o in render("production")
        if o["kind"] == "ScaledObject" and o["metadata"]["name"] == "jobq-worker"
    )
    scaling = Scaling.from_scaled_object(worker, time_scale, slots=SLOTS)
    scaling = replace(scaling, maximum=min(scaling.maximum, MAX_REPLICAS))
    controller = Controller(scaling)
    stack = LocalStack(
        database_url,
        ensure_redis() + "/13",
        scratch / mode / "stack",
        workers=MAX_REPLICAS,
        environment=SETTINGS,
        smtp_enabled=False,
    )
    await stack.start(workers=0)
    observer = Observer(stack, database_url, scratch / mode / "prometheus")
    fleet = Fleet(stack)
    samples: list[dict[str, float]] = []
    try:
        await observer.start()
        started = time.monotonic()
        duration = TRACE[-1][1] + 30.0
        async with httpx.AsyncClient(base_url=stack.producer, timeout=30) as producer:
            submitter = asyncio.create_task(_submit(producer, started, TRACE[-1][1]))
            next_poll = 0.0
            desired = fixed if mode == "fixed" else 0
            fleet.scale(desired, started)
            while (now := time.monotonic() - started) < duration:
                values = {t.name: await _value(observer, t.query) for t in scaling.triggers}
                if mode == "scaled" and now >= next_poll:
                    desired = controller.decide(now, values, len(fleet.running))
                    fleet.scale(desired, time.monotonic())
                    next_poll = now + scaling.polling
                samples.append(
                    {
                        "t": round(now, 2),
                        "replicas": len(fleet.running),
                        "arrival_per_s": arrival_rate(now),
                        **{k.replace("-", "_"): v for k, v in values.items()},
                    }
                )
                await asyncio.sleep(SAMPLE_SECONDS)
            submitted = await submitter
        await fleet.close()
        end = time.monotonic()
        connection = await asyncpg.connect(database_url)
        try:
            waits = [
                row[0]
                for row in await connection.fetch(
                    "SELECT EXTRACT(EPOCH FROM claimed_at - created_at)::float8"
                    f" FROM {await database.jobs_relation(connection)}"
                    " WHERE claimed_at IS NOT NULL"
                )
            ]
            completed = await connection.fetchval(
                f"SELECT count(*) FROM {await database.jobs_relation(connection)}"
                " WHERE status = 'COMPLETED'"
            )
        finally:
            await connection.close()
    finally:
        await fleet.close()
        observer.stop()
        stack.stop()
        await drop_database(base, name)
    waits.sort()
    return {
        "mode": mode,
        "workers": fixed if mode == "fixed" else None,
        "submitted": submitted,
        "completed": completed,
        "wait_s": {
            "p50": round(percentile(waits, 0.5), 3),
            "p95": round(percentile(waits, 0.95), 3),
            "max": round(waits[-1], 3) if waits else None,
        },
        "oldest_pending_age_max_s": max(s["oldest_pending_age"] for s in samples),
        "peak_replicas": max(s["replicas"] for s in samples),
        "worker_seconds": round(fleet.worker_seconds(end), 1),
        "samples": samples,
    }


def plot(document: dict[str, Any], path: Path) -> None:
    """Replicas and oldest pending age over time, scaled against fixed, with the arrivals."""
    runs = {r["mode"]: r for r in document["runs"]}
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for mode, colour in (("scaled", "#1f77b4"), ("fixed", "#ff7f0e")):
        samples = runs[mode]["samples"]
        times = [s["t"] for s in samples]
        label = f"{mode} ({runs[mode]['worker_seconds']:.0f} worker-s)"
        top.step(times, [s["replicas"] for s in samples], where="post", label=label, color=colour)
        wait = runs[mode]["wait_s"]["p95"]
        bottom.plot(
            times,
            [s["oldest_pending_age"] for s in samples],
            label=f"{mode} (job wait p95 {wait:.2f} s)",
            color=colour,
        )
    arrivals = top.twinx()
    samples = runs["scaled"]["samples"]
    arrivals.fill_between(
        [s["t"] for s in samples], [s["arrival_per_s"] for s in samples], alpha=0.15, step="post"
    )
    arrivals.set_ylabel("arrivals (jobs/s, shaded)")
    top.set_ylabel(f"worker replicas ({SLOTS} slots each)")
    top.legend(loc="upper left")
    bottom.set_ylabel("oldest PENDING job (s)")
    bottom.set_xlabel("seconds into the run")
    bottom.legend(loc="upper left")
    figure.suptitle(
        f"KEDA scaling (time scale 1/{document['settings']['time_scale']:g}) vs a fixed fleet"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


async def main_async(time_scale: float) -> Path:
    """Both runs; writes the JSON and PNG and returns the JSON's path."""
    scratch = Path(tempfile.mkdtemp(prefix="jobq-autoscale-"))
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    begun = time.monotonic()
    scaled = await run("scaled", 0, scratch, time_scale)
    fixed = await run("fixed", scaled["peak_replicas"], scratch, time_scale)
    document = {
        "name": f"autoscale-{stamp}",
        "command": "python -m benchmark.autoscale " + " ".join(sys.argv[1:]),
        "started": started.isoformat(),
        "elapsed_s": round(time.monotonic() - begun, 1),
        "settings": {
            "trace": TRACE,
            "job_ms": JOB_MS,
            "slots": SLOTS,
            "max_replicas": MAX_REPLICAS,
            "time_scale": time_scale,
            "environment": SETTINGS,
        },
        "runs": [scaled, fixed],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"autoscale-{stamp}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    plot(document, RESULTS / f"autoscale-{stamp}.png")
    return path


def main() -> int:
    """CLI entry point: print the summary of both runs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-scale", type=float, default=10.0)
    args = parser.parse_args()
    path = asyncio.run(main_async(args.time_scale))
    for result in json.loads(path.read_text())["runs"]:
        summary = {k: v for k, v in result.items() if k != "samples"}
        print(json.dumps(summary))
    print(f"wrote {path} and its .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
