"""Progress reports: `await job.progress(…)` in a processor rides the worker's heartbeat to the
queue service, which stores it on the job (bounded, validated) and shows it in the job view."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from common.contracts import PROGRESS_MESSAGE_MAX_CHARS
from common.web.http import ServiceClient
from jobq.processors import JobContext, ProcessorRegistry
from services.queue.app import create_app
from services.queue.settings import QueueSettings
from services.worker import runner
from services.worker.client import QueueClient
from services.worker.metrics import WorkerMetrics
from services.worker.runner import Worker
from services.worker.settings import WorkerSettings
from tests.conftest import serving
from tests.helpers import eventually

MEGABYTE = "x" * 1_000_000
REPORTS: list[tuple[Any, Any]] = [
    (0.1, "1 of 10 files"),
    (math.nan, "refused"),
    (-1, None),
    (0.42, "4 of 10 files\x00"),
    (2, MEGABYTE),
    ("half", None),
    (0.5, b"bytes"),
]
"""What the processor reports, in order; NaN, a string and a bytes message are refused."""
STORED: list[tuple[float, str | None]] = [
    (0.1, "1 of 10 files"),
    (0.0, None),
    (0.42, "4 of 10 files\ufffd"),
    (1.0, "x" * PROGRESS_MESSAGE_MAX_CHARS),
]
"""What the job view must show, in this order."""


async def test_progress_reports_arrive_in_order_bounded_and_stay_after_the_end(
    clean_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "PROGRESS_INTERVAL", 0.1)
    steps = [asyncio.Event() for _ in STORED]
    refused: list[str] = []

    async def reporting(job: JobContext) -> dict[str, Any]:
        step = 0
        for fraction, message in REPORTS:
            try:
                await job.progress(fraction, message)
            except ValueError as exc:
                refused.append(str(exc))
                continue
            await steps[step].wait()
            step += 1
        return {"done": True}

    processors = ProcessorRegistry()
    processors.register("report", reporting)
    settings = WorkerSettings(worker_wait_seconds=1, worker_concurrency=1)
    async with (
        serving(create_app(QueueSettings(database_url=clean_database))) as http,
        ServiceClient(str(http.base_url)) as service_client,
    ):
        worker = Worker(
            settings,
            QueueClient(service_client, "w1"),
            processors,
            WorkerMetrics(CollectorRegistry(), 1),
        )
        shutdown = asyncio.Event()
        running = asyncio.create_task(worker.run(shutdown))
        try:
            submitted = await http.post("/jobs", json={"taskType": "report", "payload": {}})
            job_id = submitted.json()["jobId"]
            seen: list[tuple[float, str | None]] = []
            for index, expected in enumerate(STORED):

                async def read() -> Any:
                    return (await http.get(f"/jobs/{job_id}")).json()["progress"]

                progress = await eventually(
                    read,
                    lambda p, e=expected: p is not None and (p["fraction"], p["message"]) == e,
                    what=f"progress report {index}",
                )
                assert progress["attempt"] == 1
                seen.append((progress["fraction"], progress["message"]))
                steps[index].set()
            view = await eventually(
                lambda: http.get(f"/jobs/{job_id}"),
                lambda r: r.json()["status"] == "COMPLETED",
                what="the job completing",
            )
        finally:
            shutdown.set()
            await running

    assert seen == STORED
    assert len(refused) == 3
    # Kept when the job finishes: how far it got.
    assert view.json()["progress"]["fraction"] == 1.0


async def _claimed(http: httpx.AsyncClient) -> dict[str, Any]:
    await http.post("/jobs", json={"taskType": "noop", "payload": {}})
    reply = await http.post("/jobs/next", json={"worker": "w", "queues": ["default"]})
    [job] = reply.json()["jobs"]
    return dict(job)


@pytest.mark.parametrize(
    ("progress", "status"),
    [
        ({"fraction": 2}, 422),
        ({"fraction": -0.5}, 422),
        ({"fraction": 0.5, "message": "m" * (PROGRESS_MESSAGE_MAX_CHARS + 1)}, 422),
        ({"fraction": "half"}, 422),
        ({"message": "no fraction"}, 422),
        ({"fraction": 0.5, "extra": 1}, 422),
    ],
)
async def test_a_bad_progress_report_is_refused_and_nothing_is_stored(
    clean_database: str, progress: dict[str, Any], status: int
) -> None:
    async with serving(create_app(QueueSettings(database_url=clean_database))) as http:
        job = await _claimed(http)
        entry = {
            "id": job["id"],
            "receiptHandle": job["receiptHandle"],
            "visibilityTimeout": 30,
            "progress": progress,
        }
        reply = await http.post("/jobs/heartbeat", json={"entries": [entry]})
        assert reply.status_code == status
        assert reply.headers["content-type"].startswith("application/problem+json")
        assert (await http.get(f"/jobs/{job['id']}")).json()["progress"] is None


async def test_nan_is_not_json_and_a_retry_clears_the_progress(clean_database: str) -> None:
    async with serving(create_app(QueueSettings(database_url=clean_database))) as http:
        job = await _claimed(http)
        lease = {"id": job["id"], "receiptHandle": job["receiptHandle"], "visibilityTimeout": 30}
        raw = (
            b'{"entries":[{"id":"%s","receiptHandle":"%s","visibilityTimeout":30,'
            b'"progress":{"fraction":NaN}}]}' % (job["id"].encode(), job["receiptHandle"].encode())
        )
        reply = await http.post(
            "/jobs/heartbeat", content=raw, headers={"Content-Type": "application/json"}
        )
        assert reply.status_code == 400
        ok = {**lease, "progress": {"fraction": 0.25, "message": "a quarter"}}
        assert (await http.post("/jobs/heartbeat", json={"entries": [ok]})).status_code == 200
        fail = {
            "id": job["id"],
            "receiptHandle": job["receiptHandle"],
            "error": "broken",
            "retryable": False,
        }
        assert (await http.post("/jobs/fail", json={"entries": [fail]})).status_code == 200
        dead = (await http.get(f"/jobs/{job['id']}")).json()
        assert dead["status"] == "DEAD_LETTER"
        assert dead["progress"]["fraction"] == 0.25 and dead["progress"]["message"] == "a quarter"
        retried = (await http.post(f"/jobs/{job['id']}/retry")).json()
        assert retried["status"] == "PENDING" and retried["progress"] is None
        assert uuid.UUID(retried["id"]) == uuid.UUID(job["id"])
