"""Concurrency limits by task type (issue 18): at most N jobs of a (queue, task type) run at
once across every queue-service replica, and at most M of one tenant; other task types of the
queue are not held back; the limits live in PostgreSQL and are shown in `GET /queues`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from common.contracts import ConcurrencyLimit
from jobq import Client
from jobq.errors import InvalidInput
from services.queue.app import create_app
from services.queue.repository import JobRepository
from tests.conftest import guarded_services, serving
from tests.helpers import eventually, new_job
from tests.integration.conftest import replica_settings
from tests.integration.test_pause import ACME_ADMIN, ACME_SUBMIT, KEYS, ROOT_KEY, queue_entry


async def submit_many(
    client: httpx.AsyncClient, task_type: str, count: int, tenant: str = "default"
) -> list[str]:
    jobs = [{"taskType": task_type, "payload": {}, "queue": "hooks", "tenant": tenant}] * count
    ids: list[str] = []
    for start in range(0, count, 500):
        reply = await client.post("/jobs/batch", json={"jobs": jobs[start : start + 500]})
        assert reply.status_code == 200, reply.text
        ids += [entry["jobId"] for entry in reply.json()["results"]]
    return ids


async def put_limits(client: httpx.AsyncClient, *limits: dict[str, Any]) -> httpx.Response:
    return await client.put("/queues/hooks/limits", json={"limits": list(limits)})


def bounds(**given: Any) -> dict[str, Any]:
    """A limit as `GET /queues` shows it: the bounds `given`, every other one null."""
    every = ("concurrency", "tenantConcurrency", "rate", "burst", "tenantRate", "tenantBurst")
    return {"taskType": given.pop("taskType")} | dict.fromkeys(every) | given


class Sampler:
    """Reads the PROCESSING jobs of one task type from PostgreSQL every 10 ms, by tenant."""

    def __init__(self, database_url: str, task_type: str) -> None:
        self._url = database_url
        self._task_type = task_type
        self.samples: list[Counter[str]] = []

    async def run(self, stop: asyncio.Event) -> None:
        connection = await asyncpg.connect(self._url)
        try:
            while not stop.is_set():
                rows = await connection.fetch(
                    "SELECT tenant, count(*) AS n FROM job_all WHERE status = 'PROCESSING'"
                    " AND task_type = $1 GROUP BY tenant",
                    self._task_type,
                )
                self.samples.append(Counter({row["tenant"]: row["n"] for row in rows}))
                await asyncio.sleep(0.01)
        finally:
            await connection.close()


async def worker_slots(
    client: httpx.AsyncClient,
    name: str,
    slots: int,
    stop: asyncio.Event,
    hold: float,
    batch: int = 1,
) -> Counter[str]:
    """`slots` claimers on `client`, each claiming up to `batch` jobs at a time, holding each
    job `hold` seconds (webhook) or none (noop) and acking it; returns the task types
    completed."""
    done: Counter[str] = Counter()

    async def slot(index: int) -> None:
        while not stop.is_set():
            claim = {
                "worker": f"{name}-{index}",
                "queues": ["hooks"],
                "max": batch,
                "waitSeconds": 1,
            }
            reply = await client.post("/jobs/next", json=claim)
            if reply.status_code == 204:
                continue
            assert reply.status_code == 200, reply.text
            jobs = reply.json()["jobs"]
            for job in jobs:
                if job["taskType"] == "webhook":
                    await asyncio.sleep(hold * random.uniform(0.5, 1.5))
            # One batch ack for the claim's jobs, as a worker settles (one round trip).
            entries = [{"id": job["id"], "receiptHandle": job["receiptHandle"]} for job in jobs]
            acked = await client.post("/jobs/ack", json={"entries": entries})
            assert acked.status_code == 200, acked.text
            assert [result["status"] for result in acked.json()["results"]] == [200] * len(jobs)
            done.update(job["taskType"] for job in jobs)

    await asyncio.gather(*(slot(index) for index in range(slots)))
    return done


async def drain(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
    database_url: str,
    total: int,
    hold: float = 0.02,
    workers_per_replica: int = 1,
    slots: int = 32,
    batch: int = 1,
) -> tuple[Sampler, Counter[str]]:
    """`workers_per_replica` workers of `slots` claimers (each claiming up to `batch` jobs)
    on each replica until `total` jobs completed, sampling all the while."""
    sampler = Sampler(database_url, "webhook")
    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop))
    fleet = [
        asyncio.create_task(worker_slots(client, f"w{n}-{k}", slots, stop, hold, batch))
        for n, client in enumerate(replicas)
        for k in range(workers_per_replica)
    ]

    async def completed() -> int:
        connection = await asyncpg.connect(database_url)
        try:
            value: int = await connection.fetchval(
                "SELECT count(*) FROM job_all WHERE status = 'COMPLETED'"
            )
            return value
        finally:
            await connection.close()

    try:
        await eventually(completed, lambda n: n == total, within=120, interval=0.2, what="drain")
    finally:
        stop.set()
        counts = await asyncio.gather(*fleet)
        await sampling
    return sampler, sum(counts, Counter())


async def test_a_limit_holds_on_every_replica_and_other_task_types_run_at_full_speed(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient], clean_database: str
) -> None:
    first, second = replicas
    await submit_many(first, "webhook", 200)
    await submit_many(first, "noop", 300)
    reply = await put_limits(second, {"taskType": "webhook", "concurrency": 3})
    assert reply.status_code == 200, reply.text
    assert reply.json()["limits"] == [bounds(taskType="webhook", concurrency=3)]

    started = time.monotonic()
    sampler, done = await drain(replicas, clean_database, 500)
    assert done == {"webhook": 200, "noop": 300}
    most = max(sum(sample.values()) for sample in sampler.samples)
    assert most <= 3, f"{most} webhook jobs ran at once under a limit of 3"
    assert most == 3, "the limit's three slots were used"
    # The noop jobs did not queue behind the limited ones: they finished while the webhooks
    # were still running (200 webhooks at 3 at a time take well over a second).
    assert time.monotonic() - started > 1.0


async def test_a_tenant_limit_runs_no_two_jobs_of_one_tenant_at_once(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient], clean_database: str
) -> None:
    first, _ = replicas
    for tenant in ("acme", "globex", "initech"):
        await submit_many(first, "webhook", 40, tenant=tenant)
    reply = await put_limits(first, {"taskType": "webhook", "tenantConcurrency": 1})
    assert reply.status_code == 200, reply.text

    sampler, done = await drain(replicas, clean_database, 120)
    assert done == {"webhook": 120}
    assert max(max(sample.values(), default=0) for sample in sampler.samples) == 1
    assert max(len(sample) for sample in sampler.samples) == 3, "the three tenants ran at once"


async def claim_times(database_url: str) -> dict[str, list[float]]:
    """Every webhook job's claim time (seconds since the epoch, sorted), by tenant."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT tenant, EXTRACT(EPOCH FROM claimed_at)::float8 AS at FROM job_all"
            " WHERE task_type = 'webhook' ORDER BY claimed_at"
        )
    finally:
        await connection.close()
    times: dict[str, list[float]] = {}
    for row in rows:
        times.setdefault(row["tenant"], []).append(row["at"])
    return times


