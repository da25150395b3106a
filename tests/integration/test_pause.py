"""Pausing and resuming a queue (issue 18): a paused queue takes submits and hands out nothing,
on every queue-service replica, until it is resumed; the state lives in PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import httpx
import pytest

from services.queue.app import create_app
from tests.conftest import guarded_services, serving
from tests.helpers import eventually
from tests.integration.conftest import replica_settings

CLAIM = {"worker": "w", "queues": ["email"], "max": 10}


async def submit(client: httpx.AsyncClient, queue: str = "email", count: int = 1) -> list[str]:
    ids = []
    for _ in range(count):
        response = await client.post(
            "/jobs", json={"taskType": "noop", "payload": {}, "queue": queue}
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["jobId"])
    return ids


async def queue_entry(
    client: httpx.AsyncClient, queue: str, pending: int | None = None
) -> dict[str, Any]:
    """`queue`'s entry of `GET /queues`, once it is there and, when `pending` is given, shows
    that many pending jobs (the depth cache is refreshed every 0.2 s here, so a count can lag
    a change by one refresh; the pause state is read live)."""

    async def entries() -> list[dict[str, Any]]:
        queues: list[dict[str, Any]] = (await client.get("/queues")).json()["queues"]
        return [entry for entry in queues if entry["queue"] == queue]

    def listed(found: list[dict[str, Any]]) -> bool:
        return len(found) == 1 and pending in (None, found[0]["pending"])

    [entry] = await eventually(entries, listed, what=f"{queue} listed")
    return entry


async def test_a_paused_queue_takes_submits_and_hands_out_nothing_on_any_replica(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, second = replicas
    await submit(first, count=3)
    await submit(first, queue="other")

    paused = await first.post("/queues/email/pause", headers={"X-Jobq-Actor": "ops:alice"})
    assert paused.status_code == 200, paused.text
    state = paused.json()
    assert state["queue"] == "email" and state["paused"] is True and state["pausedAt"]
    assert state["lastChange"]["by"] == "ops:alice" and state["lastChange"]["what"] == "pause"

    # Submits are still taken; neither replica hands a job of the paused queue out.
    await submit(second, count=2)
    for replica in (first, second):
        claim = await replica.post("/jobs/next", json=CLAIM)
        assert claim.status_code == 204, claim.text
    # A claim over several queues still gets the running ones' jobs.
    both = await second.post("/jobs/next", json={**CLAIM, "queues": ["email", "other"]})
    assert both.status_code == 200
    assert [job["taskType"] for job in both.json()["jobs"]] == ["noop"]
    assert len(both.json()["jobs"]) == 1

    # The pause state is read live; the counts may come from the depth cache, refreshed.
    entry = await queue_entry(second, "email")
    assert entry["paused"] is True and entry["pausedAt"] == state["pausedAt"]
    assert entry["lastChange"]["by"] == "ops:alice"
    await queue_entry(second, "email", pending=5)
    assert (await queue_entry(second, "other"))["paused"] is False

    # Pausing again keeps the time it was first paused; the record names the last caller.
    again = (await second.post("/queues/email/pause")).json()
    assert again["pausedAt"] == state["pausedAt"] and again["lastChange"]["by"] == "queue-service"

    resumed = await second.post("/queues/email/resume")
    assert resumed.status_code == 200
    assert resumed.json()["paused"] is False and resumed.json()["pausedAt"] is None
    assert resumed.json()["lastChange"]["what"] == "resume"
    claim = await first.post("/jobs/next", json=CLAIM)
    assert claim.status_code == 200 and len(claim.json()["jobs"]) == 5
    assert (await queue_entry(first, "email"))["paused"] is False


async def test_a_long_poll_on_a_paused_queue_waits_then_answers_204(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, second = replicas
    await submit(first)
    await first.post("/queues/email/pause")
    started = time.monotonic()
    waited = await second.post("/jobs/next", json={**CLAIM, "waitSeconds": 1})
    assert waited.status_code == 204
    assert time.monotonic() - started >= 0.9, "a long poll waits out its time"


async def test_resume_wakes_long_polls_on_every_replica(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, second = replicas
    await submit(first, count=2)
    await first.post("/queues/email/pause")
    polls = [
        asyncio.create_task(replica.post("/jobs/next", json={**CLAIM, "max": 1, "waitSeconds": 15}))
        for replica in (first, second)
    ]
    await asyncio.sleep(0.5)
    assert not any(poll.done() for poll in polls)
    started = time.monotonic()
    await first.post("/queues/email/resume")
    answers = await asyncio.wait_for(asyncio.gather(*polls), timeout=10)
    assert [answer.status_code for answer in answers] == [200, 200]
    assert time.monotonic() - started < 5, "woken by the resume, not by their timeout"


async def test_the_pause_survives_a_restart(clean_database: str, redis_url: str) -> None:
    async with serving(create_app(replica_settings(clean_database, redis_url))) as client:
        await submit(client)
        assert (await client.post("/queues/email/pause")).status_code == 200
    async with serving(create_app(replica_settings(clean_database, redis_url))) as client:
        assert (await client.post("/jobs/next", json=CLAIM)).status_code == 204
        assert (await queue_entry(client, "email"))["paused"] is True


async def test_a_paused_queue_without_jobs_is_listed(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    first, _ = replicas
    [job_id] = await submit(first, queue="quiet")
    await first.post("/queues/quiet/pause")
    assert (await first.post(f"/jobs/{job_id}/cancel")).status_code == 200
    entry = await queue_entry(first, "quiet", pending=0)
    assert entry["paused"] is True


async def test_a_queue_whose_jobs_all_finished_can_be_paused_limited_and_weighted(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    """Finished jobs live in `job_history`, not in `job`: their queue is still known (a pause
    after the last job completed was a 404 until 2026-12-07)."""
    first, _ = replicas
    [job_id] = await submit(first, queue="drained")
    claim = {"worker": "w", "queues": ["drained"], "max": 1}
    [job] = (await first.post("/jobs/next", json=claim)).json()["jobs"]
    entry = {"id": job["id"], "receiptHandle": job["receiptHandle"]}
    acked = await first.post("/jobs/ack", json={"entries": [entry]})
    assert [result["status"] for result in acked.json()["results"]] == [200]
    assert (await first.get(f"/jobs/{job_id}")).json()["status"] == "COMPLETED"

    paused = await first.post("/queues/drained/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True
    limits = {"limits": [{"taskType": "noop", "concurrency": 1}]}
    limited = await first.put("/queues/drained/limits", json=limits)
    assert limited.status_code == 200, limited.text
    weighted = await first.put("/queues/drained/weights", json={"weights": []})
    assert weighted.status_code == 200, weighted.text
    # A queue with neither jobs nor state is still unknown.
    assert (await first.post("/queues/nosuchqueue/pause")).status_code == 404


@pytest.mark.parametrize(
    ("path", "headers", "status", "slug"),
    [
        ("/queues/nosuchqueue/pause", {}, 404, "queue-not-found"),
        ("/queues/nosuchqueue/resume", {}, 404, "queue-not-found"),
        ("/queues/Bad%20Name/pause", {}, 422, "invalid-input"),
        (f"/queues/{'q' * 65}/pause", {}, 422, "invalid-input"),
        ("/queues/email/pause", {"X-Jobq-Actor": "x" * 201}, 422, "invalid-input"),
        ("/queues/email/pause", {"X-Jobq-Actor": "tab\there"}, 422, "invalid-input"),
        ("/queues/email/pause?force=1", {}, 422, "invalid-input"),
        ("/queues/email/stop", {}, 422, "invalid-input"),
        # The router decodes %2F and collapses empty segments: still no queue name.
        ("/queues/%2Femail/pause", {}, 422, "invalid-input"),
        ("/queues/email%2F/pause", {}, 422, "invalid-input"),
    ],
)
async def test_bad_pause_requests_are_problems_that_change_nothing(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient],
    path: str,
    headers: dict[str, str],
    status: int,
    slug: str,
) -> None:
    first, _ = replicas
    await submit(first)
    response = await first.post(path, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["type"] == f"urn:jobq:problem:{slug}"
    if "X-Jobq-Actor" in headers:
        assert response.json()["errors"][0]["pointer"] == "header:X-Jobq-Actor"
    assert (await queue_entry(first, "email"))["paused"] is False
    assert (await first.post("/jobs/next", json=CLAIM)).status_code == 200


ROOT_KEY = "root-key-0123456789abcdef"
ACME_ADMIN = "acme-admin-0123456789ab"
ACME_SUBMIT = "acme-submit-0123456789a"
KEYS = f"admin:*:{ROOT_KEY},admin:acme:{ACME_ADMIN},submit:acme:{ACME_SUBMIT}"


async def test_only_an_admin_of_every_tenant_pauses_through_the_producer(
    clean_database: str, redis_url: str
) -> None:
    async with guarded_services(clean_database, redis_url, KEYS) as (producer, _):
        submitted = await producer.post(
            "/jobs",
            json={"taskType": "noop", "payload": {}, "queue": "email"},
            headers={"Authorization": f"Bearer {ACME_SUBMIT}"},
        )
        assert submitted.status_code == 202
        for key, status in ((ACME_SUBMIT, 403), (ACME_ADMIN, 403), ("wrong-key-0123456789", 401)):
            refused = await producer.post(
                "/queues/email/pause", headers={"Authorization": f"Bearer {key}"}
            )
            assert refused.status_code == status, refused.text
        root = {"Authorization": f"Bearer {ROOT_KEY}"}
        paused = await producer.post("/queues/email/pause", headers=root)
        assert paused.status_code == 200, paused.text
        key_id = hashlib.sha256(ROOT_KEY.encode()).hexdigest()[:12]
        assert paused.json()["lastChange"]["by"] == f"admin:*:key-{key_id}"
        assert ROOT_KEY not in paused.text
        missing = await producer.post("/queues/nosuchqueue/pause", headers=root)
        assert missing.status_code == 404
        resumed = await producer.post("/queues/email/resume", headers=root)
        assert resumed.status_code == 200 and resumed.json()["paused"] is False


@pytest.mark.parametrize("name", ["..", ".", "", "email/", "/email", "a b", "Email"])
def test_the_client_refuses_a_name_that_is_no_queue_name_before_sending(name: str) -> None:
    from jobq import Client
    from jobq.errors import InvalidInput

    # Nothing listens on port 9: a request sent would be ServiceUnavailable, not InvalidInput.
    with Client("http://127.0.0.1:9", api_key="unused-key-0123456789") as client:
        with pytest.raises(InvalidInput):
            client.pause(name)
        with pytest.raises(InvalidInput):
            client.resume(name)
