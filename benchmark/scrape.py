"""Reading a jobq service's `/metrics` text (Prometheus exposition format) in benchmarks."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_total(text: str, family: str, sample: str, **labels: str) -> float:
    """The sum of the samples named `sample` (`jobq_processed_total`,
    `jobq_claim_duration_seconds_sum`, …) of metric family `family` whose labels include
    `labels`; 0.0 when there is none."""
    total = 0.0
    for metrics in text_string_to_metric_families(text):
        if metrics.name != family:
            continue
        for each in metrics.samples:
            if each.name == sample and all(each.labels.get(k) == v for k, v in labels.items()):
                total += each.value
    return total