def busiest_window(times: list[float], seconds: float) -> int:
    """The most of the sorted `times` within any window of `seconds`."""
    most, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] > seconds:
            start += 1
        most = max(most, end - start + 1)
    return most


async def test_a_rate_limit_hands_out_its_rate_on_every_replica(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient], clean_database: str
) -> None:
    first, second = replicas
    await submit_many(first, "webhook", 1000)
    reply = await put_limits(first, {"taskType": "webhook", "rate": 50, "burst": 10})
    assert reply.status_code == 200, reply.text
    assert reply.json()["limits"] == [bounds(taskType="webhook", rate=50.0, burst=10)]

    # Two workers on each replica compete for the tokens, each claiming for its 8 free slots
    # as a jobq worker does (one claim asks for every free slot): a claim takes every whole
    # token there is, so the rate holds however long a claim's round trip takes on a busy host.
    _, done = await drain(
        replicas, clean_database, 1000, hold=0.001, workers_per_replica=2, slots=1, batch=8
    )
    assert done == {"webhook": 1000}
    [times] = (await claim_times(clean_database)).values()
    # The burst at once, then 50 a second: the other 990 take 19.8 s. The limit is a floor
    # (a limit each replica applied on its own would take 9.9 s); above it, a busy host only
    # adds its own delays, so the ceiling is loose.
    assert 19.8 * 0.95 <= times[-1] - times[0] < 19.8 * 1.25
    assert busiest_window(times, 0.1) <= 10 + 5
    held = (await second.get("/metrics")).text + (await first.get("/metrics")).text
    assert 'jobq_claims_held_back_total{queue="hooks",reason="rate",task_type="webhook"}' in held


