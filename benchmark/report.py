"""The figures the issue asks for, each beside its target and its ratios, and the results
table in benchmark/README.md (between the `results:begin`/`results:end` markers)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from statistics import linear_regression, median_high
from typing import Any

README = Path(__file__).parent / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return round(value / reference, 2)


def _row(
    figure: str,
    value: float | str | None,
    unit: str,
    target: str = "",
    met: bool | None = None,
    pgqueuer: float | None = None,
    bare: float | None = None,
) -> dict[str, Any]:
    return {
        "figure": figure,
        "value": value,
        "unit": unit,
        "target": target,
        "met": met,
        "x_pgqueuer_b100": pgqueuer,
        "x_bare": bare,
    }


def median_cpu_round(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """The CPU µs per job by process class (`cpu_us_per_job`) of the round whose total is the
    (high) median of the rounds' ({} when no round has one)."""
    measured = [r["cpu_us_per_job"] for r in rounds if r.get("cpu_us_per_job", {}).get("total")]
    if not measured:
        return {}
    total = median_high([cpu["total"] for cpu in measured])
    return next(cpu for cpu in measured if cpu["total"] == total)


def _median_cpu(rounds: list[dict[str, Any]]) -> float | None:
    """The (high) median of the rounds' total CPU µs per job (None when no round has it)."""
    return median_cpu_round(rounds).get("total")


def _median_wal(rounds: list[dict[str, Any]]) -> float | None:
    """The (high) median of the rounds' `wal_bytes_per_job` (None when no round has it)."""
    values = [r["wal_bytes_per_job"] for r in rounds if r.get("wal_bytes_per_job")]
    return median_high(values) if values else None


BURN_RATIO_TARGET = 1.0
"""Issue 17: the project's worker at default settings drains a backlog of `noop` jobs at
least as fast as pgqueuer with batch 100, the fastest peer measured."""
PROCRASTINATE_TARGET = 20.0
"""Issue 17: and at least this many times procrastinate's rate (concurrency 10)."""
CPU_PER_JOB_TARGET = 120.0
"""Issue 17: CPU µs per job across every process (services, workers, PostgreSQL)."""
PRODUCER_CPU_TARGET = 400.0
"""Issue 17: the producer's CPU µs per accepted submit at 800 submits/s."""


def _per_round(rounds: dict[str, Any], name: str) -> str | None:
    """jobq's rate over `name`'s, round by round (the two ran side by side in each round), as
    "a / b / c (median m)", or None when either has no rounds. The target is read off the
    medians' ratio; this shows how far the machine moved it between rounds."""
    ours = [r.get("jobs_per_s") for r in rounds["jobq"]["rounds"]]
    theirs = [r.get("jobs_per_s") for r in rounds.get(name, {}).get("rounds", [])]
    if not ours or len(ours) != len(theirs) or not all(ours) or not all(theirs):
        return None
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return " / ".join(f"{r:.2f}" for r in ratios) + f" (median {median_high(ratios):.2f})"


