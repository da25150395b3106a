"""Weighted fair shares between tenants (issue 18): each claim shares its batch between the
tenants with ready jobs in a queue, in proportion to their weights, so a tenant's flood
cannot starve another, and a tenant alone still gets the whole batch; the weights live in
PostgreSQL (`PUT /queues/{queue}/weights`) and are shown in `GET /queues`."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from typing import Any

import asyncpg
import httpx
import pytest

from common.contracts import ConcurrencyLimit, TenantWeight
from jobq import Client
from jobq.errors import InvalidInput
from services.queue.app import create_app
from services.queue.repository import FAIR_JOBS_PER_FLOW, SHARING_HOLD, JobRepository
from tests.conftest import guarded_services, serving
from tests.helpers import new_job
from tests.integration.conftest import replica_settings
from tests.integration.test_pause import ACME_ADMIN, ACME_SUBMIT, KEYS, ROOT_KEY, queue_entry


async def backlog(database_url: str, tenant: str, count: int, queue: str = "default") -> None:
    """`count` PENDING jobs of `tenant` in `queue`, ready in submission order, written in one
    statement (a flood's worth of jobs in seconds)."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "INSERT INTO job (id, tenant, queue, task_type, payload, status, max_attempts,"
            " visible_at, ready_at) SELECT gen_random_uuid(), $1, $2, 'noop', '{}', 'PENDING', 5,"
            " now(), clock_timestamp() FROM generate_series(1, $3)",
            tenant,
            queue,
            count,
        )
        await connection.execute("ANALYZE job")
    finally:
        await connection.close()


async def claim_tenants(client: httpx.AsyncClient, count: int = 32) -> list[str]:
    """One claim of up to `count` jobs of queue `default` through `client`: the tenants of the
    jobs handed out, in claim order (each job's tenant read from its view)."""
    reply = await client.post(
        "/jobs/next", json={"worker": "w", "queues": ["default"], "max": count}
    )
    assert reply.status_code in (200, 204), reply.text
    if reply.status_code == 204:
        return []
    tenants = []
    for job in reply.json()["jobs"]:
        view = await client.get(f"/jobs/{job['id']}")
        tenants.append(view.json()["tenant"])
    return tenants


async def test_a_flood_does_not_keep_another_tenant_waiting_on_either_replica(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient], clean_database: str
) -> None:
    await backlog(clean_database, "flood", 50_000)
    first, second = replicas
    # The flood's first jobs are being claimed when tenant b's arrive.
    assert set(await claim_tenants(first)) == {"flood"}
    submitted = await first.post(
        "/jobs/batch",
        json={"jobs": [{"taskType": "noop", "payload": {}, "tenant": "b"}] * 100},
    )
    assert submitted.status_code == 200, submitted.text
    handed_out: list[str] = []
    claims = 0
    while handed_out.count("b") < 100 and claims < 50:
        handed_out += await claim_tenants((first, second)[claims % 2])
        claims += 1
    # Each replica learns from one claim (its walk's probe) that b has ready jobs too; from
    # then on half of each claim of 32 is b's: its 100 take 7 claims more, 288 jobs in all
    # (without fair shares: after the flood's 50,000).
    assert handed_out.count("b") == 100
    assert len(handed_out) <= (2 + 7) * 32, Counter(handed_out)


async def test_weights_share_the_claims_in_their_proportion(
    repository: JobRepository, clean_database: str
) -> None:
    await backlog(clean_database, "heavy", 10_000)
    await backlog(clean_database, "light", 10_000)
    state = await repository.set_weights("default", [_weight("heavy", 3)], "test")
    assert state is not None and [(w.tenant, w.weight) for w in state.weights] == [("heavy", 3)]
    served: Counter[str] = Counter()
    for _ in range(200):
        jobs = await repository.claim(["default"], "w", 32, 30)
        assert len(jobs) == 32
        served.update(await _tenants(clean_database, [job.id for job in jobs]))
    assert served["heavy"] / served["light"] == pytest.approx(3.0, rel=0.05), served


async def test_a_tenant_alone_gets_the_whole_batch_and_its_priorities_first(
    repository: JobRepository, clean_database: str
) -> None:
    await backlog(clean_database, "alone", 100)
    urgent = await repository.insert(new_job(priority=10, tenant="alone"))
    few = [await repository.insert(new_job(tenant="few")) for _ in range(3)]
    assert urgent is not None and all(few)
    # The first claim walks the queue in claim order, priority first, and learns that two
    # tenants have ready jobs; from the next claim on they share.
    walked = await repository.claim(["default"], "w", 32, 30)
    assert len(walked) == 32 and walked[0].id == urgent.id
    assert set(await _tenants(clean_database, [job.id for job in walked])) == {"alone"}
    jobs = await repository.claim(["default"], "w", 32, 30)
    # The shares are 16 and 16; "few" has 3, so the claim is topped up from "alone".
    assert len(jobs) == 32
    tenants = Counter(await _tenants(clean_database, [job.id for job in jobs]))
    assert tenants == {"alone": 29, "few": 3}
    # A tenant alone again: the claims walk the queue, the whole batch its.
    again = await repository.claim(["default"], "w", 32, 30)
    assert len(again) == 32
    assert set(await _tenants(clean_database, [job.id for job in again])) == {"alone"}


