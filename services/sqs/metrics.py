"""Prometheus metrics of the SQS endpoint (docs/architecture.md#metrics), on the app's
registry; HTTP request metrics come from the shared middleware."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class SqsMetrics:
    """Every SQS endpoint metric of its own, on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.actions = Counter(
            "jobq_sqs_actions",
            "SQS actions answered, by action (`unknown` for names SQS does not have) and "
            "outcome (`ok` or the SQS error code).",
            ["action", "outcome"],
            registry=registry,
        )

    def count(self, action: str, outcome: str) -> None:
        """Count one answered action."""
        self.actions.labels(action, outcome).inc()
