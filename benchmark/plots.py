"""PNG plots of a suite result (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from benchmark.report import median_cpu_round


def _save(figure: Figure, directory: Path, name: str) -> str:
    figure.tight_layout()
    figure.savefig(directory / name, dpi=110)
    plt.close(figure)
    return name


def burndown(document: dict[str, Any], directory: Path, name: str) -> str:
    """Jobs/s of jobq's default shape, the matrix and the peers, with the target (pgqueuer
    batch 100's rate, when it ran), and CPU µs per job by process class beside it (each
    burn-down's round of median CPU, as the table reads it; the matrix has one round)."""
    results = document["results"]
    rounds = results["burn_rounds"]
    labels = [f"jobq {document['settings']['default_shape']}"]
    values = [rounds["jobq"]["jobs_per_s"]]
    cpu = [median_cpu_round(rounds["jobq"]["rounds"])]
    for entry in results["matrix"]:
        labels.append(f"jobq {entry['shape']}")
        values.append(entry["jobs_per_s"])
        cpu.append(entry["cpu_us_per_job"])
    for peer, entry in rounds.items():
        if peer != "jobq":
            labels.append(peer)
            values.append(entry["jobs_per_s"])
            cpu.append(median_cpu_round(entry["rounds"]))
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    colours = ["#4a7ebb" if label.startswith("jobq") else "#999999" for label in labels]
    left.barh(labels, values, color=colours)
    target = rounds.get("pgqueuer_b100", {}).get("jobs_per_s")
    if target:
        left.axvline(target, color="#d62728", linestyle="--", label="target: 1.0x pgqueuer b100")
        left.legend(loc="lower right")
    left.set_xlabel("jobs/s (burn-down window from the database)")
    left.invert_yaxis()
    left.set_title("Burn-down of no-op jobs")
    classes = sorted({k for entry in cpu for k in entry if k != "total"})
    offsets = [0.0] * len(labels)
    for klass in classes:
        widths = [entry.get(klass, 0.0) for entry in cpu]
        right.barh(labels, widths, left=offsets, label=klass)
        offsets = [o + w for o, w in zip(offsets, widths, strict=True)]
    right.set_xlabel("CPU µs per job")
    right.invert_yaxis()
    right.legend(loc="lower right")
    right.set_title("Where the CPU goes")
    return _save(figure, directory, name)


def ingest(document: dict[str, Any], directory: Path, name: str) -> str:
    """p95 and p99 accept latency against the offered rate, per target (every round)."""
    figure, axis = plt.subplots(figsize=(9, 5))
    for target, entry in document["results"]["ingest"].items():
        for index, run in enumerate(entry["rounds"]):
            rates = [s["rate"] for s in run["steps"]]
            p95 = [max(s["p95_ms"], 0.1) for s in run["steps"]]
            axis.plot(rates, p95, marker="o", label=f"{target} p95" if index == 0 else None,
                      color={"producer": "#4a7ebb", "queue": "#2ca02c"}.get(target, "#999999"),
                      alpha=0.8)  # fmt: skip
    axis.axhline(50, color="#d62728", linestyle="--", label="p95 limit 50 ms")
    axis.set_yscale("log")
    axis.set_xlabel("offered rate, single POST /jobs per second (open loop, k6)")
    axis.set_ylabel("accept latency p95, ms")
    axis.set_title("Ingest steps (a step with errors or dropped arrivals fails too)")
    axis.legend()
    return _save(figure, directory, name)


def claims(document: dict[str, Any], directory: Path, name: str) -> str:
    """Claim latency per second during a burn-down with a held REPEATABLE READ snapshot."""
    held = document["results"]["claims"]["rr_hold"]
    series = held["series"]
    figure, axis = plt.subplots(figsize=(9, 5))
    seconds = [row[0] for row in series]
    axis.plot(seconds, [row[2] for row in series], label="p99", color="#d62728")
    axis.plot(seconds, [row[1] for row in series], label="p50", color="#4a7ebb")
    axis.axvspan(held["lead_s"], held["lead_s"] + held["hold_s"], color="#ffcc00", alpha=0.25,
                 label="REPEATABLE READ snapshot held")  # fmt: skip
    axis.set_xlabel("seconds into the burn-down")
    axis.set_ylabel("claim of 10 (repository), ms")
    axis.set_title("Claim latency while a snapshot holds back vacuum")
    axis.legend()
    return _save(figure, directory, name)


def write_all(document: dict[str, Any], directory: Path, stem: str) -> list[str]:
    """Write every plot as `<stem>-<what>.png` in `directory`; their file names."""
    return [
        burndown(document, directory, f"{stem}-burndown.png"),
        ingest(document, directory, f"{stem}-ingest.png"),
        claims(document, directory, f"{stem}-claims.png"),
    ]
