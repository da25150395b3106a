"""Counter series that alerts and panels rely on exist at 0 before their first increment (issue
25 item 2): `increase()` sees no rise in a series whose first sample is the burst, so the first
crash of a worker would leave `JobqLeaseExpiriesSpiking` quiet."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from services.queue.app import create_app
from services.queue.metrics import OUTCOMES, RELEASE_REASONS
from services.queue.settings import QueueSettings
from tests.conftest import serving
from tests.helpers import eventually


def samples(metrics: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a /metrics text by (name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): float(sample.value)
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
    }


def value(metrics: str, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, frozenset(labels.items())))


async def test_a_new_queue_and_task_type_have_every_counter_at_zero_from_their_first_job(
    clean_database: str, redis_url: str
) -> None:
    settings = QueueSettings(database_url=clean_database, redis_url=redis_url)
    async with serving(create_app(settings)) as client:
        before = (await client.get("/metrics")).text
        assert value(before, "jobq_lease_expired_total", queue="mail") is None
        response = await client.post(
            "/jobs", json={"queue": "mail", "taskType": "email", "payload": {}}
        )
        assert response.status_code == 202, response.text
        metrics = (await client.get("/metrics")).text
    assert value(metrics, "jobq_lease_expired_total", queue="mail") == 0
    for reason in RELEASE_REASONS:
        assert value(metrics, "jobq_released_total", queue="mail", reason=reason) == 0
    for outcome in OUTCOMES:
        labels = {"queue": "mail", "task_type": "email", "outcome": outcome}
        assert value(metrics, "jobq_processed_total", **labels) == 0, outcome


async def test_a_restarted_service_exports_the_queues_in_the_database_at_zero(
    clean_database: str, redis_url: str
) -> None:
    first = QueueSettings(database_url=clean_database, redis_url=redis_url)
    async with serving(create_app(first)) as client:
        response = await client.post(
            "/jobs", json={"queue": "mail", "taskType": "email", "payload": {}}
        )
        assert response.status_code == 202, response.text

    # A new process (a restart) knows nothing of "mail" until its first depth reading.
    restarted = QueueSettings(
        database_url=clean_database, redis_url=redis_url, queue_depth_interval=0.2
    )
    async with serving(create_app(restarted)) as client:

        async def expired() -> float | None:
            text = (await client.get("/metrics")).text
            return value(text, "jobq_lease_expired_total", queue="mail")

        seeded = await eventually(
            expired, lambda v: v is not None, what="jobq_lease_expired_total{queue=mail}"
        )
        assert seeded == 0
        text = (await client.get("/metrics")).text
        assert value(text, "jobq_released_total", queue="mail", reason="shutdown") == 0


async def test_settled_attempts_count_in_series_that_already_existed(
    clean_database: str, redis_url: str
) -> None:
    """A retry counted for a pair first seen at its settle still leaves the other outcomes
    at 0 (the error-ratio panel divides by their sum)."""
    settings = QueueSettings(database_url=clean_database, redis_url=redis_url)
    async with serving(create_app(settings)) as client:
        await client.post("/jobs", json={"taskType": "noop", "payload": {}, "maxAttempts": 3})
        claimed = await client.post("/jobs/next", json={"worker": "w", "queues": ["default"]})
        job = claimed.json()["jobs"][0]
        failed = await client.post(
            f"/jobs/{job['id']}/fail",
            json={"receiptHandle": job["receiptHandle"], "error": "boom", "retryable": True},
        )
        assert failed.status_code == 200, failed.text
        metrics = (await client.get("/metrics")).text
    labels = {"queue": "default", "task_type": "noop"}
    assert value(metrics, "jobq_processed_total", **labels, outcome="retry") == 1
    assert value(metrics, "jobq_processed_total", **labels, outcome="dead_letter") == 0
    assert value(metrics, "jobq_processed_total", **labels, outcome="success") == 0
