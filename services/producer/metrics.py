"""Prometheus metrics of the producer (docs/architecture.md#metrics), on the app's registry;
HTTP request metrics come from Litestar's Prometheus middleware."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from common.metrics import BoundedLabel


class ProducerMetrics:
    """Every producer metric of its own, on `registry`."""

    def __init__(self, registry: CollectorRegistry, label_limit: int = 100) -> None:
        self.registry = registry
        self.tenant_label = BoundedLabel(label_limit)
        self.rate_limited = Counter(
            "jobq_rate_limited",
            "Requests refused with 429, by tenant (anonymous: no known key) and by limit "
            "(requests and jobs: PRODUCER_RATE_LIMIT; email: SMTP_TENANT_RATE).",
            ["tenant", "limit"],
            registry=registry,
        )

    def count_rate_limited(self, tenant: str, limit: str) -> None:
        """Count one 429 for `tenant` under `limit` (`requests`, `jobs` or `email`)."""
        self.rate_limited.labels(self.tenant_label(tenant), limit).inc()