async def test_a_tenant_rate_limit_holds_each_tenant_to_its_own_rate(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient], clean_database: str
) -> None:
    first, _ = replicas
    for tenant in ("acme", "globex"):
        await submit_many(first, "webhook", 30, tenant=tenant)
    limit = {"taskType": "webhook", "tenantRate": 10, "tenantBurst": 2}
    assert (await put_limits(first, limit)).status_code == 200

    _, done = await drain(replicas, clean_database, 60, hold=0.001, slots=8)
    assert done == {"webhook": 60}
    times = await claim_times(clean_database)
    assert set(times) == {"acme", "globex"}
    # Each tenant: 2 at once, then 10 a second (28 more in 2.8 s), whatever the other. The
    # limit is a floor (never faster, but for the clocks' rounding); above it, a busy host only
    # adds its own delays. One rate shared by both tenants would take 5.8 s (58 jobs after the
    # burst), for each tenant and for the whole drain: 4.5 s tells the two apart.
    for tenant_times in times.values():
        assert 2.8 * 0.95 <= tenant_times[-1] - tenant_times[0] < 4.5
        assert busiest_window(tenant_times, 0.1) <= 2 + 2
    # Both tenants ran side by side: the whole drain took about as long as one tenant's.
    every = sorted(at for tenant_times in times.values() for at in tenant_times)
    assert every[-1] - every[0] < 4.5