async def test_every_one_of_many_tenants_gets_its_turn(
    repository: JobRepository, clean_database: str
) -> None:
    for n in range(100):
        await backlog(clean_database, f"t{n:03}", 20)
    served: list[set[str]] = []
    for _ in range(1 + 25):
        jobs = await repository.claim(["default"], "w", 32, 30)
        assert len(jobs) == 32
        served.append(set(await _tenants(clean_database, [job.id for job in jobs])))
    # The first claim walks the queue (t000's and t001's jobs come first) and learns that it
    # is shared. Without weights a fair claim of 32 looks at 32 / FAIR_JOBS_PER_FLOW = 4
    # tenants, 8 jobs each, and the next starts after the last it served: 25 fair claims
    # serve all 100 (without the cursor, the first 4 for ever).
    assert served[0] == {"t000", "t001"}
    assert all(len(tenants) == 32 // FAIR_JOBS_PER_FLOW for tenants in served[1:]), served
    assert set().union(*served) == {f"t{n:03}" for n in range(100)}


async def test_weights_widen_the_window_to_the_whole_batch(
    repository: JobRepository, clean_database: str
) -> None:
    for n in range(16):
        await backlog(clean_database, f"t{n:02}", 20)
    await repository.set_weights("default", [_weight("t05", 2)], "test")
    # The first claim walks the queue (t00's 20 jobs, then 12 of t01's) and learns it is
    # shared.
    await repository.claim(["default"], "w", 32, 30)
    jobs = await repository.claim(["default"], "w", 32, 30)
    # With weights set, a fair claim of 32 looks at up to 32 tenants, so the 15 with ready
    # jobs all share it, each ceil(32 x w / 16) jobs: t05 (weight 2) 4, the others 2.
    tenants = Counter(await _tenants(clean_database, [job.id for job in jobs]))
    assert tenants == {f"t{n:02}": 4 if n == 5 else 2 for n in range(1, 16)}, tenants


async def one_job_claims(repository: JobRepository, database_url: str, count: int) -> Counter[str]:
    """`count` claims of one job each from queue `default`: how many went to each tenant."""
    served: Counter[str] = Counter()
    for _ in range(count):
        [job] = await repository.claim(["default"], "w", 1, 30)
        served.update(await _tenants(database_url, [job.id]))
    return served


async def test_claims_of_one_job_keep_sharing_between_two_tenants(
    repository: JobRepository, clean_database: str
) -> None:
    await backlog(clean_database, "early", 200)
    await backlog(clean_database, "late", 200)
    served = await one_job_claims(repository, clean_database, 1 + 100)
    # The first claim walks the queue (an early job) and learns it is shared; a fair claim's
    # window holds two tenants however small the batch, so the queue stays shared and each
    # claim of one job goes to either tenant (by the random offsets, one in two). Walked, or
    # flipping between the statements, every one would be early's.
    assert served["late"] >= 30, served
    assert served["early"] >= 30, served


async def test_a_tenant_whose_jobs_all_wait_for_a_limit_does_not_keep_the_queue_shared(
    repository: JobRepository, clean_database: str
) -> None:
    await backlog(clean_database, "busy", 200)
    for _ in range(5):
        assert await repository.insert(new_job("slow", tenant="waits"))
    limit = ConcurrencyLimit(task_type="slow", concurrency=1)
    assert await repository.set_limits("default", [limit], "test")

    await repository.claim(["default"], "w", 8, 30)
    # The walk's probe saw "waits"' ready jobs: the next claim is fair.
    assert repository._fair(["default"])
    await repository.claim(["default"], "w", 8, 30)
    # Its walks found jobs of "busy" alone ("waits"' are left to the limited claim): the
    # queue is walked again, and the probe, which still sees "waits", is not heeded for
    # SHARING_HOLD seconds, so the queue does not flip between the statements at each claim.
    assert not repository._fair(["default"])
    await repository.claim(["default"], "w", 8, 30)
    assert not repository._fair(["default"])
    # Once the hold has passed, the probe is heeded again.
    await asyncio.sleep(SHARING_HOLD)
    await repository.claim(["default"], "w", 8, 30)
    assert repository._fair(["default"])


async def test_tenants_with_only_limited_jobs_do_not_hide_the_tenants_after_them(
    repository: JobRepository, clean_database: str
) -> None:
    # Two tenants first in the window's order whose ready jobs all wait for a limit, then a
    # flood and a tenant behind it.
    for tenant in ("a-limited", "b-limited"):
        for _ in range(5):
            assert await repository.insert(new_job("slow", tenant=tenant))
    limit = ConcurrencyLimit(task_type="slow", concurrency=1)
    assert await repository.set_limits("default", [limit], "test")
    await backlog(clean_database, "flood", 300)
    await backlog(clean_database, "late", 300)
    served = await one_job_claims(repository, clean_database, 1 + 100)
    # A claim of one job looks at two tenants. A full window in which no two flows had jobs
    # to claim keeps the queue shared and moves the cursor past it, so the next window holds
    # the flood and the late tenant; unshared instead, every claim would be the flood's.
    assert served["late"] >= 20, served


async def test_weights_are_shown_recorded_persisted_and_removed(
    clean_database: str, redis_url: str
) -> None:
    weights = [{"tenant": "acme", "weight": 3.0}, {"tenant": "beta", "weight": 0.5}]
    async with serving(create_app(replica_settings(clean_database, redis_url))) as client:
        await backlog(clean_database, "acme", 1)
        reply = await client.put(
            "/queues/default/weights",
            json={"weights": weights},
            headers={"X-Jobq-Actor": "ops:bo"},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["weights"] == weights
        assert reply.json()["lastChange"]["what"] == "weights"
        assert reply.json()["lastChange"]["by"] == "ops:bo"
    async with serving(create_app(replica_settings(clean_database, redis_url))) as client:
        entry = await queue_entry(client, "default")
        assert entry["weights"] == weights
        removed = await client.put("/queues/default/weights", json={"weights": []})
        assert removed.status_code == 200 and removed.json()["weights"] == []


def weight(**fields: Any) -> dict[str, Any]:
    return {"weights": [{"tenant": "acme", **fields}]}


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        (weight(weight=0), "/weights/0/weight"),
        (weight(weight=-1), "/weights/0/weight"),
        (weight(weight=10**9), "/weights/0/weight"),
        (weight(weight="NaN"), "/weights/0/weight"),
        (weight(), "/weights/0/weight"),
        (weight(weight=2, extra=1), "/weights/0/extra"),
        ({"weights": [{"tenant": "Not A Tenant", "weight": 2}]}, "/weights/0/tenant"),
        ({"weights": [{"tenant": "a", "weight": 1}] * 2}, ""),
        ({"weights": [{"tenant": f"t{n}", "weight": 1} for n in range(1001)]}, "/weights"),
        ({"weights": {"acme": 2}}, "/weights"),
        ({}, "/weights"),
        ([], ""),
    ],
)
async def test_bad_weights_are_refused_and_change_nothing(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
    clean_database: str,
    body: Any,
    pointer: str,
) -> None:
    first, _ = replicas
    await backlog(clean_database, "acme", 1)
    reply = await first.put("/queues/default/weights", json=body)
    assert reply.status_code == 422, reply.text
    problem = reply.json()
    assert reply.headers["content-type"].startswith("application/problem+json")
    assert [error["pointer"] for error in problem["errors"]] == [pointer], problem
    entry = await queue_entry(first, "default", pending=1)
    assert entry["weights"] == [] and entry["lastChange"] is None


