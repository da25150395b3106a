"""Mail that cannot be spoofed (docs/architecture.md#email): email payloads are checked when
submitted (422, not a dead letter later), a chosen sender must be allowed, recipients may be
limited to some domains, and each tenant has a send rate. Producer and queue service over
real HTTP."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx

from tests.conftest import guarded_services


@contextlib.asynccontextmanager
async def producer_with(
    database_url: str, redis_url: str, keys: str, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    async with guarded_services(database_url, redis_url, keys, **settings) as (producer, _):
        yield producer


def email(**payload: Any) -> dict[str, Any]:
    return {"taskType": "email", "payload": {"to": "a@acme.example", "subject": "S", **payload}}


def pointer_of(reply: httpx.Response) -> str:
    assert reply.status_code == 422, reply.text
    return str(reply.json()["errors"][0]["pointer"])


async def test_a_sender_must_be_allowed_and_is_checked_at_submit(
    clean_database: str, redis_url: str
) -> None:
    key = "acme-submit-key-0123456789"
    bearer = {"Authorization": f"Bearer {key}"}
    async with producer_with(
        clean_database,
        redis_url,
        f"submit:acme:{key}",
        smtp_allowed_senders="alerts@acme.example, @news.acme.example",
    ) as producer:
        spoof = {
            "taskType": "email",
            "payload": {
                "to": "victim@example.net",
                "from": "security@bank.example",
                "subject": "Password reset",
            },
        }
        assert pointer_of(await producer.post("/jobs", json=spoof, headers=bearer)) == (
            "/payload/from"
        )
        for sender in ("alerts@acme.example", "ALERTS@Acme.Example", "weekly@news.acme.example"):
            reply = await producer.post("/jobs", json=email(**{"from": sender}), headers=bearer)
            assert reply.status_code == 202, (sender, reply.text)
        for sender in ("other@acme.example", "alerts@acme.example.evil", "x@sub.news.acme.example"):
            reply = await producer.post("/jobs", json=email(**{"from": sender}), headers=bearer)
            assert pointer_of(reply) == "/payload/from", sender

        # Anyone may ask for replies to go elsewhere; the mail still comes from jobq.
        reply_to = await producer.post(
            "/jobs", json=email(replyTo="me@anywhere.example"), headers=bearer
        )
        assert reply_to.status_code == 202
        assert pointer_of(
            await producer.post("/jobs", json=email(replyTo="not an address"), headers=bearer)
        ) == ("/payload/replyTo")

        # Any email payload a worker would refuse is refused now, in batches entry by entry.
        no_subject = {"taskType": "email", "payload": {"to": "a@acme.example"}}
        assert pointer_of(await producer.post("/jobs", json=no_subject, headers=bearer)) == (
            "/payload/subject"
        )
        batch = await producer.post(
            "/jobs/batch",
            json={"jobs": [email(), spoof, email(cc="b@acme.example")]},
            headers=bearer,
        )
        results = batch.json()["results"]
        assert [r["status"] for r in results] == [202, 422, 422]
        assert results[1]["error"]["errors"][0]["pointer"] == "/jobs/1/payload/from"
        assert results[2]["error"]["errors"][0]["pointer"] == "/jobs/2/payload/cc"


async def test_recipients_may_be_limited_to_some_domains(
    clean_database: str, redis_url: str
) -> None:
    key = "acme-submit-key-0123456789"
    bearer = {"Authorization": f"Bearer {key}"}
    async with producer_with(
        clean_database,
        redis_url,
        f"submit:acme:{key}",
        smtp_allowed_recipient_domains="acme.example,partner.example",
    ) as producer:
        ok = await producer.post(
            "/jobs", json=email(to=["a@acme.example", "b@Partner.Example"]), headers=bearer
        )
        assert ok.status_code == 202, ok.text
        outside = await producer.post(
            "/jobs", json=email(to=["a@acme.example", "victim@example.net"]), headers=bearer
        )
        assert pointer_of(outside) == "/payload/to/1"


async def test_a_subject_the_worker_could_not_send_is_refused_at_submit(
    clean_database: str, redis_url: str
) -> None:
    """U+2028 and its kin were a 202, then a dead letter on the worker (issue 16 item 13)."""
    key = "acme-submit-key-0123456789"
    bearer = {"Authorization": f"Bearer {key}"}
    async with producer_with(clean_database, redis_url, f"submit:acme:{key}") as producer:
        for character in ("\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1d", "\x1b", "\x7f"):
            reply = await producer.post(
                "/jobs", json=email(subject=f"Hello{character}there"), headers=bearer
            )
            assert pointer_of(reply) == "/payload/subject", repr(character)
        batch = await producer.post(
            "/jobs/batch",
            json={"jobs": [email(subject="ok\tfine"), email(subject="a\u2028b")]},
            headers=bearer,
        )
        results = batch.json()["results"]
        assert [r["status"] for r in results] == [202, 422], results
        assert results[1]["error"]["errors"][0]["pointer"] == "/jobs/1/payload/subject"


async def test_each_tenant_has_a_send_rate(clean_database: str, redis_url: str) -> None:
    first, second = f"t{uuid.uuid4().hex[:10]}", f"t{uuid.uuid4().hex[:10]}"
    keys = f"submit:{first}:{first}-key-0123456789,submit:{second}:{second}-key-0123456789"
    headers = {t: {"Authorization": f"Bearer {t}-key-0123456789"} for t in (first, second)}
    async with producer_with(
        clean_database, redis_url, keys, smtp_tenant_rate="2/minute"
    ) as producer:
        statuses = [
            (await producer.post("/jobs", json=email(), headers=headers[first])).status_code
            for _ in range(3)
        ]
        assert statuses == [202, 202, 429]
        refused = await producer.post("/jobs", json=email(), headers=headers[first])
        assert refused.json()["type"] == "urn:jobq:problem:rate-limited"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        batch = await producer.post(
            "/jobs/batch",
            json={"jobs": [email(), {"taskType": "noop", "payload": {}}]},
            headers=headers[first],
        )
        assert [r["status"] for r in batch.json()["results"]] == [429, 202]
        # Other tenants, and other task types, are not affected.
        assert (
            await producer.post("/jobs", json=email(), headers=headers[second])
        ).status_code == 202
        metrics = (await producer.get("/metrics")).text
        assert f'jobq_rate_limited_total{{limit="email",tenant="{first}"}} 3.0' in metrics
