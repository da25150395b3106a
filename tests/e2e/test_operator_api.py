"""The operator views' API on a real stack (producer → queue service → PostgreSQL): tenant-scoped
queue counts, bulk changes with their counts first, delete, purge with its confirmation,
workers, schedules and per-minute counts, and who may do what."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from infra.stack import LocalStack
from jobq.cli import cli
from jobq.client import AsyncClient, Client
from tests.conftest import own_database
from tests.e2e.conftest import E2E_SETTINGS, wait_for_status

ADMIN = "admin-acme-0123456789abcdef"
GLOBAL = "admin-all-0123456789abcdef"
SUBMIT = "submit-acme-0123456789abcdef"
OTHER = "admin-umbrella-0123456789abcdef"
KEYS = f"admin:acme:{ADMIN},admin:*:{GLOBAL},submit:acme:{SUBMIT},admin:umbrella:{OTHER}"
SCHEDULES = '[{"name":"hourly-ping","cron":"0 * * * *","taskType":"noop","queue":"timers"}]'


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
async def ops(
    postgres_base: str,
    template_database: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LocalStack]:
    """A stack with keys of two tenants, a global admin and a submit key; activity flushed
    every 200 ms so the views fill quickly. On a database of its own: the workers and
    per-minute views read rows every stack writes (a worker is listed for QUEUE_WORKER_LIVE,
    60 s, after its last claim, by name), so on the session's shared database the views
    would also show what the modules before this one left there."""
    name = f"jobq_operator_api_{os.getpid()}"
    async with own_database(postgres_base, template_database, name) as database_url:
        stack = LocalStack(
            database_url,
            redis_url,
            tmp_path_factory.mktemp("ops"),
            environment={
                **E2E_SETTINGS,
                "JOBQ_API_KEYS": KEYS,
                "QUEUE_ACTIVITY_INTERVAL": "200ms",
                "QUEUE_SCHEDULES": SCHEDULES,
                "WORKER_CONCURRENCY": "7",
            },
        )
        await stack.start()
        try:
            yield stack
        finally:
            stack.stop()


async def submit(client: httpx.AsyncClient, queue: str, n: int, key: str = ADMIN) -> list[str]:
    jobs = [{"taskType": "noop", "queue": queue, "payload": {"i": i}} for i in range(n)]
    ids: list[str] = []
    for start in range(0, n, 500):
        batch = {"jobs": jobs[start : start + 500]}
        reply = await client.post("/jobs/batch", json=batch, headers=auth(key))
        assert reply.status_code == 200, reply.text
        ids += [r["jobId"] for r in reply.json()["results"]]
    return ids


async def until(check: Any, within: float = 30) -> Any:
    """Poll the coroutine function `check` until it returns something truthy."""
    deadline = time.monotonic() + within
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_queue_counts_are_the_callers_tenants(ops: LocalStack) -> None:
    queue = f"idle-{uuid.uuid4().hex[:8]}"  # no worker serves it
    async with httpx.AsyncClient(base_url=ops.producer) as client:
        await submit(client, queue, 3)
        await submit(client, queue, 2, OTHER)
        mine = (await client.get("/queues", headers=auth(SUBMIT))).json()["queues"]
        assert [(q["queue"], q["pending"]) for q in mine if q["queue"] == queue] == [(queue, 3)]
        theirs = (await client.get("/queues", headers=auth(OTHER))).json()["queues"]
        assert [q["pending"] for q in theirs if q["queue"] == queue] == [2]

        async def everyone() -> bool:
            every = (await client.get("/queues", headers=auth(GLOBAL))).json()["queues"]
            return [q["pending"] for q in every if q["queue"] == queue] == [5]

        await until(everyone)


async def test_bulk_cancel_retry_delete_count_first(ops: LocalStack) -> None:
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=ops.producer, timeout=60) as client:
        await submit(client, queue, 1200)  # more than two chunks of 500
        await submit(client, queue, 5, OTHER)
        body = {"action": "cancel", "queue": queue, "dryRun": True}
        dry = (await client.post("/jobs/bulk", json=body, headers=auth(ADMIN))).json()
        assert dry == {"action": "cancel", "matched": 1200, "changed": 0, "dryRun": True}
        body["dryRun"] = False
        done = (await client.post("/jobs/bulk", json=body, headers=auth(ADMIN))).json()
        assert (done["matched"], done["changed"]) == (1200, 1200)
        # The other tenant's jobs in the same queue were not touched.
        theirs = (await client.get("/queues", headers=auth(OTHER))).json()["queues"]
        assert [q["pending"] for q in theirs if q["queue"] == queue] == [5]
        retry = {"action": "retry", "queue": queue, "status": "CANCELLED", "limit": 10}
        again = (await client.post("/jobs/bulk", json=retry, headers=auth(ADMIN))).json()
        assert (again["matched"], again["changed"]) == (10, 10)
        delete = {"action": "delete", "queue": queue}
        gone = (await client.post("/jobs/bulk", json=delete, headers=auth(ADMIN))).json()
        assert gone["changed"] == 1190
        left = (await client.get("/queues", headers=auth(ADMIN))).json()["queues"]
        assert [q["pending"] for q in left if q["queue"] == queue] == [10]
        # A status the action never applies to is refused, naming the field.
        bad = {"action": "retry", "status": "PENDING"}
        refused = await client.post("/jobs/bulk", json=bad, headers=auth(ADMIN))
        assert refused.status_code == 422
        assert refused.json()["errors"][0]["pointer"] == "/status"
        # A submit key reads but never acts.
        forbidden = await client.post("/jobs/bulk", json=delete, headers=auth(SUBMIT))
        assert forbidden.status_code == 403


async def test_look_up_a_job_by_its_idempotency_key(ops: LocalStack) -> None:
    key = f"order-{uuid.uuid4()}"
    async with httpx.AsyncClient(base_url=ops.producer) as client:
        body = {"taskType": "noop", "queue": "idle-keys", "payload": {}, "idempotencyKey": key}
        job = (await client.post("/jobs", json=body, headers=auth(ADMIN))).json()["jobId"]
        found = await client.get("/jobs", params={"idempotencyKey": key}, headers=auth(ADMIN))
        assert [j["id"] for j in found.json()["items"]] == [job]
        # Keys are per tenant: another tenant's admin finds nothing under it.
        other = await client.get("/jobs", params={"idempotencyKey": key}, headers=auth(OTHER))
        assert other.json()["items"] == []
        page = await client.get("/jobs", params={"idempotencyKey": ""}, headers=auth(ADMIN))
        assert page.status_code == 422


async def test_delete_a_finished_job_only(ops: LocalStack) -> None:
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=ops.producer) as client:
        [job] = await submit(client, queue, 1)
        live = await client.delete(f"/jobs/{job}", headers=auth(ADMIN))
        assert live.status_code == 409 and "PENDING" in live.json()["detail"]
        assert (await client.delete(f"/jobs/{job}", headers=auth(OTHER))).status_code == 404
        await client.post(f"/jobs/{job}/cancel", headers=auth(ADMIN))
        assert (await client.delete(f"/jobs/{job}", headers=auth(ADMIN))).status_code == 204
        assert (await client.get(f"/jobs/{job}", headers=auth(ADMIN))).status_code == 404


async def test_purge_needs_the_queues_name(ops: LocalStack) -> None:
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=ops.producer) as client:
        await submit(client, queue, 4)
        path = f"/queues/{queue}/pending/purge"
        wrong = await client.post(path, json={"confirm": "default"}, headers=auth(GLOBAL))
        assert wrong.status_code == 422 and wrong.json()["errors"][0]["pointer"] == "/confirm"
        dry = await client.post(path, json={"confirm": queue, "dryRun": True}, headers=auth(GLOBAL))
        assert dry.json()["matched"] == 4 and dry.json()["deleted"] == 0
        done = await client.post(path, json={"confirm": queue}, headers=auth(GLOBAL))
        assert done.json()["deleted"] == 4


async def test_workers_schedules_and_throughput(ops: LocalStack) -> None:
    # claimedLastMinute weighs the previous minute's claims by what is left of the current
    # one (services/queue/activity.py), so claims made in a minute's last seconds read 0 soon
    # after the next begins: start early in a minute, so the claims and the read share it.
    into_minute = time.time() % 60
    if into_minute >= 30:
        await asyncio.sleep(60.5 - into_minute)
    async with httpx.AsyncClient(base_url=ops.producer) as client:
        jobs = await submit(client, "default", 20, GLOBAL)
        for job in jobs:
            await wait_for_status(client, job, {"COMPLETED"}, headers=auth(GLOBAL))

        async def completed() -> list[Any]:
            reply = (await client.get("/throughput", headers=auth(GLOBAL))).json()
            return [p for p in reply["points"] if p["queue"] == "default" and p["completed"] >= 20]

        await until(completed)

        async def seen() -> list[Any]:
            reply = (await client.get("/workers", headers=auth(GLOBAL))).json()
            return [w for w in reply["workers"] if w["name"] == "worker1"]

        [worker] = await until(seen)
        assert worker["queues"] == ["default"] and worker["slotsTotal"] == 7
        assert worker["claimedLastMinute"] >= 1
        assert (await client.get("/workers", headers=auth(SUBMIT))).status_code == 403
        [schedule] = (await client.get("/schedules", headers=auth(GLOBAL))).json()["schedules"]
        assert schedule["name"] == "hourly-ping" and schedule["cron"] == "0 * * * *"
        assert schedule["nextFireAt"].endswith(":00:00Z") or "+00:00" in schedule["nextFireAt"]
        # A tenant sees the counts of the queues it has jobs in only.
        mine = (await client.get("/throughput", headers=auth(OTHER))).json()["points"]
        assert all(p["queue"] != "default" for p in mine)


def jobq(stack: LocalStack, key: str, *args: str, code: int = 0, stdin: str | None = None) -> Any:
    """Run `jobq --url <producer> --api-key KEY ARGS` in process; assert its exit code."""
    result = CliRunner().invoke(
        cli, ["--url", stack.producer, "--api-key", key, *args], input=stdin, env={"COLUMNS": "160"}
    )
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return result


async def test_command_line_views_and_filters(ops: LocalStack) -> None:
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=ops.producer) as client:
        await submit(client, queue, 30)
    [reply] = [json.loads(jobq(ops, ADMIN, "--json", "queues").stdout)]
    assert [q["pending"] for q in reply["queues"] if q["queue"] == queue] == [30]
    assert queue in jobq(ops, ADMIN, "queues").stdout

    async def listed() -> bool:
        workers = json.loads(jobq(ops, GLOBAL, "--json", "workers").stdout)["workers"]
        return "worker1" in [w["name"] for w in workers]

    await until(listed)  # seen from its first claim on (a long poll of up to 2 s)
    assert "worker1" in jobq(ops, GLOBAL, "workers").stdout
    assert "hourly-ping" in jobq(ops, GLOBAL, "schedules").stdout
    # A tenant's admin sees its queues counted now; a global admin sees the workers too.
    assert queue in jobq(ops, ADMIN, "top", "--frames", "2", "--interval", "0.2").stdout
    assert "worker1" in jobq(ops, GLOBAL, "top", "--frames", "1").stdout
    # By filter: a dry run counts, the confirmation states the count, `no` changes nothing.
    dry = jobq(ops, ADMIN, "cancel", "--filter", f"queue={queue}", "--dry-run").stdout
    assert "would cancel 30 jobs" in dry
    refused = jobq(ops, ADMIN, "cancel", "--filter", f"queue={queue}", code=2, stdin="n\n")
    assert "cancel 30 jobs?" in refused.output
    done = jobq(ops, ADMIN, "--json", "cancel", "--filter", f"queue={queue}", "--limit", "20",
                "--yes")  # fmt: skip
    assert json.loads(done.stdout)["changed"] == 20
    again = jobq(ops, ADMIN, "retry", "--filter", f"queue={queue}", "--filter",
                 "status=cancelled", stdin="y\n")  # fmt: skip
    assert "retry: 20 of 20 jobs" in again.stdout
    # Bad input is a usage error with a message, never a traceback.
    bad = jobq(ops, ADMIN, "retry", "--filter", "colour=red", code=2)
    assert "use status=STATUS" in bad.output
    assert "not both" in jobq(ops, ADMIN, "retry", str(uuid.uuid4()), "--filter", "queue=a",
                              code=2).output  # fmt: skip
    assert "at least one --filter" in jobq(ops, ADMIN, "cancel", code=2).output


async def test_async_client_operator_methods(ops: LocalStack) -> None:
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    async with AsyncClient(ops.producer, api_key=ADMIN) as client:
        created = await client.submit("noop", {}, queue=queue)
        await client.cancel(created.job_id)
        counted = await client.bulk("delete", queue=queue, dry_run=True)
        assert (counted.matched, counted.changed) == (1, 0)
        await client.delete(created.job_id)
        assert all(q.queue != queue for q in (await client.queues()).queues)
    with Client(ops.producer, api_key=GLOBAL) as sync:
        assert sync.purge(queue, confirm=queue, dry_run=True).matched == 0
        assert sync.throughput(5).minutes == 5
