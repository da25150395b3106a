"""Prometheus metrics of the queue service (DESIGN.md §6), on a registry owned by the app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from common.contracts import JobStatus
from common.metrics import BoundedLabel
from services.queue.repository import DepthRow

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_END_TO_END_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100)


class QueueMetrics:
    """Every queue-service metric; one instance per app, registered on `registry`."""

    def __init__(
        self, registry: CollectorRegistry, label_limit: int = 100, depth_cache: bool = True
    ) -> None:
        """`depth_cache` says whether a Redis depth cache is configured; without one the
        cache-write gauge is not exported, so its staleness alert cannot fire."""
        self.registry = registry
        self.queue_label = BoundedLabel(label_limit)
        self.task_label = BoundedLabel(label_limit)
        self.jobs = Gauge(
            "jobq_jobs",
            "Jobs per queue and status, from the database.",
            ["queue", "status"],
            registry=registry,
        )
        self.oldest_pending_age = Gauge(
            "jobq_oldest_pending_age_seconds",
            "Age of the oldest PENDING job, from the database.",
            ["queue"],
            registry=registry,
        )
        self.enqueued = Counter(
            "jobq_enqueued", "Jobs created.", ["queue", "task_type"], registry=registry
        )
        self.processed = Counter(
            "jobq_processed",
            "Settled attempts by outcome (success|retry|dead_letter|cancelled).",
            ["queue", "task_type", "outcome"],
            registry=registry,
        )
        self.lease_expired = Counter(
            "jobq_lease_expired", "Leases the reaper found expired.", ["queue"], registry=registry
        )
        self.claim_duration = Histogram(
            "jobq_claim_duration_seconds",
            "Time of one claim statement.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.claim_batch_size = Histogram(
            "jobq_claim_batch_size",
            "Jobs handed out per non-empty claim.",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.empty_claims = Counter(
            "jobq_empty_claims",
            "Claims that returned no job (after any long poll).",
            registry=registry,
        )
        self.end_to_end = Histogram(
            "jobq_end_to_end_seconds",
            "Submit to COMPLETED, per queue and task type.",
            ["queue", "task_type"],
            buckets=_END_TO_END_BUCKETS,
            registry=registry,
        )

        self.released = Counter(
            "jobq_released",
            "Leases given back early with a heartbeat of 0 (worker shutdown, SQS visibility 0).",
            registry=registry,
        )
        self.depth_refreshed = Gauge(
            "jobq_depth_refresh_timestamp_seconds",
            "Unix time of the last depth read from PostgreSQL (the jobq_jobs gauges).",
            registry=registry,
        )
        self.depth_cache_written: Gauge | None = None
        if depth_cache:
            self.depth_cache_written = Gauge(
                "jobq_depth_cache_write_timestamp_seconds",
                "Unix time of the last depth snapshot written to the Redis cache.",
                registry=registry,
            )

    def observe_depth(self, rows: list[DepthRow]) -> None:
        """Publish a fresh depth snapshot; queues that emptied report 0, not a stale value."""
        seen: set[tuple[str, str]] = set()
        oldest: dict[str, float] = {}
        for row in rows:
            queue = self.queue_label(row.queue)
            self.jobs.labels(queue, row.status.value).set(row.count)
            seen.add((queue, row.status.value))
            if row.status is JobStatus.PENDING:
                oldest[queue] = max(oldest.get(queue, 0.0), row.oldest_age_seconds)
        for sample in [s for metric in self.jobs.collect() for s in metric.samples]:
            key = (sample.labels["queue"], sample.labels["status"])
            if key not in seen:
                self.jobs.labels(*key).set(0)
        for queue in {q for q, _ in seen} | set(oldest):
            self.oldest_pending_age.labels(queue).set(oldest.get(queue, 0.0))
