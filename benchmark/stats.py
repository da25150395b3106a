"""Small statistics helpers shared by the benchmarks (no numpy needed for these)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The `q` quantile (0..1) of `values` by linear interpolation between closest ranks (the
    "type 7" definition numpy and spreadsheets use). ValueError on an empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency_summary(values_ms: Sequence[float]) -> dict[str, float]:
    """`{count, p50_ms, p95_ms, p99_ms, max_ms}` of latencies in milliseconds (rounded to
    0.01 ms); every figure is 0 for an empty sequence, with count 0."""
    if not values_ms:
        return {"count": 0, "p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    return {
        "count": len(values_ms),
        "p50_ms": round(percentile(values_ms, 0.50), 2),
        "p95_ms": round(percentile(values_ms, 0.95), 2),
        "p99_ms": round(percentile(values_ms, 0.99), 2),
        "max_ms": round(max(values_ms), 2),
    }


def median(values: Sequence[float]) -> float:
    """The median of `values` (the middle of three rounds). ValueError on an empty sequence."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))
