"""Per-tenant request rate limits on the producer (docs/architecture.md#rate-limits): Litestar's
rate-limit middleware counting in Redis, or in memory while Redis is unreachable."""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from infra.stack import free_port
from tests.conftest import guarded_services


@contextlib.asynccontextmanager
async def limited_producer(
    database_url: str, redis_url: str, store_url: str, keys: str, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    async with guarded_services(
        database_url,
        redis_url,
        keys,
        producer_rate_limit="3/minute",
        store_url=store_url,
        **settings,
    ) as (producer, _):
        yield producer


def tenants() -> tuple[str, str, str]:
    """Fresh tenant names (windows in Redis outlive a test), and the keys spec for them."""
    first, second = f"t{uuid.uuid4().hex[:12]}", f"t{uuid.uuid4().hex[:12]}"
    return first, second, f"submit:{first}:{first}-key-0123456789,submit:{second}:{second}-key-0123"


async def test_each_tenant_has_its_own_request_budget(clean_database: str, redis_url: str) -> None:
    first, second, keys = tenants()
    headers_first = {"Authorization": f"Bearer {first}-key-0123456789"}
    headers_second = {"Authorization": f"Bearer {second}-key-0123"}
    async with limited_producer(clean_database, redis_url, redis_url, keys) as producer:
        job = {"taskType": "noop", "payload": {}}
        remaining = []
        for _ in range(3):
            reply = await producer.post("/jobs", json=job, headers=headers_first)
            assert reply.status_code == 202, reply.text
            remaining.append(reply.headers["ratelimit-remaining"])
        assert remaining == ["2", "1", "0"]
        assert reply.headers["ratelimit-limit"] == "3"

        refused = await producer.get("/jobs/" + str(uuid.uuid4()), headers=headers_first)
        assert refused.status_code == 429
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["type"] == "urn:jobq:problem:rate-limited"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert refused.headers["ratelimit-remaining"] == "0"

        # Another tenant's budget is untouched; probes are never counted.
        assert (await producer.post("/jobs", json=job, headers=headers_second)).status_code == 202
        for _ in range(5):
            assert (await producer.get("/health/live")).status_code == 200
        metrics = (await producer.get("/metrics")).text
        assert re.search(
            rf'jobq_rate_limited_total\{{limit="requests",tenant="{first}"\}} 1\.0', metrics
        ), metrics


async def test_batch_entries_count_against_the_job_budget(
    clean_database: str, redis_url: str
) -> None:
    """One request of many entries must not pass as one unit (issue 16 item 4): with
    `3/minute`, a single submit leaves two jobs, so a batch of three is refused whole."""
    first, _, keys = tenants()
    headers = {"Authorization": f"Bearer {first}-key-0123456789"}
    job = {"taskType": "noop", "payload": {}}
    async with limited_producer(clean_database, redis_url, redis_url, keys) as producer:
        assert (await producer.post("/jobs", json=job, headers=headers)).status_code == 202
        refused = await producer.post("/jobs/batch", json={"jobs": [job] * 3}, headers=headers)
        assert refused.status_code == 429, refused.text
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["type"] == "urn:jobq:problem:rate-limited"
        assert "PRODUCER_RATE_LIMIT" in refused.json()["detail"]
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        # Nothing of the refused batch was counted or created: two entries still fit.
        admitted = await producer.post("/jobs/batch", json={"jobs": [job] * 2}, headers=headers)
        assert admitted.status_code == 200, admitted.text
        assert [r["status"] for r in admitted.json()["results"]] == [202, 202]
        metrics = (await producer.get("/metrics")).text
        assert re.search(
            rf'jobq_rate_limited_total\{{limit="jobs",tenant="{first}"\}} 1\.0', metrics
        ), metrics


async def test_without_redis_the_limit_holds_in_memory(
    clean_database: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    first, _, keys = tenants()
    headers = {"Authorization": f"Bearer {first}-key-0123456789"}
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, logger="services.producer.limits"):
        async with limited_producer(clean_database, redis_url, unreachable, keys) as producer:
            statuses = [
                (await producer.get("/jobs/" + str(uuid.uuid4()), headers=headers)).status_code
                for _ in range(4)
            ]
    assert statuses == [404, 404, 404, 429]
    assert any(r.event == "rate_limit_store_unavailable" for r in caplog.records)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("trusted", "forwarded_identity"),
    [("", False), ("127.0.0.1", True), ("10.0.0.0/8, 127.0.0.0/8", True)],
)
async def test_forwarded_for_names_the_client_only_from_a_trusted_proxy(
    clean_database: str, redis_url: str, trusted: str, forwarded_identity: bool
) -> None:
    """An anonymous client's window is its address: `X-Forwarded-For` names it only when the
    connection comes from an `HTTP_TRUSTED_PROXIES` address (by default none, so a client
    cannot choose its own window). Counted in memory: a fresh window per test."""
    _, _, keys = tenants()
    async with limited_producer(
        clean_database, redis_url, "", keys, http_trusted_proxies=trusted
    ) as producer:
        path = "/jobs/" + str(uuid.uuid4())
        first = [
            (await producer.get(path, headers={"X-Forwarded-For": "1.2.3.4"})).status_code
            for _ in range(3)
        ]
        assert first == [401, 401, 401]
        other_client = await producer.get(path, headers={"X-Forwarded-For": "5.6.7.8"})
        no_header = await producer.get(path)
        same_client = await producer.get(path, headers={"X-Forwarded-For": "9.9.9.9, 1.2.3.4"})
    if forwarded_identity:
        # 1.2.3.4's window is spent; 5.6.7.8 and the proxy itself have their own.
        assert (other_client.status_code, no_header.status_code) == (401, 401)
        assert same_client.status_code == 429
    else:
        # Every request was 127.0.0.1's, whatever it claimed.
        assert (other_client.status_code, no_header.status_code) == (429, 429)
        assert same_client.status_code == 429