async def test_a_released_failed_or_expired_job_frees_its_slot_at_once(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, second = replicas
    await submit_many(first, "webhook", 5)
    assert (await put_limits(first, {"taskType": "webhook", "concurrency": 1})).status_code == 200
    claim = {"worker": "w", "queues": ["hooks"], "max": 5}

    async def claim_one(client: httpx.AsyncClient, **extra: Any) -> dict[str, Any]:
        reply = await client.post("/jobs/next", json={**claim, **extra})
        assert reply.status_code == 200, reply.text
        [job] = reply.json()["jobs"]
        return dict(job)

    job = await claim_one(first)
    assert (await second.post("/jobs/next", json=claim)).status_code == 204
    # The limit, its slots in use and its jobs waiting are gauges, refreshed with the depth.
    await eventually(
        lambda: second.get("/metrics"),
        lambda reply: (
            'jobq_concurrency_in_use{queue="hooks",task_type="webhook"} 1.0' in reply.text
            and 'jobq_concurrency_limit{queue="hooks",task_type="webhook"} 1.0' in reply.text
            and 'jobq_concurrency_waiting{queue="hooks",task_type="webhook"} 4.0' in reply.text
        ),
        what="limit gauges",
    )
    # Released (a heartbeat of 0 s): the slot is free for the next claim, on either replica.
    released = await first.post(
        f"/jobs/{job['id']}/heartbeat",
        json={"receiptHandle": job["receiptHandle"], "visibilityTimeout": 0},
    )
    assert released.status_code == 200, released.text
    job = await claim_one(second)
    # Failed, to be retried later: the slot is free.
    failed = await second.post(
        f"/jobs/{job['id']}/fail",
        json={"receiptHandle": job["receiptHandle"], "error": "boom", "retryAfterSeconds": 60},
    )
    assert failed.status_code == 200, failed.text
    # Its lease expires (a one-second visibility timeout): the slot is free without the reaper.
    job = await claim_one(first, visibilityTimeout=1)
    assert (await first.post("/jobs/next", json=claim)).status_code == 204
    await asyncio.sleep(1.2)
    expired = await eventually(
        lambda: second.post("/jobs/next", json=claim), lambda r: r.status_code == 200
    )
    assert len(expired.json()["jobs"]) == 1


async def test_limits_are_shown_recorded_persisted_and_removed(
    clean_database: str, redis_url: str
) -> None:
    limits = [bounds(taskType="webhook", concurrency=20, tenantConcurrency=3)]
    async with serving(create_app(replica_settings(clean_database, redis_url))) as client:
        await submit_many(client, "webhook", 1)
        reply = await client.put(
            "/queues/hooks/limits", json={"limits": limits}, headers={"X-Jobq-Actor": "ops:bo"}
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["lastChange"]["what"] == "limits"
        assert reply.json()["lastChange"]["by"] == "ops:bo"
        # A pause keeps the limits, and the limits keep a pause.
        assert (await client.post("/queues/hooks/pause")).json()["limits"] == limits
        assert (await put_limits(client, *limits)).json()["paused"] is True
    async with serving(create_app(replica_settings(clean_database, redis_url))) as client:
        entry = await queue_entry(client, "hooks")
        assert entry["limits"] == limits and entry["paused"] is True
        removed = await put_limits(client)
        assert removed.status_code == 200 and removed.json()["limits"] == []
        await client.post("/queues/hooks/resume")
        # No limit any more: the claim statement hands the job out at once.
        reply = await client.post("/jobs/next", json={"worker": "w", "queues": ["hooks"]})
        assert reply.status_code == 200 and len(reply.json()["jobs"]) == 1


def limit(**fields: Any) -> dict[str, Any]:
    return {"limits": [{"taskType": "webhook", **fields}]}


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        (limit(concurrency=0), "/limits/0/concurrency"),
        (limit(concurrency=-1), "/limits/0/concurrency"),
        (limit(concurrency=10**9), "/limits/0/concurrency"),
        (limit(concurrency="NaN"), "/limits/0/concurrency"),
        (limit(concurrency=2.5), "/limits/0/concurrency"),
        (limit(tenantConcurrency=0), "/limits/0/tenantConcurrency"),
        (limit(), "/limits/0"),
        (limit(concurrency=2, tenantConcurrency=3), "/limits/0"),
        (limit(concurrency=2, rate="fast"), "/limits/0/rate"),
        (limit(rate=0), "/limits/0/rate"),
        (limit(rate=10**9), "/limits/0/rate"),
        (limit(rate="NaN"), "/limits/0/rate"),
        (limit(rate=5, burst=0), "/limits/0/burst"),
        (limit(concurrency=2, burst=5), "/limits/0"),
        (limit(tenantRate=2, tenantBurst=2.5), "/limits/0/tenantBurst"),
        (limit(concurrency=2, speed=5), "/limits/0/speed"),
        ({"limits": [{"taskType": "Bad Name", "concurrency": 2}]}, "/limits/0/taskType"),
        ({"limits": [{"concurrency": 2}]}, "/limits/0/taskType"),
        ({"limits": [{"taskType": "a", "concurrency": 1}] * 2}, ""),
        ({"limits": [{"taskType": f"t{n}", "concurrency": 1} for n in range(101)]}, "/limits"),
        ({"limits": {"webhook": 2}}, "/limits"),
        ({}, "/limits"),
        ([], ""),
    ],
)
async def test_bad_limits_are_refused_and_change_nothing(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
    body: Any,
    pointer: str,
) -> None:
    first, _ = replicas
    await submit_many(first, "webhook", 1)
    reply = await first.put("/queues/hooks/limits", json=body)
    assert reply.status_code == 422, reply.text
    problem = reply.json()
    assert reply.headers["content-type"].startswith("application/problem+json")
    assert [error["pointer"] for error in problem["errors"]] == [pointer], problem
    entry = await queue_entry(first, "hooks", pending=1)
    assert entry["limits"] == [] and entry["lastChange"] is None