def _burn_rows(results: dict[str, Any], shape: str) -> list[dict[str, Any]]:
    rounds = results["burn_rounds"]
    jobq = rounds["jobq"]["jobs_per_s"]
    pgq = rounds.get("pgqueuer_b100", {}).get("jobs_per_s")
    procrastinate = rounds.get("procrastinate_c10", {}).get("jobs_per_s")
    share = _ratio(jobq, pgq)
    rows = [
        _row(
            f"Burn-down, project worker, default settings ({shape}), median",
            jobq,
            "jobs/s",
            f">= {BURN_RATIO_TARGET}x pgqueuer b100",
            None if not pgq else jobq >= BURN_RATIO_TARGET * pgq,
            share,
        )
    ]
    per_round = _per_round(rounds, "pgqueuer_b100")
    if per_round:
        rows.append(_row("Burn-down, jobq / pgqueuer b100, round by round", per_round, ""))
    if procrastinate:
        times = _ratio(jobq, procrastinate)
        rows.append(
            _row("Burn-down, jobq defaults / procrastinate", times, "x",
                 f">= {PROCRASTINATE_TARGET:g}x", jobq >= PROCRASTINATE_TARGET * procrastinate)
        )  # fmt: skip
    if results["matrix"]:
        best = max(results["matrix"], key=lambda r: r["jobs_per_s"])
        rows.append(
            _row(f"Burn-down, best matrix shape ({best['shape']})", best["jobs_per_s"],
                 "jobs/s", pgqueuer=_ratio(best["jobs_per_s"], pgq))
        )  # fmt: skip
    # CPU per job: the median over rounds, as for the rates (one round in a slow moment of
    # the machine reads half as much again, for the peers as for jobq).
    cpu = _median_cpu(rounds["jobq"]["rounds"])
    rows.append(
        _row("CPU per job, defaults (all classes, median of rounds)", cpu, "µs",
             f"<= {CPU_PER_JOB_TARGET:g} µs", None if cpu is None else cpu <= CPU_PER_JOB_TARGET)
    )  # fmt: skip
    if "pgqueuer_b100" in rounds:
        cpu = _median_cpu(rounds["pgqueuer_b100"]["rounds"])
        rows.append(_row("CPU per job, pgqueuer b100 (its process and PostgreSQL, median of "
                         "rounds)", cpu, "µs"))  # fmt: skip
    # WAL per job: PostgreSQL's work, in a figure the machine's speed does not move.
    wal = {name: _median_wal(rounds[name]["rounds"]) for name in ("jobq", "pgqueuer_b100")
           if name in rounds}  # fmt: skip
    if wal.get("jobq") is not None:
        rows.append(_row("WAL per job, defaults, median", wal["jobq"], "bytes",
                         pgqueuer=_ratio(wal["jobq"], wal.get("pgqueuer_b100"))))  # fmt: skip
    if wal.get("pgqueuer_b100") is not None:
        rows.append(_row("WAL per job, pgqueuer b100, median", wal["pgqueuer_b100"], "bytes",
                         pgqueuer=1.0))  # fmt: skip
    for name, label in (("pgqueuer_b100", "pgqueuer, batch 100"),
                        ("pgqueuer_b10", "pgqueuer, batch 10"),
                        ("procrastinate_c10", "procrastinate, concurrency 10")):  # fmt: skip
        if name in rounds:
            value = rounds[name]["jobs_per_s"]
            rows.append(_row(f"Burn-down, {label}, median", value, "jobs/s",
                             pgqueuer=_ratio(value, pgq)))  # fmt: skip
    return rows


def _ceiling_rows(results: dict[str, Any], pgq: float | None) -> list[dict[str, Any]]:
    rows = []
    for raw in results["raw"]:
        rows.append(
            _row(f"Queue service alone, raw client, {raw['loops']} loop(s)", raw["jobs_per_s"],
                 "jobs/s", pgqueuer=_ratio(raw["jobs_per_s"], pgq))
        )  # fmt: skip
    bench = results["pgbench"]
    rows.append(
        _row(f"pgbench claim+ack, {bench['clients']} clients, batch {bench['batch']}",
             bench["jobs_per_s"], "jobs/s", pgqueuer=_ratio(bench["jobs_per_s"], pgq))
    )  # fmt: skip
    kill = results["kill"]["verified"]
    twice = results["kill"]["by_attempts"].get("2", 0)
    rows.append(
        _row(f"kill -9 of a worker mid-run: jobs COMPLETED exactly once ({twice} on a 2nd "
             "attempt)", kill["completed"], "jobs", f"all {kill['expected']:,}", kill["ok"])
    )  # fmt: skip
    return rows


BARE_RATIO_TARGET = 0.85
"""Issue 17: single submits through the producer reach at least this share of the bare
one-hop endpoint's throughput, in the open loop (the knee) and in the closed loop."""


def _against_bare(name: str, ratio: float | None, condition: str = "") -> tuple[str, bool | None]:
    """The target and whether it is met, for the producer's row of an ingest figure whose
    ratio to the bare endpoint is `ratio` (None: no bare endpoint in the run, so no target)."""
    if name != "producer" or ratio is None:
        return "", None
    return f">= {BARE_RATIO_TARGET}x the bare endpoint{condition}", ratio >= BARE_RATIO_TARGET


