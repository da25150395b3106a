"""The soak benchmark's arithmetic (quantiles from histogram deltas, the summary) and its plot."""

from __future__ import annotations

import math
from pathlib import Path

from benchmark.soak import plot, quantile, summarise


def test_quantiles_come_from_the_observations_between_two_readings() -> None:
    before = {0.01: 10.0, 0.1: 10.0, 1.0: 10.0, math.inf: 10.0}
    # 100 new observations: 50 up to 10 ms, 40 more up to 100 ms, 10 more up to 1 s.
    after = {0.01: 60.0, 0.1: 100.0, 1.0: 110.0, math.inf: 110.0}
    assert quantile(before, after, 0.5) == 0.01
    median_of_second = quantile(before, after, 0.7)
    assert median_of_second is not None and 0.01 < median_of_second < 0.1
    p99 = quantile(before, after, 0.99)
    assert p99 is not None and 0.1 < p99 <= 1.0
    assert quantile(after, after, 0.5) is None


def test_the_summary_compares_the_end_with_minute_five() -> None:
    samples = [
        {
            "minute": m,
            "job_bytes": 1000 + 10 * m,
            "claim_p99_ms": 2.0 if m < 20 else 3.0,
            "wal_bytes_per_job": 900 + m,
            "retention_rows_deleted": 0,
            "completed_per_s": 1000.0,
        }
        for m in range(1, 31)
    ]
    summary = summarise(samples, 30)
    assert summary["job_bytes_early"] == 1050 and summary["job_bytes_end"] == 1300
    assert summary["job_bytes_ratio"] == 1.24
    assert summary["claim_p99_ratio"] == 1.5
    assert summary["retention_rows_deleted"] == 0


def test_the_minute_figures_come_from_every_claim_of_the_minute() -> None:
    # Six samples a minute, 100 claims each: up to 5 ms before minute 25, up to 10 ms after;
    # one sample at minute 5 has 50 of its claims between 25 and 50 ms. The one-sample figure
    # there is that sample's; the minute's p99 is over its 600 claims (50 slow: above p99).
    bounds = (0.005, 0.01, 0.025, 0.05, math.inf)
    totals = dict.fromkeys(bounds, 0.0)
    samples = []
    for t in range(1, 181):
        slow = 50 if t == 30 else 0
        fast = 100 - slow
        limit = 0.005 if t <= 150 else 0.01
        for bound in bounds:
            totals[bound] += (fast if bound >= limit else 0) + (slow if bound >= 0.05 else 0)
        samples.append(
            {
                "minute": round(t / 6, 3),
                "job_bytes": 1000,
                "claim_p99_ms": 49.5 if t == 30 else (5.0 if t <= 150 else 10.0),
                "claim_buckets": {str(bound): count for bound, count in totals.items()},
                "wal_bytes_per_job": 900,
                "retention_rows_deleted": 0,
                "completed_per_s": 1000.0,
            }
        )
    summary = summarise(samples, 30)
    assert summary["claim_p99_ms_early"] == 49.5
    # Minute 4.5-5.5: 600 claims, 50 of them slow: the p99 (rank 594) is in the 25-50 ms bucket.
    assert summary["claim_p99_ms_early_minute"] is not None
    assert 25.0 < summary["claim_p99_ms_early_minute"] <= 50.0
    # Minute 29-30: every claim 5-10 ms.
    assert summary["claim_p99_ms_end_minute"] is not None
    assert 5.0 < summary["claim_p99_ms_end_minute"] <= 10.0
    assert summary["claim_p99_minute_ratio"] < 0.4


def test_the_minute_figures_need_the_buckets() -> None:
    samples = [
        {"minute": m, "job_bytes": 1, "claim_p99_ms": 1.0, "wal_bytes_per_job": 1,
         "retention_rows_deleted": 0, "completed_per_s": 1.0}
        for m in range(1, 31)
    ]  # fmt: skip
    summary = summarise(samples, 30)
    assert summary["claim_p99_ms_early_minute"] is None
    assert summary["claim_p99_minute_ratio"] is None


def test_the_plot_draws_every_panel_with_a_side_that_lacks_the_newer_series(
    tmp_path: Path,
) -> None:
    """A before side whose services predate the retention metrics has no pass seconds or
    partition counts: the plot still draws all ten panels, that side's lines empty there."""
    base = {"minute": 1.0, "job_bytes": 1, "job_index_bytes": 1, "dead_tuples": 0}
    old = [dict(base, minute=m) for m in (1.0, 2.0)]
    new = [
        dict(
            base,
            minute=m,
            retention_pass_seconds=0.01,
            partitions_created=int(m),
            partitions_dropped=int(m) - 1,
        )
        for m in (1.0, 2.0)
    ]
    document = {
        "settings": {"minutes": 2, "snapshot_seconds": 6},
        "sides": [{"side": "before", "samples": old}, {"side": "after", "samples": new}],
    }
    path = tmp_path / "soak.png"

    plot(document, path)

    assert path.stat().st_size > 10_000