async def test_weights_for_an_unknown_queue_are_404(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, _ = replicas
    reply = await first.put("/queues/nosuchqueue/weights", json={"weights": []})
    assert reply.status_code == 404
    assert reply.json()["type"].endswith("queue-not-found")


async def test_only_an_admin_of_every_tenant_sets_weights_through_the_producer(
    clean_database: str, redis_url: str
) -> None:
    async with guarded_services(clean_database, redis_url, KEYS) as (producer, _):
        await backlog(clean_database, "acme", 1)
        body = {"weights": [{"tenant": "acme", "weight": 2}]}
        for key, status in ((ACME_SUBMIT, 403), (ACME_ADMIN, 403), ("wrong-key-0123456789", 401)):
            refused = await producer.put(
                "/queues/default/weights", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert refused.status_code == status, refused.text
        root = {"Authorization": f"Bearer {ROOT_KEY}"}
        allowed = await producer.put("/queues/default/weights", json=body, headers=root)
        assert allowed.status_code == 200, allowed.text
        assert allowed.json()["weights"] == [{"tenant": "acme", "weight": 2.0}]
        key_id = hashlib.sha256(ROOT_KEY.encode()).hexdigest()[:12]
        assert allowed.json()["lastChange"]["by"] == f"admin:*:key-{key_id}"
        bad = await producer.put("/queues/default/weights", json=weight(weight=0), headers=root)
        assert bad.status_code == 422, bad.text
        missing = await producer.put("/queues/nosuchqueue/weights", json=body, headers=root)
        assert missing.status_code == 404

        def through_the_client() -> Any:
            with Client(str(producer.base_url), api_key=ROOT_KEY) as client:
                state = client.set_weights("default", {"acme": 4, "beta": 0.25})
                with pytest.raises(InvalidInput):
                    client.set_weights("default", {"acme": 0})
                return state

        state = await asyncio.to_thread(through_the_client)
        assert [(w.tenant, w.weight) for w in state.weights] == [("acme", 4), ("beta", 0.25)]


def _weight(tenant: str, value: float) -> TenantWeight:
    return TenantWeight(tenant=tenant, weight=value)


async def _tenants(database_url: str, ids: list[Any]) -> list[str]:
    """The tenants of jobs `ids`, in the order of `ids`."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT id, tenant FROM job_all WHERE id = ANY($1)", ids)
    finally:
        await connection.close()
    by_id = {row["id"]: row["tenant"] for row in rows}
    return [by_id[job_id] for job_id in ids]