def _ingest_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    ingest = results["ingest"]
    bare = ingest.get("bare", {}).get("knee_per_s")
    rows = []
    labels = {"producer": "producer (two hops)", "queue": "queue service (one hop)",
              "bare": "bare Litestar + asyncpg endpoint"}  # fmt: skip
    for name, entry in ingest.items():
        knee = entry["knee_per_s"]
        ratio = _ratio(knee, bare)
        target, met = _against_bare(name, ratio, ", p95 < 50 ms, no errors")
        rows.append(
            _row(f"Ingest knee, single submits, {labels[name]}", knee, "req/s", target, met,
                 bare=ratio)
        )  # fmt: skip
    closed_bare = ingest.get("bare", {}).get("closed_per_s")
    for name, entry in ingest.items():
        closed = entry.get("closed_per_s")
        if closed is None:
            continue
        ratio = _ratio(closed, closed_bare)
        vus = entry["rounds"][0]["closed"]["vus"]
        target, met = _against_bare(name, ratio)
        rows.append(
            _row(f"Closed loop, {vus} connections, {labels[name]}", closed,
                 "req/s", target, met, bare=ratio)
        )  # fmt: skip
    p95 = _at_800(ingest.get("producer", {}), lambda step: step.get("p95_ms"))
    if p95 is not None:
        rows.append(_row("Ingest at 800/s through the producer, p95", p95, "ms", "< 25 ms",
                         p95 < 25))  # fmt: skip
    rows.extend(_cpu_per_submit_rows(ingest.get("producer", {}), ingest.get("bare")))
    return rows


def _at_800(target: dict[str, Any], read: Callable[[dict[str, Any]], float | None]) -> float | None:
    """The (high) median over rounds of what `read` takes from the 800/s step of ingest
    `target` (None where a step lacks it); None without such a figure."""
    values = [
        value
        for run in target.get("rounds", [])
        for step in run["steps"]
        if step["rate"] == 800 and (value := read(step)) is not None
    ]
    return median_high(values) if values else None


def _cpu_at_800(target: dict[str, Any], name: str) -> float | None:
    """Process `name`'s CPU µs per request at the 800/s step of ingest `target` (`_at_800`)."""
    return _at_800(target, lambda step: step.get("cpu_us_per_request", {}).get(name))


