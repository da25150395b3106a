"""Prometheus metrics of a worker replica (docs/architecture.md#metrics)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from common.metrics import BoundedLabel

_JOB_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class WorkerMetrics:
    """Every worker metric, on `registry`."""

    def __init__(self, registry: CollectorRegistry, slots: int) -> None:
        self.task_label = BoundedLabel(limit=0)
        """Task types with a label of their own: those of the worker's processors (the `Worker`
        keeps them); any other task type, which the worker dead-letters unrun, is "other"."""
        self.job_duration = Histogram(
            "jobq_worker_job_duration_seconds",
            "Processor run time by task type and outcome"
            " (success|retry|dead_letter|cancelled|released).",
            ["task_type", "outcome"],
            buckets=_JOB_BUCKETS,
            registry=registry,
        )
        self._durations: dict[tuple[str, str], Any] = {}
        self.claim_to_settle = Histogram(
            "jobq_worker_claim_to_settle_seconds",
            "Claim received to the settle confirmed committed by the queue service.",
            buckets=_JOB_BUCKETS,
            registry=registry,
        )
        self.active_jobs = Gauge(
            "jobq_worker_active_jobs", "Jobs this worker is running now.", registry=registry
        )
        self.slots = Gauge(
            "jobq_worker_slots", "Jobs this worker may run at once.", registry=registry
        )
        self.slots.set(slots)
        self.lost_leases = Counter(
            "jobq_worker_lost_leases",
            "Results discarded because the lease was lost (another worker owns the job).",
            registry=registry,
        )

    def observe_duration(self, task_label: str, outcome: str, seconds: float) -> None:
        """Observe one run of `seconds` in `jobq_worker_job_duration_seconds`, its series
        looked up once per (task label, outcome) for the worker's life (labels are bounded)."""
        series = self._durations.get((task_label, outcome))
        if series is None:
            series = self._durations[(task_label, outcome)] = self.job_duration.labels(
                task_label, outcome
            )
        series.observe(seconds)
