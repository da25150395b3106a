"""Tenants (docs/architecture.md#tenants): every API key belongs to a tenant, and a key sees,
changes and collides with its own tenant's jobs only. Producer and queue service over real
HTTP, on real PostgreSQL."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.conftest import INTERNAL_TOKEN, guarded_services

ACME = "acme-submit-key-0123456789"
ACME_ADMIN = "acme-admin-key-0123456789"
GLOBEX = "globex-submit-key-0123456789"
GLOBEX_ADMIN = "globex-admin-key-0123456789"
ROOT = "global-admin-key-0123456789"
LEGACY = "legacy-submit-key-0123456789"
KEYS = (
    f"submit:acme:{ACME},admin:acme:{ACME_ADMIN},submit:globex:{GLOBEX},"
    f"admin:globex:{GLOBEX_ADMIN},admin:*:{ROOT},submit:{LEGACY}"
)

SECRET_HOOK = {
    "taskType": "webhook",
    "idempotencyKey": "order-42",
    "payload": {
        "url": "https://partner.example/hook",
        "headers": {"Authorization": "Bearer S3CRET"},
    },
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def stack(
    clean_database: str, redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    async with guarded_services(clean_database, redis_url, KEYS) as (producer, queue):
        queue.headers.update(bearer(INTERNAL_TOKEN))
        yield producer, queue


def without_ids(problem: dict[str, object]) -> dict[str, object]:
    """The problem with every job id blanked, to compare two 404s."""
    pattern = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    return {key: re.sub(pattern, "<id>", str(value)) for key, value in problem.items()}


async def test_a_key_never_sees_another_tenants_job(
    stack: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    producer, _ = stack
    first = await producer.post("/jobs", json=SECRET_HOOK, headers=bearer(ACME))
    assert first.status_code == 202, first.text
    acme_job = first.json()["jobId"]

    # The same idempotency key under another tenant is another tenant's own job, not a 409
    # naming acme's.
    other_body = {**SECRET_HOOK, "payload": {"url": "https://globex.example/hook"}}
    second = await producer.post("/jobs", json=other_body, headers=bearer(GLOBEX))
    assert second.status_code == 202, second.text
    globex_job = second.json()["jobId"]
    assert globex_job != acme_job and acme_job not in second.text

    # Within a tenant the key still deduplicates: a replay, then a conflict naming the job.
    replay = await producer.post("/jobs", json=SECRET_HOOK, headers=bearer(ACME))
    assert (replay.status_code, replay.json()["jobId"]) == (200, acme_job)
    conflict = await producer.post("/jobs", json=other_body, headers=bearer(ACME))
    assert conflict.status_code == 409 and acme_job in conflict.json()["detail"]

    # Another tenant's job is a 404 exactly like a missing one, for reads and every action.
    missing = str(uuid.uuid4())
    for key in (GLOBEX, GLOBEX_ADMIN):
        foreign = await producer.get(f"/jobs/{acme_job}", headers=bearer(key))
        absent = await producer.get(f"/jobs/{missing}", headers=bearer(key))
        assert foreign.status_code == absent.status_code == 404
        assert without_ids(foreign.json()) == without_ids(absent.json())
        assert "S3CRET" not in foreign.text
    for action in ("cancel", "retry"):
        foreign = await producer.post(f"/jobs/{acme_job}/{action}", headers=bearer(GLOBEX_ADMIN))
        absent = await producer.post(f"/jobs/{missing}/{action}", headers=bearer(GLOBEX_ADMIN))
        assert foreign.status_code == absent.status_code == 404, action
        assert without_ids(foreign.json()) == without_ids(absent.json())

    # Each tenant reads its own; the global admin reads both.
    own = await producer.get(f"/jobs/{acme_job}", headers=bearer(ACME))
    assert own.status_code == 200 and own.json()["tenant"] == "acme"
    assert own.json()["payload"]["headers"] == {"Authorization": "Bearer S3CRET"}
    for job_id, tenant in ((acme_job, "acme"), (globex_job, "globex")):
        view = await producer.get(f"/jobs/{job_id}", headers=bearer(ROOT))
        assert view.status_code == 200 and view.json()["tenant"] == tenant

    # Listings are scoped the same way.
    async def listed(key: str) -> set[str]:
        reply = await producer.get("/jobs", headers=bearer(key))
        assert reply.status_code == 200, reply.text
        return {item["id"] for item in reply.json()["items"]}

    assert await listed(ACME_ADMIN) == {acme_job}
    assert await listed(GLOBEX_ADMIN) == {globex_job}
    assert await listed(ROOT) == {acme_job, globex_job}

    # A tenant's admin cancels its own job; the other tenant's stays untouched.
    cancelled = await producer.post(f"/jobs/{globex_job}/cancel", headers=bearer(GLOBEX_ADMIN))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"
    untouched = await producer.get(f"/jobs/{acme_job}", headers=bearer(ACME))
    assert untouched.json()["status"] == "PENDING"


async def test_batches_and_the_old_key_form(
    stack: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    producer, _ = stack
    entry = {"taskType": "noop", "payload": {"n": 1}, "idempotencyKey": "nightly"}
    acme = await producer.post("/jobs/batch", json={"jobs": [entry]}, headers=bearer(ACME))
    legacy = await producer.post("/jobs/batch", json={"jobs": [entry]}, headers=bearer(LEGACY))
    [acme_result], [legacy_result] = acme.json()["results"], legacy.json()["results"]
    assert acme_result["status"] == legacy_result["status"] == 202
    assert acme_result["jobId"] != legacy_result["jobId"]

    view = await producer.get(f"/jobs/{legacy_result['jobId']}", headers=bearer(LEGACY))
    assert view.json()["tenant"] == "default", "role:key keys belong to the tenant default"
    assert (
        await producer.get(f"/jobs/{acme_result['jobId']}", headers=bearer(LEGACY))
    ).status_code == 404


async def test_redrive_moves_only_the_callers_dead_letters(
    stack: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    producer, queue = stack
    owners = {}
    for key, tenant in ((ACME, "acme"), (GLOBEX, "globex"), (GLOBEX, "globex")):
        job = {"taskType": "noop", "queue": "doomed", "payload": {}, "maxAttempts": 1}
        reply = await producer.post("/jobs", json=job, headers=bearer(key))
        owners[reply.json()["jobId"]] = tenant
    claimed = await queue.post("/jobs/next", json={"worker": "w", "queues": ["doomed"], "max": 10})
    for job in claimed.json()["jobs"]:
        failed = await queue.post(
            f"/jobs/{job['id']}/fail",
            json={"receiptHandle": job["receiptHandle"], "error": "no", "retryable": False},
        )
        assert failed.json()["status"] == "DEAD_LETTER"

    moved = await producer.post("/dead-letter/redrive", json={}, headers=bearer(ACME_ADMIN))
    assert moved.json() == {"moved": 1}
    statuses = {
        job_id: (await producer.get(f"/jobs/{job_id}", headers=bearer(ROOT))).json()["status"]
        for job_id in owners
    }
    assert {job_id: s for job_id, s in statuses.items() if owners[job_id] == "acme"} == {
        job_id: "PENDING" for job_id in owners if owners[job_id] == "acme"
    }
    assert {s for job_id, s in statuses.items() if owners[job_id] == "globex"} == {"DEAD_LETTER"}
    everything = await producer.post("/dead-letter/redrive", json={}, headers=bearer(ROOT))
    assert everything.json() == {"moved": 2}


async def test_enqueued_jobs_are_counted_per_tenant(
    stack: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    producer, queue = stack
    for key in (ACME, GLOBEX, GLOBEX):
        job = {"taskType": "noop", "queue": "counted", "payload": {}}
        assert (await producer.post("/jobs", json=job, headers=bearer(key))).status_code == 202
    metrics = (await queue.get("/metrics")).text
    for tenant, count in (("acme", 1), ("globex", 2)):
        line = re.search(
            rf'^jobq_enqueued_total\{{[^}}]*queue="counted"[^}}]*tenant="{tenant}"[^}}]*\}} (\S+)$',
            metrics,
            flags=re.MULTILINE,
        )
        assert line is not None and float(line.group(1)) == count, tenant