def _cpu_per_submit_rows(
    producer: dict[str, Any], bare: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """CPU µs per accepted submit by process at the 800/s step through the producer, the
    (high) median over rounds: the producer's against its target and against the bare
    endpoint's CPU per request at the same step (a ratio this host's changing speed moves
    less than the figure), the queue service's and PostgreSQL's beside it."""
    bare_cpu = _cpu_at_800(bare or {}, "bare")
    rows = []
    for name, label in (("producer", "producer"), ("queue", "queue service"),
                        ("postgres", "PostgreSQL")):  # fmt: skip
        value = _cpu_at_800(producer, name)
        if value is None:
            continue
        target, met, ratio = "", None, None
        if name == "producer":
            target, met = f"<= {PRODUCER_CPU_TARGET:g} µs", value <= PRODUCER_CPU_TARGET
            ratio = _ratio(value, bare_cpu)
        rows.append(_row(f"CPU per submit at 800/s through the producer, {label}", value,
                         "µs", target, met, bare=ratio))  # fmt: skip
    if bare_cpu is not None and rows:
        rows.append(_row("CPU per request at 800/s, bare Litestar + asyncpg endpoint",
                         bare_cpu, "µs", bare=1.0))  # fmt: skip
    return rows


def _latency_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    pickup = results["pickup"]
    claimed, completed = pickup["created_to_claimed"], pickup["created_to_completed"]
    rows = [
        _row("Pickup, created -> claimed, p50", claimed["p50_ms"], "ms", "< 10 ms",
             claimed["p50_ms"] < 10),
        _row("Pickup, created -> claimed, p99", claimed["p99_ms"], "ms", "< 50 ms",
             claimed["p99_ms"] < 50),
        _row("Pickup, created -> completed, p50 / p99",
             completed["p50_ms"], "ms", f"(p99 {completed['p99_ms']} ms)"),
    ]  # fmt: skip
    for step in results.get("latency_under_load", {}).get("steps", []):
        if step["fraction"] == 0.5 and step["submit_to_completed"]["count"]:
            p99 = step["submit_to_completed"]["p99_ms"]
            rounds = len(_rounds(step))
            of = f", median of {rounds} rounds" if rounds > 1 else ""
            rows.append(_row(f"Submit -> COMPLETED at 50 % of the knee ({step['rate']}/s), p99{of}",
                             p99, "ms", "< 25 ms", p99 < 25))  # fmt: skip
    cases = results["claims"]["cases"]
    for name, label in (("empty", "empty table"), ("completed_1m", "1,000,000 COMPLETED"),
                        ("scheduled_100k", "100,000 SCHEDULED")):  # fmt: skip
        if name in cases:
            rows.append(_row(f"Claim of 10, p99, {label}", cases[name]["p99_ms"], "ms"))
    ratio = results["claims"].get("p99_ratio_1m_to_empty")
    if ratio is not None:
        rows.append(_row("Claim p99, 1M COMPLETED / empty", ratio, "x", "<= 1.5x", ratio <= 1.5))
    held = results["claims"]["rr_hold"]
    rows.append(
        _row(f"Claim p99, last {min(10, held['hold_s']):g} s of a {held['hold_s']:g} s "
             "REPEATABLE READ snapshot",
             held["during_last_10s"]["p99_ms"], "ms", f"(before: {held['before']['p99_ms']} ms)")
    )  # fmt: skip
    return rows


def summary(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Every headline figure as `{figure, value, unit, target, met, x_pgqueuer_b100, x_bare}`
    (`met` None where no target applies, ratios None where no reference was measured)."""
    results = document["results"]
    pgq = results["burn_rounds"].get("pgqueuer_b100", {}).get("jobs_per_s")
    return [
        *_burn_rows(results, document["settings"]["default_shape"]),
        *_ceiling_rows(results, pgq),
        *_ingest_rows(results),
        *_latency_rows(results),
    ]


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 or value.is_integer() else f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(document: dict[str, Any], path: Path) -> str:
    """The Markdown the README shows for `document` (written to `path`)."""
    machine, load = document["machine"], document["load_average"]
    lines = [
        f"Run `{document['command']}` ({document['name']} preset), {document['started']}, "
        f"{document['elapsed_s'] // 60} min; {machine['cpus']} CPUs, PostgreSQL "
        f"{machine['postgres']}, Python {machine['python']}, k6 {machine['k6']}; load average "
        f"{load['start'][0]} at start, {load['end'][0]} at the end. Result: "
        f"[`{path.name}`](results/{path.name}).",
        "",
        "| figure | measured | target | met | ratio to pgqueuer b100 | ratio to bare endpoint |",
        "|---|---|---|---|---|---|",
    ]
    for row in document["summary"]:
        value = f"{_cell(row['value'])} {row['unit']}".rstrip()
        lines.append(
            f"| {row['figure']} | {value} | {row['target'] or '—'} | {_cell(row['met'])} | "
            f"{_cell(row['x_pgqueuer_b100'])} | {_cell(row['x_bare'])} |"
        )
    lines += ["", *_matrix_table(document), "", *_claim_split_table(document)]
    lines += [*_resources_table(document), ""]
    lines += [*_latency_table(document), ""]
    lines += [f"![{name}](results/{name})" for name in document.get("plots", [])]
    return "\n".join(lines)


def _matrix_table(document: dict[str, Any]) -> list[str]:
    matrix = document["results"]["matrix"]
    if not matrix:
        return []
    lines = [
        "Burn-down matrix (one round each; CPU µs per job by process class):",
        "",
        "| replicas x slots | jobs/s | queue | workers | postgres | total |",
        "|---|---|---|---|---|---|",
    ]
    for r in matrix:
        cpu = r["cpu_us_per_job"]
        lines.append(
            f"| {r['shape']} | {_cell(r['jobs_per_s'])} | {_cell(cpu.get('queue'))} | "
            f"{_cell(cpu.get('workers'))} | {_cell(cpu.get('postgres'))} | "
            f"{_cell(cpu.get('total'))} |"
        )
    return lines


def claim_split(matrix: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """A least-squares fit of the matrix's CPU per job against 1/slots, by process class:
    `{class: (µs per claim, µs per job)}`, from `cpu = per_claim / slots + per_job` (a claim
    of a deep backlog takes as many jobs as the worker has slots). Classes missing from a
    shape are left out; {} with fewer than two distinct slot counts."""
    split: dict[str, tuple[float, float]] = {}
    for klass in dict.fromkeys(k for r in matrix for k in r["cpu_us_per_job"]):
        points = [
            (1 / r["slots"], r["cpu_us_per_job"][klass])
            for r in matrix
            if r["cpu_us_per_job"].get(klass) is not None
        ]
        if len({x for x, _ in points}) < 2:  # no line through one slot count
            continue
        slope, intercept = linear_regression([x for x, _ in points], [y for _, y in points])
        split[klass] = (slope, intercept)
    return split


def _claim_split_table(document: dict[str, Any]) -> list[str]:
    split = claim_split(document["results"]["matrix"])
    if "total" not in split:
        return []
    # The run's own default shape (`<replicas>x<slots>`), not today's: a run re-rendered later
    # keeps the slots it was measured at.
    slots = int(document["settings"]["default_shape"].split("x")[1])
    lines = [
        "CPU per claim and per job, by process class (a least-squares fit of the matrix above: "
        f"CPU per job = per claim / slots + per job; at the default {slots} slots a claim's "
        f"part of each job is per claim / {slots}):",
        "",
        f"| process | per claim (µs) | per job (µs) | at {slots} slots: the claim's part "
        "(µs per job) |",
        "|---|---|---|---|",
    ]
    for klass, (per_claim, per_job) in split.items():
        lines.append(
            f"| {klass} | {_cell(round(per_claim))} | {_cell(round(per_job, 1))} | "
            f"{_cell(round(per_claim / slots, 1))} |"
        )
    return [*lines, ""]


def _resources_table(document: dict[str, Any]) -> list[str]:
    res = document["results"]["resources"]
    idle, load = res["idle"]["classes"], res["load"]["classes"]
    rate = res["load"]["step"]["rate"]
    lines = [
        f"Processes idle and under load ({rate} submits/s through the producer, workers "
        "running them); CPU in % of one core, RSS summed per class:",
        "",
        "| process | CPU idle | CPU load | RSS idle (MiB) | RSS load (MiB) |",
        "|---|---|---|---|---|",
    ]
    for klass in sorted(set(idle) | set(load)):
        i, loaded = idle.get(klass, {}), load.get(klass, {})
        lines.append(
            f"| {klass} | {_cell(i.get('cpu_percent'))} | {_cell(loaded.get('cpu_percent'))} | "
            f"{_cell(i.get('rss_mb'))} | {_cell(loaded.get('rss_mb'))} |"
        )
    return lines


def _rounds(step: dict[str, Any]) -> list[dict[str, Any]]:
    """A latency step's rounds; a run from before the rounds (one step per rate) is its own."""
    rounds: list[dict[str, Any]] = step.get("rounds", [step])
    return rounds


def _latency_table(document: dict[str, Any]) -> list[str]:
    latency = document["results"].get("latency_under_load")
    if not latency:
        return []
    rounds = max(len(_rounds(step)) for step in latency["steps"])
    how = (
        f"medians of {rounds} rounds (each round's p99 in brackets), max of all"
        if rounds > 1
        else "one round"
    )
    lines = [
        f"Latency under load: submits through the producer at fractions of its knee "
        f"({_cell(latency['knee_per_s'])}/s), 2 workers running them; submit → COMPLETED by the "
        f"database's clock, {how}:",
        "",
        "| rate | of the knee | submit p95 (ms) | to COMPLETED p50 | p95 | p99 | max | all done |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for step in latency["steps"]:
        done = step["submit_to_completed"]
        p99 = _cell(done["p99_ms"])
        if len(_rounds(step)) > 1:
            each = " / ".join(_cell(r["submit_to_completed"]["p99_ms"]) for r in _rounds(step))
            p99 = f"{p99} ({each})"
        lines.append(
            f"| {step['rate']}/s | {step['fraction']:.0%} | {_cell(step['submit_p95_ms'])} | "
            f"{_cell(done['p50_ms'])} | {_cell(done['p95_ms'])} | {p99} | "
            f"{_cell(done['max_ms'])} | {_cell(step['verified']['ok'])} |"
        )
    return lines


def update_readme(document: dict[str, Any], path: Path) -> None:
    """Replace the table between the markers in benchmark/README.md. RuntimeError when the
    markers are missing."""
    text = README.read_text()
    head, found, rest = text.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise RuntimeError(f"{README} lacks the {BEGIN} … {END} markers")
    README.write_text(f"{head}{BEGIN}\n{table(document, path)}\n{END}{tail}")
