"""CPU time and memory per process class, read with psutil, so a figure means the same on a
shared machine: CPU microseconds per job count only what the measured processes spent, not
what the neighbours did.

Classes are named groups of pids (`queue`, `workers`, `producer`, a peer's process, the
benchmark client) plus `postgres`: the server processes whose command line names the
benchmark's database (its backends and autovacuum workers) and the WAL writer of the same
cluster (shared with the server's other databases, so a busy neighbour inflates it slightly).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import psutil

POSTGRES = "postgres"


async def postmaster_pid(connection: asyncpg.Connection) -> int:
    """The pid of the PostgreSQL server `connection` talks to (its backend's parent). The
    server must run on this machine."""
    backend = psutil.Process(int(await connection.fetchval("SELECT pg_backend_pid()")))
    parent = backend.parent()
    if parent is None:
        raise RuntimeError("cannot find the PostgreSQL server process")
    return parent.pid


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


@dataclass
class _Seen:
    klass: str
    base: float
    last: float
    rss: int = 0


@dataclass
class ProcessMeter:
    """Samples CPU time and RSS of process classes every `interval` seconds on a thread.

    `fixed` maps a class name to its pids; `postmaster` and `database` add the `postgres`
    class (found again on every sample, so backends opened later count from their start);
    `exclude` names backends not to count (the benchmark's own observing connection).
    CPU counts from `start()` for processes alive then, from their birth for later ones; a
    process that exits keeps the CPU of its last sample. `stop()` returns the totals.
    """

    fixed: Mapping[str, Iterable[int]]
    postmaster: int | None = None
    database: str | None = None
    exclude: frozenset[int] = frozenset()
    interval: float = 0.5
    _seen: dict[int, _Seen] = field(default_factory=dict)
    _rss_peak: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _processes(self) -> list[tuple[str, psutil.Process]]:
        found: list[tuple[str, psutil.Process]] = []
        for klass, pids in self.fixed.items():
            for pid in pids:
                try:
                    found.append((klass, psutil.Process(pid)))
                except psutil.NoSuchProcess:
                    continue
        if self.postmaster is not None:
            try:
                children = psutil.Process(self.postmaster).children()
            except psutil.NoSuchProcess:
                children = []
            marker = f" {self.database} " if self.database else None
            for child in children:
                if child.pid in self.exclude:
                    continue
                try:
                    line = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                if "walwriter" in line or (marker is not None and marker in line):
                    found.append((POSTGRES, child))
        return found

    def _sample(self, first: bool = False) -> None:
        totals: dict[str, int] = {}
        for klass, process in self._processes():
            try:
                with process.oneshot():
                    cpu, rss = _cpu(process), int(process.memory_info().rss)
            except psutil.Error:
                continue
            seen = self._seen.get(process.pid)
            if seen is None:
                seen = self._seen[process.pid] = _Seen(klass, cpu if first else 0.0, cpu)
            seen.last, seen.rss = cpu, rss
            totals[klass] = totals.get(klass, 0) + rss
        for klass, rss in totals.items():
            self._rss_peak[klass] = max(self._rss_peak.get(klass, 0), rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> ProcessMeter:
        """Take the base sample and start sampling; returns self."""
        self._sample(first=True)
        self._thread = threading.Thread(target=self._run, name="process-meter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop sampling, take a last sample; `{class: {cpu_seconds, rss_peak_mb, rss_mb,
        processes}}` (RSS summed over the class's processes, MiB)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        result: dict[str, dict[str, Any]] = {}
        for seen in self._seen.values():
            entry = result.setdefault(
                seen.klass, {"cpu_seconds": 0.0, "rss_mb": 0.0, "processes": 0}
            )
            entry["cpu_seconds"] += seen.last - seen.base
            entry["rss_mb"] += seen.rss / 2**20
            entry["processes"] += 1
        for klass, entry in result.items():
            entry["cpu_seconds"] = round(entry["cpu_seconds"], 3)
            entry["rss_mb"] = round(entry["rss_mb"], 1)
            entry["rss_peak_mb"] = round(self._rss_peak.get(klass, 0) / 2**20, 1)
        return result


def cpu_per_job_us(usage: Mapping[str, Mapping[str, Any]], jobs: int) -> dict[str, float]:
    """CPU microseconds per job for each class of a `ProcessMeter.stop()` result, plus
    `total`; empty when `jobs` is 0."""
    if jobs <= 0:
        return {}
    per_job = {k: round(v["cpu_seconds"] / jobs * 1e6, 1) for k, v in usage.items()}
    per_job["total"] = round(sum(per_job.values()), 1)
    return per_job


def cpu_per_request(usage: dict[str, dict[str, Any]], accepted: int) -> dict[str, float]:
    """CPU microseconds per accepted request by process class (`ProcessMeter.stop()` totals),
    plus `server_total` over every class but the load generator's (`client`); empty when
    nothing was accepted."""
    per = cpu_per_job_us(usage, accepted)
    if per:
        per["server_total"] = round(per.pop("total") - per.get("client", 0.0), 1)
    return per
