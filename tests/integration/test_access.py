"""Access (docs/architecture.md#access): API keys with roles on the producer, the internal
token on the queue service, both over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from common.web.access import Caller, Role, parse_api_keys
from tests.conftest import INTERNAL_TOKEN, guarded_services

ADMIN, SUBMIT = "admin-key-0123456789", "submit-key-0123456789"
TOKEN = INTERNAL_TOKEN


@pytest.fixture
async def services(
    clean_database: str, redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    async with guarded_services(clean_database, redis_url, f"admin:{ADMIN},submit:{SUBMIT}") as (
        producer,
        queue,
    ):
        yield producer, queue


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_producer_roles(services: tuple[httpx.AsyncClient, httpx.AsyncClient]) -> None:
    producer, _ = services
    job = {"taskType": "noop", "payload": {}}

    missing = await producer.post("/jobs", json=job)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert missing.json()["type"] == "urn:jobq:problem:unauthorized"
    wrong = await producer.post("/jobs", json=job, headers=bearer("not-a-key-at-all-x"))
    assert wrong.status_code == 401

    created = await producer.post("/jobs", json=job, headers=bearer(SUBMIT))
    assert created.status_code == 202
    job_id = created.json()["jobId"]
    assert (await producer.get(f"/jobs/{job_id}", headers=bearer(SUBMIT))).status_code == 200

    for method, path in [
        ("GET", "/jobs"),
        ("POST", f"/jobs/{job_id}/cancel"),
        ("POST", f"/jobs/{job_id}/retry"),
    ]:
        refused = await producer.request(method, path, headers=bearer(SUBMIT))
        assert refused.status_code == 403, (method, path)
        assert refused.json()["type"] == "urn:jobq:problem:forbidden"
    redrive = await producer.post("/dead-letter/redrive", json={}, headers=bearer(SUBMIT))
    assert redrive.status_code == 403

    assert (await producer.get("/jobs", headers=bearer(ADMIN))).status_code == 200
    assert (await producer.post(f"/jobs/{job_id}/cancel", headers=bearer(ADMIN))).status_code == 200
    for public in ("/health/live", "/metrics", "/schema/openapi.json"):
        assert (await producer.get(public)).status_code == 200, public


async def test_queue_service_requires_the_internal_token(
    services: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    _, queue = services
    claim = {"worker": "w", "queues": ["default"]}

    assert (await queue.post("/jobs", json={"taskType": "x", "payload": {}})).status_code == 401
    assert (await queue.post("/jobs/next", json=claim)).status_code == 401
    assert (await queue.post("/jobs/next", json=claim, headers=bearer("x" * 20))).status_code == 401
    assert (await queue.post("/jobs/next", json=claim, headers=bearer(TOKEN))).status_code == 204
    assert (await queue.get("/health/ready")).status_code == 200
    assert (await queue.get("/metrics")).status_code == 200
    assert (await queue.get("/schema/openapi.json")).status_code == 401


def test_api_key_specs() -> None:
    assert parse_api_keys(f"admin:{ADMIN}, submit:{SUBMIT}") == {
        ADMIN: Caller(Role.ADMIN, "default"),
        SUBMIT: Caller(Role.SUBMIT, "default"),
    }
    assert parse_api_keys(f"admin:*:{ADMIN}\n# a comment\n\nsubmit:acme:{SUBMIT}") == {
        ADMIN: Caller(Role.ADMIN, "*"),
        SUBMIT: Caller(Role.SUBMIT, "acme"),
    }
    # Three fields or more are role:tenant:key, whose key may hold colons.
    assert parse_api_keys(f"submit:default:Ab:{SUBMIT}") == {
        f"Ab:{SUBMIT}": Caller(Role.SUBMIT, "default")
    }
    for bad in (
        "root:" + ADMIN,
        "admin:short",
        f"admin:{ADMIN},submit:{ADMIN}",
        ADMIN,
        f"submit:*:{SUBMIT}",
        f"admin:acme:{ADMIN},submit:globex:{ADMIN}",
    ):
        with pytest.raises(ValueError) as error:
            parse_api_keys(bad)
        assert ADMIN not in str(error.value), "a key must never appear in an error"


async def test_a_wrong_internal_token_is_the_producers_problem_not_the_callers(
    clean_database: str, redis_url: str
) -> None:
    async with guarded_services(
        clean_database, redis_url, f"admin:{ADMIN}", producer_token="not-the-token-0123456789"
    ) as (producer, queue):
        submit = await producer.post(
            "/jobs", json={"taskType": "noop", "payload": {}}, headers=bearer(ADMIN)
        )
        read = await producer.get(
            "/jobs/00000000-0000-0000-0000-000000000000", headers=bearer(ADMIN)
        )
        ready = await producer.get("/health/ready")
        # The queue service's probes need no token, but refuse a wrong one.
        assert (await queue.get("/health/live")).status_code == 200
        wrong = await queue.get("/health/live", headers=bearer("not-the-token-0123456789"))
        assert wrong.status_code == 401
    for reply in (submit, read):
        assert reply.status_code == 503
        assert reply.json()["type"] == "urn:jobq:problem:upstream-misconfigured"
        assert reply.json()["title"] == "Upstream misconfigured"
        assert "token" not in reply.text.lower(), "the queue's own 401 text stays inside"
        assert reply.headers["retry-after"]
    assert ready.status_code == 503
    assert ready.json()["queueService"] == "misconfigured"


async def test_the_api_description_is_served_without_a_documentation_ui(
    services: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    producer, _ = services
    document = await producer.get("/schema/openapi.json")
    assert document.status_code == 200
    assert document.json()["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for ui in ("/schema/swagger", "/schema/redoc", "/schema/elements", "/schema/rapidoc"):
        assert (await producer.get(ui)).status_code == 404, ui
