"""Soak: a sustained arrival rate drained by workers for a long run, with retention in minutes
and a REPEATABLE READ snapshot held in the middle, sampling what a hot table's bloat would
show (`python -m benchmark.soak`, `make bench-soak`).

Per side (this checkout, and with `--before REV` an earlier revision's services first, run the
same way on the same machine, as `make bench-compare` does) it:

- migrates a fresh database with that side's migrations and starts its queue service and
  `--workers` worker replicas (no producer: the arrival is the shared enqueue statement, so
  the producer's HTTP cost does not eat the 2 cores the soak is about);
- inserts `--rate` jobs/s (no-op jobs, in ten batches a second on a fixed schedule) for
  `--minutes`, bounded, loopback only;
- sets retention (`QUEUE_RETENTION`, `QUEUE_DEAD_LETTER_RETENTION`) to `--retention`, the
  retention loop's interval to 10 s and (where the side has it) the history's partition
  width to `--partition`, so several partitions are made and dropped during a run (the
  fresh database's empty daily partitions, which a changed width would not replace, are
  dropped before the services start);
- runs with autovacuum on: a server that has it off (a CI server's `autovacuum = off`) gets
  `ALTER SYSTEM SET autovacuum = on` for the run and `ALTER SYSTEM RESET autovacuum` after;
- holds a REPEATABLE READ transaction with a snapshot of `job` for `--snapshot-seconds` from
  the middle of the run;
- every `--sample-seconds` samples: the hot table's bytes (`pg_total_relation_size('job')`,
  and its indexes' alone),
  live and dead tuples, autovacuum runs and other vacuums (the queue service's own), the
  history's bytes (all partitions), WAL bytes (`pg_current_wal_lsn()`) per completed job,
  claim-statement p50/p99 and submit→complete p50/p99 (from the queue service's histograms,
  over the interval), and retention's cost as
  rows deleted one by one by retention (`n_tup_del` of `job` on a side without the history,
  of the history's partitions on a side with it: a dropped partition deletes no row) and
  history partitions existing, the server's checkpoints so far, and the claim histogram's
  cumulative buckets, so the summary's p99 of a whole minute is over every claim of it;
- every 0.25 s reads `pg_stat_activity` and keeps each reading in which `STALL_BACKENDS` or
  more of the run's backends wait on a lock, I/O or another process, with their blockers
  (`stalls`; a count per cause printed at the end of the side).

Writes `benchmark/results/soak-<stamp>.json` (settings, machine, each side's samples and a
summary: hot-table bytes at the end over minute 5, claim p99 at the end over minute 5, WAL
bytes per job, retention rows deleted) and the PNG beside it. The issue's long run is
`make bench-soak MINUTES=30 BEFORE=<rev>` (about an hour: two sides); `--minutes 3` proves
the script.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
from prometheus_client.parser import text_string_to_metric_families

from benchmark import RESULTS, database
from benchmark.compare import checkout, head_revision
from benchmark.database import migrated_database
from benchmark.scrape import sample_total
from infra.servers import ensure_postgres, ensure_redis
from infra.stack import ROOT, LocalStack

BATCHES_PER_SECOND = 10

_TABLES = """
SELECT pg_total_relation_size('job') AS job_bytes, pg_indexes_size('job') AS index_bytes,
       s.n_live_tup AS live, s.n_dead_tup AS dead, s.autovacuum_count AS autovacuums,
       s.vacuum_count AS vacuums,
       s.n_tup_del AS job_deleted,
       (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint AS wal,
       (SELECT count(*) FROM job WHERE status = 'PENDING') AS pending,
       (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter) AS checkpoints
FROM pg_stat_user_tables AS s WHERE s.relid = 'job'::regclass
"""

_HISTORY = """
SELECT COALESCE(sum(pg_total_relation_size(tree.relid)), 0)::bigint AS bytes,
       COALESCE(sum(s.n_tup_del), 0)::bigint AS deleted,
       count(*) FILTER (WHERE tree.isleaf) AS partitions
FROM pg_partition_tree('job_history') AS tree
LEFT JOIN pg_stat_user_tables AS s ON s.relid = tree.relid
"""


def _buckets(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of histogram `name` summed over its labels: {le: count}."""
    counts: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                counts[le] = counts.get(le, 0.0) + sample.value
    return counts


def _counter(text: str, name: str, **labels: str) -> float:
    """Sum of counter `name`'s samples whose labels include `labels`."""
    return sample_total(text, name, f"{name}_total", **labels)


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The `q` quantile (seconds) of the observations between two readings of a cumulative
    histogram, interpolated linearly within its bucket (as PromQL's histogram_quantile);
    None when nothing was observed."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            share = (
                (rank - previous_count) / (count - previous_count) if count > previous_count else 1
            )
            return previous_bound + (bound - previous_bound) * share
        previous_bound, previous_count = bound, count
    return previous_bound


async def _arrive(url: str, rate: int, until: float, counts: dict[str, int]) -> None:
    """Insert `rate` jobs a second in `BATCHES_PER_SECOND` batches on a fixed schedule until
    the monotonic time `until`; `counts["inserted"]` and `counts["late"]` (batches that
    started after their slot's end) are kept up to date."""
    connection = await asyncpg.connect(url)
    try:
        per_batch = max(1, rate // BATCHES_PER_SECOND)
        start = time.monotonic()
        n = 0
        while time.monotonic() < until:
            slot = start + n / BATCHES_PER_SECOND
            delay = slot - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif -delay > 1 / BATCHES_PER_SECOND:
                counts["late"] += 1
            await database.insert_jobs(connection, per_batch)
            counts["inserted"] += per_batch
            n += 1
    finally:
        await connection.close()


async def _hold_snapshot(url: str, at: float, seconds: float, log: list[dict[str, Any]]) -> None:
    """At monotonic time `at`, open a REPEATABLE READ transaction, take its snapshot with a
    read of `job`, and keep it `seconds` (vacuum cannot remove what it may still see)."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    connection = await asyncpg.connect(url)
    try:
        transaction = connection.transaction(isolation="repeatable_read")
        await transaction.start()
        await connection.fetchval("SELECT count(*) FROM job")
        log.append({"event": "snapshot taken", "at": time.time()})
        await asyncio.sleep(seconds)
        await transaction.rollback()
        log.append({"event": "snapshot released", "at": time.time()})
    finally:
        await connection.close()


_WAITING = """
SELECT waiting.backend_type, waiting.wait_event_type || ':' || waiting.wait_event AS wait,
       left(regexp_replace(waiting.query, '\\s+', ' ', 'g'), 100) AS query,
       ARRAY(SELECT blocker.backend_type || ' ' || COALESCE(blocker.wait_event_type || ':'
                    || blocker.wait_event, 'running') || ' '
                    || left(regexp_replace(COALESCE(blocker.query, ''), '\\s+', ' ', 'g'), 100)
             FROM pg_stat_activity AS blocker
             WHERE blocker.pid = ANY(pg_blocking_pids(waiting.pid))) AS blockers
FROM pg_stat_activity AS waiting
WHERE waiting.datname = current_database() AND waiting.state = 'active'
  AND waiting.wait_event_type IN ('Lock', 'LWLock', 'IO', 'IPC', 'BufferPin')
  AND waiting.pid <> pg_backend_pid()
"""

STALL_BACKENDS = 6
"""Backends of the run's database waiting at once (on a lock, I/O or another process) from
which a watch reading is kept as a stall."""


async def _watch(url: str, started: float, until: float, stalls: list[dict[str, Any]]) -> None:
    """Every 0.25 s until the monotonic time `until`, the backends waiting on a lock, I/O or
    another process; a reading with `STALL_BACKENDS` or more is appended to `stalls` (minute,
    what they wait on, the statements that block them and what those wait on), at most 5,000:
    a stall's cause in the run's own record (a DROP queued for its tree's lock, a checkpoint's
    sync, vacuum truncating the table)."""
    connection = await asyncpg.connect(url)
    try:
        while time.monotonic() < until and len(stalls) < 5000:
            rows = await connection.fetch(_WAITING)
            if len(rows) >= STALL_BACKENDS:
                waits: dict[str, int] = {}
                for row in rows:
                    waits[row["wait"]] = waits.get(row["wait"], 0) + 1
                stalls.append(
                    {
                        "minute": round((time.monotonic() - started) / 60, 3),
                        "waiting": len(rows),
                        "waits": waits,
                        "blockers": sorted({b for row in rows for b in row["blockers"]}),
                        "statements": sorted({row["query"] for row in rows})[:5],
                    }
                )
            await asyncio.sleep(0.25)
    finally:
        await connection.close()


async def _sample(
    url: str, queue_url: str, started: float, until: float, every: float
) -> list[dict[str, Any]]:
    """Samples every `every` seconds from `started` until the monotonic time `until`."""
    samples: list[dict[str, Any]] = []
    connection = await asyncpg.connect(url)
    history = await connection.fetchval("SELECT to_regclass('job_history') IS NOT NULL")
    previous: dict[str, Any] | None = None
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            while True:
                row = dict(await connection.fetchrow(_TABLES))
                if history:
                    row.update(
                        {
                            f"history_{k}": v
                            for k, v in (await connection.fetchrow(_HISTORY)).items()
                        }
                    )
                text = (await client.get(f"{queue_url}/metrics")).text
                now: dict[str, Any] = {
                    "t": time.monotonic() - started,
                    **{k: (int(v) if isinstance(v, int) else v) for k, v in row.items()},
                    "completed": _counter(text, "jobq_processed", outcome="success"),
                    "claims": _buckets(text, "jobq_claim_duration_seconds"),
                    "e2e": _buckets(text, "jobq_end_to_end_seconds"),
                    "retention_seconds": sample_total(
                        text,
                        "jobq_history_pass_duration_seconds",
                        "jobq_history_pass_duration_seconds_sum",
                    ),
                    "partitions": {
                        action: _counter(text, "jobq_history_partitions", action=action)
                        for action in ("created", "dropped")
                    },
                }
                if previous is not None:
                    done = now["completed"] - previous["completed"]
                    wal = int(now["wal"]) - int(previous["wal"])
                    deleted = (
                        now.get("history_deleted", 0) - previous.get("history_deleted", 0)
                        if history
                        else now["job_deleted"] - previous["job_deleted"]
                    )
                    sample = {
                        "minute": round(now["t"] / 60, 3),
                        "job_bytes": now["job_bytes"],
                        "job_index_bytes": now["index_bytes"],
                        "live_tuples": now["live"],
                        "dead_tuples": now["dead"],
                        "pending": now["pending"],
                        "autovacuum_runs": now["autovacuums"],
                        "vacuum_runs": now["vacuums"],
                        "history_bytes": now.get("history_bytes"),
                        "history_partitions": now.get("history_partitions"),
                        "completed_per_s": round(done / (now["t"] - previous["t"]), 1),
                        "wal_bytes_per_job": round(wal / done) if done else None,
                        "retention_rows_deleted": int(deleted),
                        # 0 on a side whose services predate these metrics (issue 20's before).
                        "retention_pass_seconds": round(
                            now["retention_seconds"] - previous["retention_seconds"], 4
                        ),
                        "partitions_created": int(now["partitions"]["created"]),
                        "partitions_dropped": int(now["partitions"]["dropped"]),
                        "claim_p50_ms": _ms(quantile(previous["claims"], now["claims"], 0.5)),
                        "claim_p99_ms": _ms(quantile(previous["claims"], now["claims"], 0.99)),
                        "e2e_p50_ms": _ms(quantile(previous["e2e"], now["e2e"], 0.5)),
                        "e2e_p99_ms": _ms(quantile(previous["e2e"], now["e2e"], 0.99)),
                        "claim_buckets": {str(le): n for le, n in now["claims"].items()},
                        "checkpoints": now["checkpoints"],
                    }
                    samples.append(sample)
                    _show(sample, previous["t"], now["t"])
                previous = now
                if time.monotonic() >= until:
                    return samples
                await asyncio.sleep(min(every, max(0.0, until - time.monotonic())))
    finally:
        await connection.close()


def _show(sample: dict[str, Any], before: float, now: float) -> None:
    """A progress line once a minute of the run: what the samples of that minute end with."""
    if int(now // 60) == int(before // 60):
        return
    print(
        f"  minute {sample['minute']:5.1f}: {sample['completed_per_s']:7.1f} jobs/s completed,"
        f" hot table {sample['job_bytes'] / 2**20:7.1f} MiB ({sample['dead_tuples']} dead),"
        f" claim p99 {sample['claim_p99_ms']} ms, e2e p99 {sample['e2e_p99_ms']} ms,"
        f" WAL {sample['wal_bytes_per_job']} B/job",
        flush=True,
    )


def _show_stalls(side: str, stalls: list[dict[str, Any]]) -> None:
    """The stall readings' causes: what the waiting backends waited on, and the blockers, with
    how many readings each was in."""
    seen: dict[str, int] = {}
    for stall in stalls:
        for cause in [*stall["waits"], *stall["blockers"]]:
            seen[cause] = seen.get(cause, 0) + 1
    print(f"soak {side}: {len(stalls)} readings of {STALL_BACKENDS}+ backends waiting", flush=True)
    for cause, count in sorted(seen.items(), key=lambda item: -item[1])[:12]:
        print(f"  {count:5d}  {cause}", flush=True)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


async def _narrow_partitions(url: str) -> int:
    """Drop the history's slot partitions a fresh database's migration made (empty, of the
    default width of a day, covering now and the days ahead): a changed width only takes
    effect for slots no partition covers yet, so the run would otherwise keep daily partitions
    and retention would drop none. The service's loop then makes slots of the run's width at
    its first pass (settles before it land in the DEFAULT partition, moved into the slot when
    it is made). How many were dropped; 0 on a schema without the history."""
    connection = await asyncpg.connect(url)
    try:
        names = await connection.fetch(
            "SELECT child.relname FROM pg_inherits"
            " JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid"
            " JOIN pg_class AS parent ON parent.oid = pg_inherits.inhparent"
            " WHERE parent.relname IN ('job_history_done', 'job_history_dead')"
            " AND child.relname !~ '_default$'"
        )
        for (name,) in names:
            await connection.execute(f'DROP TABLE "{name}"')
        return len(names)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def autovacuum_on(base: str) -> AsyncIterator[None]:
    """Autovacuum on for the run: what the soak measures is what vacuum keeps of the hot
    table, and a server may have it off (a CI server's `autovacuum = off`). When it is off,
    `ALTER SYSTEM SET autovacuum = on` and a reload for the run, and `ALTER SYSTEM RESET
    autovacuum` and a reload after it (both printed)."""
    connection = await asyncpg.connect(base, database="postgres")
    was_off = False
    try:
        was_off = await connection.fetchval("SHOW autovacuum") == "off"
        if was_off:
            print("soak: autovacuum is off on this server; on for the run (ALTER SYSTEM)")
            await connection.execute("ALTER SYSTEM SET autovacuum = on")
            await connection.execute("SELECT pg_reload_conf()")
        yield
    finally:
        if was_off:
            await connection.execute("ALTER SYSTEM RESET autovacuum")
            await connection.execute("SELECT pg_reload_conf()")
            print("soak: autovacuum back to the server's setting (ALTER SYSTEM RESET)")
        await connection.close()


async def run_side(args: argparse.Namespace, side: str, root: Path) -> dict[str, Any]:
    """One side's soak: its services from `root`; returns its samples, events and summary."""
    base = ensure_postgres()
    redis_url = ensure_redis().rstrip("/") + "/15"
    url = await migrated_database(base, f"jobq_soak_{side}", root)
    dropped = await _narrow_partitions(url)
    if dropped:
        print(f"soak {side}: dropped the migration's {dropped} empty daily partitions")
    logs = ROOT / ".jobq" / "soak" / side
    logs.mkdir(parents=True, exist_ok=True)
    retention = str(args.retention)
    stack = LocalStack(
        url, redis_url, logs, workers=args.workers, producer_enabled=False,
        smtp_enabled=False, root=root,
        environment={
            "LOG_LEVEL": "WARNING",
            "QUEUE_RETENTION": retention,
            "QUEUE_DEAD_LETTER_RETENTION": retention,
            "QUEUE_RETENTION_INTERVAL": "10",
            "QUEUE_HISTORY_PARTITION": str(args.partition),
        },
    )  # fmt: skip
    await stack.start()
    counts = {"inserted": 0, "late": 0}
    events: list[dict[str, Any]] = []
    try:
        started = time.monotonic()
        until = started + args.minutes * 60
        print(f"soak {side}: {args.rate} jobs/s for {args.minutes} min ({root})", flush=True)
        stalls: list[dict[str, Any]] = []
        _, samples, _, _ = await asyncio.gather(
            _arrive(url, args.rate, until, counts),
            _sample(url, stack.queue, started, until, args.sample_seconds),
            _hold_snapshot(url, started + args.minutes * 60 / 2, args.snapshot_seconds, events),
            _watch(url, started, until, stalls),
        )
    finally:
        stack.stop()
    result = {"side": side, "services_from": str(root), "arrival": counts, "events": events}
    result["samples"] = samples
    result["stalls"] = stalls
    result["summary"] = summarise(samples, args.minutes) | {"stall_readings": len(stalls)}
    _show_stalls(side, stalls)
    print(f"soak {side}: {json.dumps(result['summary'])}", flush=True)
    return result


def _at(samples: list[dict[str, Any]], minute: float, key: str) -> float | None:
    """The sample value of `key` nearest to `minute` that has one."""
    have = [s for s in samples if s.get(key) is not None]
    if not have:
        return None
    return float(min(have, key=lambda s: abs(s["minute"] - minute))[key])


def _over(samples: list[dict[str, Any]], start: float, end: float, q: float) -> float | None:
    """The `q` quantile (ms) of every claim from minute `start` to `end`: the claim
    histogram's cumulative buckets (`claim_buckets`) at the last sample at or before `start`
    and at the last at or before `end`, so a minute's p99 is that of its claims (about 4,800
    at 1,000 jobs/s), not of one 10 s sample's 800; None without two such samples."""
    have = [s for s in samples if s.get("claim_buckets")]
    first = [s for s in have if s["minute"] <= start]
    last = [s for s in have if s["minute"] <= end]
    if not first or not last or last[-1] is first[-1]:
        return None
    start_reading, end_reading = (
        {float(le): n for le, n in s["claim_buckets"].items()} for s in (first[-1], last[-1])
    )
    return _ms(quantile(start_reading, end_reading, q))


def summarise(samples: list[dict[str, Any]], minutes: float) -> dict[str, Any]:
    """The issue's targets: hot-table bytes and claim p99 at the end over minute 5 (or the
    first fifth of a shorter run), the claim p99 also over every claim of the minute around
    each (`claim_p99_ms_*_minute`, from the histogram's buckets), WAL bytes per job (median),
    retention rows deleted."""
    early = min(5.0, minutes / 5)
    end = samples[-1]["minute"] if samples else minutes
    walls = sorted(s["wal_bytes_per_job"] for s in samples if s["wal_bytes_per_job"])
    size_early, size_end = _at(samples, early, "job_bytes"), _at(samples, end, "job_bytes")
    p99_early, p99_end = _at(samples, early, "claim_p99_ms"), _at(samples, end, "claim_p99_ms")
    minute_early = _over(samples, early - 0.5, early + 0.5, 0.99)
    minute_end = _over(samples, end - 1, end, 0.99)
    return {
        "early_minute": early,
        "job_bytes_early": size_early,
        "job_bytes_end": size_end,
        "job_bytes_ratio": round(size_end / size_early, 2) if size_early and size_end else None,
        "claim_p99_ms_early": p99_early,
        "claim_p99_ms_end": p99_end,
        "claim_p99_ratio": round(p99_end / p99_early, 2) if p99_early and p99_end else None,
        "claim_p99_ms_early_minute": minute_early,
        "claim_p99_ms_end_minute": minute_end,
        "claim_p99_minute_ratio": (
            round(minute_end / minute_early, 2) if minute_early and minute_end else None
        ),
        "wal_bytes_per_job_median": walls[len(walls) // 2] if walls else None,
        "retention_rows_deleted": sum(s["retention_rows_deleted"] for s in samples),
        "completed_per_s_mean": round(sum(s["completed_per_s"] for s in samples) / len(samples), 1)
        if samples
        else None,
    }


# A panel's second series, dashed beside its first.
_COMPANIONS = {
    "claim_p99_ms": "claim_p50_ms",
    "e2e_p99_ms": "e2e_p50_ms",
    "autovacuum_runs": "vacuum_runs",
    "job_bytes": "job_index_bytes",
    "partitions_created": "partitions_dropped",
}

_PANELS = (
    ("job_bytes", "hot table bytes (its indexes dashed)"),
    ("dead_tuples", "hot table dead tuples"),
    ("claim_p99_ms", "claim p99 (ms; p50 dashed)"),
    ("e2e_p99_ms", "submit→complete p99 (ms; p50 dashed)"),
    ("wal_bytes_per_job", "WAL bytes per job"),
    ("autovacuum_runs", "vacuums of job (autovacuum; the queue service's dashed)"),
    ("retention_rows_deleted", "rows retention deleted per sample"),
    ("history_bytes", "history bytes (all partitions)"),
    ("retention_pass_seconds", "seconds in retention passes per sample"),
    ("partitions_created", "history partitions created (dropped dashed), cumulative"),
)


def plot(document: dict[str, Any], path: Path) -> None:
    """One panel per sampled series, one line per side; the held snapshot shaded."""
    figure, axes = plt.subplots(5, 2, figsize=(13, 17), sharex=True)
    for (key, title), axis in zip(_PANELS, axes.flat, strict=True):
        for side in document["sides"]:
            minutes = [s["minute"] for s in side["samples"]]
            values = [s.get(key) for s in side["samples"]]
            (line,) = axis.plot(minutes, values, label=side["side"])
            if key in _COMPANIONS:
                axis.plot(
                    minutes, [s.get(_COMPANIONS[key]) for s in side["samples"]],
                    linestyle="--", color=line.get_color(),
                )  # fmt: skip
        middle = document["settings"]["minutes"] / 2
        axis.axvspan(middle, middle + document["settings"]["snapshot_seconds"] / 60, alpha=0.1)
        axis.set_title(title)
        axis.legend(loc="upper left")
    for axis in axes[-1]:
        axis.set_xlabel("minute (shaded: REPEATABLE READ snapshot held)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every side in turn; the document written."""
    async with autovacuum_on(ensure_postgres()):
        return await _run_sides(args)


async def _run_sides(args: argparse.Namespace) -> dict[str, Any]:
    roots = [("after", args.services_from.resolve())]
    if args.before:
        roots.insert(0, ("before", checkout(args.before)))
    sides = []
    for name, root in roots:
        side = await run_side(args, name, root)
        side["revision"] = head_revision(root)
        sides.append(side)
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    document = {
        "benchmark": "soak",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {
            "minutes": args.minutes,
            "rate": args.rate,
            "workers": args.workers,
            "retention_seconds": args.retention,
            "partition_seconds": args.partition,
            "snapshot_seconds": args.snapshot_seconds,
            "sample_seconds": args.sample_seconds,
            "before": args.before,
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "sides": sides,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"soak-{stamp}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    plot(document, path.with_suffix(".png"))
    print(f"wrote {path.relative_to(ROOT)} and {path.with_suffix('.png').name}", flush=True)
    return document


def main() -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="per side (default 30)")
    parser.add_argument("--rate", type=int, default=1000, help="jobs inserted per second")
    parser.add_argument("--workers", type=int, default=2, help="worker replicas")
    parser.add_argument("--retention", type=float, default=300.0, help="seconds (default 5 min)")
    parser.add_argument(
        "--partition", type=float, default=60.0, help="history partition width, seconds"
    )
    parser.add_argument("--snapshot-seconds", type=float, default=60.0)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--before", help="also run this earlier revision's services first")
    parser.add_argument(
        "--services-from", type=Path, default=ROOT, help="the checkout to soak (default this one)"
    )
    args = parser.parse_args()
    if args.minutes <= 0 or args.rate < 1 or args.workers < 1 or args.minutes > 240:
        parser.error("--minutes must be in (0, 240], --rate and --workers positive")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
