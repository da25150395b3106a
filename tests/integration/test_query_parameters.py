"""Unknown query parameters are refused on every API route of both services, with a 422 naming
each (`query:<name>`); probes and metrics take any (common/web/query_params.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute

from common.web.query_params import known_parameters
from services.producer.app import create_app as create_producer
from services.producer.settings import ProducerSettings
from services.queue.app import create_app as create_queue
from services.queue.settings import QueueSettings
from tests.conftest import INTERNAL_TOKEN, guarded_services

ADMIN = "admin:acme:acme-admin-key-0123456789"
HEADERS = {"Authorization": "Bearer acme-admin-key-0123456789"}


@pytest.fixture
async def services(
    clean_database: str, redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    async with guarded_services(clean_database, redis_url, ADMIN) as clients:
        yield clients


def assert_refused(reply: httpx.Response, *names: str) -> None:
    assert reply.status_code == 422, reply.text
    assert reply.headers["content-type"].startswith("application/problem+json")
    problem = reply.json()
    assert problem["type"] == "urn:jobq:problem:invalid-input"
    assert [e["pointer"] for e in problem["errors"]] == [f"query:{n}" for n in names]


async def test_every_producer_route_refuses_unknown_parameters(
    services: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    producer, _ = services
    job = {"taskType": "noop", "payload": {}}
    submitted = await producer.post("/jobs", json=job, headers=HEADERS)
    job_id = submitted.json()["jobId"]

    # GET /jobs/{id}?colour=blue was a 200 before (issue 16 item 12).
    assert_refused(await producer.get(f"/jobs/{job_id}?colour=blue", headers=HEADERS), "colour")
    assert_refused(
        await producer.post("/jobs?priority=9&dry=1", json=job, headers=HEADERS), "dry", "priority"
    )
    assert_refused(
        await producer.post("/jobs/batch?x=1", json={"jobs": [job]}, headers=HEADERS), "x"
    )
    assert_refused(await producer.post(f"/jobs/{job_id}/cancel?force=1", headers=HEADERS), "force")
    assert_refused(await producer.post(f"/jobs/{job_id}/retry?now=1", headers=HEADERS), "now")
    assert_refused(
        await producer.post("/dead-letter/redrive?all=1", json={}, headers=HEADERS), "all"
    )
    # The listing's own parameters pass; the tenant is the key's, not the caller's to choose.
    assert_refused(await producer.get("/jobs?tenant=other", headers=HEADERS), "tenant")
    listed = await producer.get("/jobs?queue=default&taskType=noop&limit=5", headers=HEADERS)
    assert listed.status_code == 200, listed.text
    # Nothing was changed by a refused request: the job is still the one submitted.
    read = await producer.get(f"/jobs/{job_id}", headers=HEADERS)
    assert read.status_code == 200 and read.json()["status"] == "PENDING"
    # Probes and scrapers may send parameters of their own.
    assert (await producer.get("/health/live?nocache=1")).status_code == 200
    assert (await producer.get("/metrics?name[]=x")).status_code == 200


async def test_every_queue_service_route_refuses_unknown_parameters(
    services: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    _, queue = services
    queue.headers["Authorization"] = f"Bearer {INTERNAL_TOKEN}"
    missing = uuid.uuid4()
    assert_refused(await queue.get(f"/jobs/{missing}?colour=blue"), "colour")
    assert (await queue.get(f"/jobs/{missing}?tenant=acme")).status_code == 404
    assert_refused(
        await queue.post("/jobs/next?wait=1", json={"queues": ["default"], "workerId": "w"}),
        "wait",
    )
    assert_refused(await queue.get("/queues?queue=default"), "queue")
    assert_refused(await queue.get("/jobs?task_type=noop"), "task_type")
    assert (await queue.get("/queues")).status_code == 200
    assert (await queue.get("/health/live?probe=1")).status_code == 200


@pytest.mark.parametrize("build", ["producer", "queue"])
def test_every_documented_route_is_checked(build: str) -> None:
    """No API route escapes the check: each has its set of known parameters, and only the
    probes, metrics and schema routes are left out."""
    app: Litestar = (
        create_producer(ProducerSettings())
        if build == "producer"
        else create_queue(QueueSettings(database_url="postgresql://127.0.0.1/unused"))
    )
    known = known_parameters(app)
    unchecked = set()
    for route in app.routes:
        assert isinstance(route, HTTPRoute)
        for method, (handler, _) in route.route_handler_map.items():
            # OPTIONS is Litestar's own answer (CORS preflight), never the API.
            if method != "OPTIONS" and known.get(id(handler)) is None:
                unchecked.add(route.path)
    # The console's pages read their query strings themselves and are no API.
    assert unchecked <= {"/health/live", "/health/ready", "/metrics"} | {
        path for path in unchecked if path.startswith(("/schema", "/console"))
    }, unchecked
    assert any(k for k in known.values() if k), "the listing's parameters are known"
