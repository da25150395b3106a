"""Bounded metric labels (docs/architecture.md#metrics): the depth gauges ranked afresh at each
refresh with `other` the sum of the rest, the counters' first-come labels with a reserve for
ranked queues, and a worker's task-type label limited to its processors'."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from common.contracts import JobStatus
from common.metrics import OTHER, BoundedLabel
from services.queue.metrics import QueueMetrics
from services.queue.readings import DepthRow
from services.worker.metrics import WorkerMetrics
from tests.unit.test_worker_loop import FakeQueue, _instant, _running, _until

PENDING, DEAD = JobStatus.PENDING, JobStatus.DEAD_LETTER


def depth(metrics: QueueMetrics) -> dict[tuple[str, str], float]:
    """`jobq_jobs` samples by (queue, status)."""
    return {
        (s.labels["queue"], s.labels["status"]): s.value
        for m in metrics.jobs.collect()
        for s in m.samples
    }


def ages(metrics: QueueMetrics) -> dict[str, float]:
    return {
        s.labels["queue"]: s.value for m in metrics.oldest_pending_age.collect() for s in m.samples
    }


def test_depth_series_go_to_the_busiest_queues_and_other_sums_the_rest() -> None:
    metrics = QueueMetrics(CollectorRegistry(), label_limit=2)
    rows = [
        DepthRow("a", PENDING, 1, 5.0),
        DepthRow("b", PENDING, 7, 1.0),
        DepthRow("c", PENDING, 3, 9.0),
        DepthRow("c", DEAD, 4, 0.0),
        DepthRow("d", DEAD, 50, 0.0),  # dead letters only: not live, ranks last
        DepthRow(OTHER, PENDING, 2, 2.0),  # a queue named "other" is always folded
    ]
    metrics.observe_depth(rows)
    series = depth(metrics)
    assert {q for q, _ in series} == {"b", "c", OTHER}
    assert series[("b", "PENDING")] == 7 and series[("b", "DEAD_LETTER")] == 0
    assert series[("c", "PENDING")] == 3 and series[("c", "DEAD_LETTER")] == 4
    assert series[(OTHER, "PENDING")] == 1 + 2 and series[(OTHER, "DEAD_LETTER")] == 50
    assert ages(metrics) == {"b": 1.0, "c": 9.0, OTHER: 5.0}
    for status in ("PENDING", "SCHEDULED", "PROCESSING", "DEAD_LETTER"):
        total = sum(row.count for row in rows if row.status.value == status)
        assert sum(v for (_, s), v in series.items() if s == status) == total

    # "a" outgrows "c": c's series are removed (not left stale) and c counts in other.
    metrics.observe_depth(
        [
            DepthRow("a", PENDING, 9, 6.0),
            DepthRow("b", PENDING, 7, 1.0),
            DepthRow("c", PENDING, 3, 9.0),
        ]
    )
    series = depth(metrics)
    assert {q for q, _ in series} == {"a", "b", OTHER}
    assert series[(OTHER, "PENDING")] == 3 and series[(OTHER, "DEAD_LETTER")] == 0
    assert ages(metrics) == {"a": 6.0, "b": 1.0, OTHER: 9.0}

    # Queues that empty keep their series at 0 while they still rank; so does other.
    metrics.observe_depth([])
    series = depth(metrics)
    assert set(series.values()) == {0} and {q for q, _ in series} == {"a", "b", OTHER}


def test_counters_admit_ranked_queues_after_first_come_labels_run_out() -> None:
    metrics = QueueMetrics(CollectorRegistry(), label_limit=3)
    for n in range(5):
        metrics.count_enqueued(f"junk-{n}", "noop", "acme")
    assert metrics.queue_label("real") == OTHER
    metrics.observe_depth([DepthRow("real", PENDING, 4, 1.0), DepthRow("junk-1", PENDING, 1, 1)])
    metrics.count_enqueued("real", "noop", "acme")
    counted = {
        s.labels["queue"]: s.value
        for m in metrics.enqueued.collect()
        for s in m.samples
        if s.name == "jobq_enqueued_total"
    }
    assert counted == {"junk-0": 1, "junk-1": 1, "junk-2": 1, OTHER: 2, "real": 1}


def test_bounded_label_reserve_and_kept_values() -> None:
    label = BoundedLabel(limit=1, reserve=1)
    assert [label("a"), label("b")] == ["a", OTHER]
    label.admit(["a", "Bad Name", "b", "c"])  # "a" has a label; the reserve goes to "b"
    assert [label("b"), label("c"), label("Bad Name")] == ["b", OTHER, OTHER]
    label.keep(["c"])
    assert label("c") == "c"


async def test_a_worker_labels_only_its_own_task_types() -> None:
    """Jobs of task types no processor here handles (failed unrun, to be retried, perhaps on
    another worker) are "other", however many names a client invents; the worker's own task
    types keep their label."""
    queue = FakeQueue()
    junk = [queue.add(f"junk-{n}") for n in range(150)]
    known = queue.add("instant")
    worker, shutdown, task = await _running(queue, {"instant": _instant})
    metrics: WorkerMetrics = worker._metrics
    await _until(lambda: all(queue.status(i) is JobStatus.SCHEDULED for i in junk))
    await _until(lambda: queue.status(known) is JobStatus.COMPLETED)
    shutdown.set()
    await task
    labels = {
        (s.labels["task_type"], s.labels["outcome"])
        for m in metrics.job_duration.collect()
        for s in m.samples
        if s.name.endswith("_count")
    }
    assert labels == {(OTHER, "retry"), ("instant", "success")}
