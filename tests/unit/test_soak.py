"""The soak benchmark's arithmetic: quantiles from histogram deltas and the summary."""

from __future__ import annotations

import math

from benchmark.soak import quantile, summarise


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


def test_the_minute_figures_are_medians_of_the_samples_around_each_point() -> None:
    # Six samples a minute; one outlier at minute 5 moves the one-sample figure, not the minute's.
    samples = [
        {
            "minute": round(t / 6, 3),
            "job_bytes": 1000,
            "claim_p99_ms": 50.0 if t == 30 else (2.0 if t < 150 else 4.0),
            "wal_bytes_per_job": 900,
            "retention_rows_deleted": 0,
            "completed_per_s": 1000.0,
        }
        for t in range(1, 181)
    ]
    summary = summarise(samples, 30)
    assert summary["claim_p99_ms_early"] == 50.0 and summary["claim_p99_ms_early_minute"] == 2.0
    assert summary["claim_p99_ms_end_minute"] == 4.0
    assert summary["claim_p99_minute_ratio"] == 2.0