async def test_limits_for_an_unknown_queue_are_404(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, _ = replicas
    reply = await first.put("/queues/nosuchqueue/limits", json={"limits": []})
    assert reply.status_code == 404
    assert reply.json()["type"].endswith("queue-not-found")


async def test_only_an_admin_of_every_tenant_sets_limits_through_the_producer(
    clean_database: str, redis_url: str
) -> None:
    async with guarded_services(clean_database, redis_url, KEYS) as (producer, _):
        submitted = await producer.post(
            "/jobs",
            json={"taskType": "noop", "payload": {}, "queue": "hooks"},
            headers={"Authorization": f"Bearer {ACME_SUBMIT}"},
        )
        assert submitted.status_code == 202, submitted.text
        body = {"limits": [{"taskType": "noop", "concurrency": 2}]}
        for key, status in ((ACME_SUBMIT, 403), (ACME_ADMIN, 403), ("wrong-key-0123456789", 401)):
            refused = await producer.put(
                "/queues/hooks/limits", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert refused.status_code == status, refused.text
        root = {"Authorization": f"Bearer {ROOT_KEY}"}
        allowed = await producer.put("/queues/hooks/limits", json=body, headers=root)
        assert allowed.status_code == 200, allowed.text
        assert allowed.json()["limits"] == [bounds(taskType="noop", concurrency=2)]
        key_id = hashlib.sha256(ROOT_KEY.encode()).hexdigest()[:12]
        assert allowed.json()["lastChange"]["by"] == f"admin:*:key-{key_id}"
        bad = await producer.put("/queues/hooks/limits", json=limit(concurrency=0), headers=root)
        assert bad.status_code == 422, bad.text
        missing = await producer.put("/queues/nosuchqueue/limits", json=body, headers=root)
        assert missing.status_code == 404

        # The client library says the same with its own names.
        def through_the_client() -> Any:
            with Client(str(producer.base_url), api_key=ROOT_KEY) as client:
                state = client.set_limits("hooks", {"noop": {"tenant_concurrency": 4}})
                with pytest.raises(InvalidInput):
                    client.set_limits("hooks", {"noop": {"concurrency": 0}})
                with pytest.raises(InvalidInput):
                    client.set_limits("hooks", {"noop": {"speed": 5}})
                return state

        state = await asyncio.to_thread(through_the_client)
        assert [(limit.task_type, limit.tenant_concurrency) for limit in state.limits] == [
            ("noop", 4)
        ]


async def test_limited_jobs_are_not_starved_by_a_flow_of_unlimited_ones(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, second = replicas
    await submit_many(first, "noop", 30)
    await submit_many(first, "webhook", 3)
    elsewhere = [{"taskType": "noop", "payload": {}, "queue": "other"}] * 20
    assert (await first.post("/jobs/batch", json={"jobs": elsewhere})).status_code == 200
    assert (await put_limits(first, {"taskType": "webhook", "concurrency": 50})).status_code == 200
    # The claim statement alone would hand out the 50 earlier noop jobs first, and a steady
    # flow of them for ever; the limited jobs are claimed first, within their limit.
    claimed = []
    for client in (first, second, first):
        claim = {"worker": "w", "queues": ["other", "hooks"], "max": 1}
        reply = await client.post("/jobs/next", json=claim)
        assert reply.status_code == 200, reply.text
        claimed += [job["taskType"] for job in reply.json()["jobs"]]
    assert claimed == ["webhook"] * 3


async def test_a_claim_carrying_acks_gets_the_slot_its_acks_freed(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, _ = replicas
    await submit_many(first, "webhook", 3)
    assert (await put_limits(first, {"taskType": "webhook", "concurrency": 1})).status_code == 200
    claim: dict[str, Any] = {"worker": "w", "queues": ["hooks"], "max": 2}
    for _ in range(3):
        reply = await first.post("/jobs/next", json=claim)
        assert reply.status_code == 200, reply.text
        [job] = reply.json()["jobs"]
        claim["acks"] = [{"id": job["id"], "receiptHandle": job["receiptHandle"]}]
    reply = await first.post("/jobs/next", json=claim)
    assert reply.status_code == 200 and reply.json()["jobs"] == []
    assert [ack["status"] for ack in reply.json()["acks"]] == [200]


async def _buckets(database_url: str) -> dict[str, float]:
    """The rows of rate_bucket of queue `hooks`, tenant ('' for the pair's) to tokens at
    their last write."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT tenant, tokens FROM rate_bucket WHERE queue = 'hooks'"
        )
    finally:
        await connection.close()
    return {row["tenant"]: row["tokens"] for row in rows}


async def test_full_tenant_buckets_are_dropped_and_an_edit_is_no_refill(
    repository: JobRepository, clean_database: str
) -> None:
    for _ in range(4):
        for tenant in ("acme", "globex"):
            assert await repository.insert(new_job("webhook", "hooks", tenant=tenant))
    slow_pair = ConcurrencyLimit(
        task_type="webhook", rate=0.01, burst=3, tenant_rate=1000, tenant_burst=2
    )
    assert await repository.set_limits("hooks", [slow_pair], "test")

    first = await repository.claim_limited("hooks", "webhook", "w", 10, 30)
    # The pair's burst of 3, at most 2 of a tenant; both tenants' buckets were spent.
    assert len(first.jobs) == 3 and first.held_by == "rate"
    assert set(await _buckets(clean_database)) == {"", "acme", "globex"}
    await asyncio.sleep(0.05)  # the tenants' buckets refill (1000/s), the pair's does not
    second = await repository.claim_limited("hooks", "webhook", "w", 10, 30)
    assert second.jobs == [] and second.held_by == "rate"
    # Full again, the tenants' rows are gone (no row is a full bucket): the pair keeps rows
    # only for tenants served lately, however many it ever served.
    assert set(await _buckets(clean_database)) == {""}

    # Editing the limit (a concurrency bound added) keeps the pair's spent tokens.
    edited = ConcurrencyLimit(
        task_type="webhook", concurrency=50, rate=0.01, burst=3, tenant_rate=1000, tenant_burst=2
    )
    assert await repository.set_limits("hooks", [edited], "test")
    assert (await _buckets(clean_database))[""] < 1
    third = await repository.claim_limited("hooks", "webhook", "w", 10, 30)
    assert third.jobs == [] and third.held_by == "rate"
    # Removing the rate drops its bucket: a rate set again starts full.
    unrated = ConcurrencyLimit(task_type="webhook", concurrency=50)
    assert await repository.set_limits("hooks", [unrated], "test")
    assert await _buckets(clean_database) == {}


async def test_a_claim_held_back_by_a_tenant_at_its_concurrency_says_so(
    repository: JobRepository,
) -> None:
    for _ in range(3):
        assert await repository.insert(new_job("webhook", "hooks", tenant="acme"))
    limit = ConcurrencyLimit(task_type="webhook", tenant_concurrency=1)
    assert await repository.set_limits("hooks", [limit], "test")

    first = await repository.claim_limited("hooks", "webhook", "w", 5, 30)
    assert len(first.jobs) == 1 and first.held_by == "tenant"
    # acme is at its bound, so the walk skips it and finds nothing: still held by the tenant
    # bound, with acme's two jobs waiting.
    second = await repository.claim_limited("hooks", "webhook", "w", 5, 30)
    assert second.jobs == [] and second.held_by == "tenant"
    assert second.wait_seconds is None


@contextlib.asynccontextmanager
async def notified_replicas(
    database_url: str, redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Two replicas, the first with a depth interval far beyond a test: the safety net that
    ends its skips never fires, so only a notification can."""
    settings = replica_settings(database_url, redis_url).model_copy(
        update={"queue_depth_interval": 60.0}
    )
    async with (
        serving(create_app(settings)) as first,
        serving(create_app(replica_settings(database_url, redis_url))) as second,
    ):
        yield first, second


async def unannounced(database_url: str, task_type: str) -> None:
    """A ready job of `task_type` in queue `hooks` that no notification announced (none of
    jobq's statements makes one)."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "INSERT INTO job (id, tenant, queue, task_type, payload, status, max_attempts,"
            " visible_at) VALUES (gen_random_uuid(), 'default', 'hooks', $1, '{}',"
            " 'PENDING', 5, now())",
            task_type,
        )
    finally:
        await connection.close()


async def woken_by_a_submit(
    first: httpx.AsyncClient, second: httpx.AsyncClient, claim: dict[str, Any], task_type: str
) -> list[str]:
    """A long poll of `claim` on `first` while a job of `task_type` is submitted through
    `second` (which notifies every replica): the task types it was handed."""
    polled = asyncio.create_task(first.post("/jobs/next", json=claim | {"waitSeconds": 20}))
    await asyncio.sleep(0.5)
    await submit_many(second, task_type, 1)
    reply = await polled
    assert reply.status_code == 200, reply.text
    return [job["taskType"] for job in reply.json()["jobs"]]


async def test_a_limited_type_without_ready_jobs_is_skipped_until_one_is_notified(
    clean_database: str, redis_url: str
) -> None:
    async with notified_replicas(clean_database, redis_url) as (first, second):
        await submit_many(first, "webhook", 1)
        assert (
            await put_limits(first, {"taskType": "webhook", "concurrency": 5})
        ).status_code == 200
        claim = {"worker": "w", "queues": ["hooks"], "max": 1}
        reply = await first.post("/jobs/next", json=claim)
        assert [job["taskType"] for job in reply.json()["jobs"]] == ["webhook"]
        # Nothing of the pair waits now: this claim finds so, and the next ones skip the pair.
        assert (await first.post("/jobs/next", json=claim)).status_code == 204
        await unannounced(clean_database, "webhook")
        assert (await first.post("/jobs/next", json=claim)).status_code == 204
        # A submit through the other replica notifies every replica: the long poll wakes and
        # the pair is claimed again (the unannounced job first, in claim order).
        assert await woken_by_a_submit(first, second, claim, "webhook") == ["webhook"]


async def test_a_limit_change_waits_for_a_claim_of_the_pair_under_way(
    repository: JobRepository, clean_database: str
) -> None:
    assert await repository.insert(new_job("webhook", "hooks"))
    rated = ConcurrencyLimit(task_type="webhook", rate=1)
    assert await repository.set_limits("hooks", [rated], "test")
    claimer = await asyncpg.connect(clean_database)
    try:
        async with claimer.transaction():
            # What a claim of the pair holds while it spends the pair's tokens.
            assert await claimer.fetchval(
                "SELECT pg_try_advisory_xact_lock(hashtextextended('jobq.limit:hooks/webhook', 0))"
            )
            change = asyncio.create_task(repository.set_limits("hooks", [], "test"))
            await asyncio.sleep(0.3)
            # The change (which drops the pair's bucket) waits: the claim could otherwise
            # write its spent tokens back into a bucket just dropped.
            assert not change.done()
        assert await asyncio.wait_for(change, 10) is not None
    finally:
        await claimer.close()


async def test_a_limited_queue_without_unlimited_jobs_skips_their_claim_until_notified(
    clean_database: str, redis_url: str
) -> None:
    async with notified_replicas(clean_database, redis_url) as (first, second):
        await submit_many(first, "webhook", 3)
        assert (
            await put_limits(first, {"taskType": "webhook", "concurrency": 1})
        ).status_code == 200
        claim = {"worker": "w", "queues": ["hooks"], "max": 2}
        reply = await first.post("/jobs/next", json=claim)
        # The limit's one slot, then the unlimited claim, which finds nothing else: from now
        # on this replica skips it for the queue.
        assert [job["taskType"] for job in reply.json()["jobs"]] == ["webhook"]
        await unannounced(clean_database, "noop")
        assert (await first.post("/jobs/next", json=claim)).status_code == 204
        # The other replica never skipped it; and a notification ends this replica's skip.
        other = await second.post("/jobs/next", json=claim)
        assert [job["taskType"] for job in other.json()["jobs"]] == ["noop"]
        assert await woken_by_a_submit(first, second, claim, "noop") == ["noop"]
