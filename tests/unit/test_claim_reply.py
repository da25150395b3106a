"""The queue service encodes claimed jobs itself (payloads passed through as stored); what it
sends must be exactly the documented `ClaimResponse` the workers decode."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec

from common.contracts import AckResult, ClaimResponse, JobMessage
from services.queue.repository import Claimed
from services.queue.routes import encode_claimed


def test_the_claim_reply_is_the_documented_claim_response() -> None:
    job_id, handle, ack_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    stored = '{"order": 42, "items": [1, 2], "note": "caf\\u00e9 \\ud83d\\ude00"}'
    claimed = Claimed(
        id=job_id,
        task_type="webhook",
        queue="hooks",
        tenant="acme",
        payload=msgspec.Raw(stored.encode()),
        attempts=2,
        max_attempts=5,
        timeout_seconds=None,
        receipt_handle=handle,
        visibility_timeout=30,
        visible_at=now,
        idempotency_key="order-42",
    )

    reply = msgspec.json.decode(
        encode_claimed([claimed], [AckResult(id=ack_id, status=409)], ["queue", "tenant"]),
        type=ClaimResponse,
    )

    assert reply == ClaimResponse(
        jobs=[
            JobMessage(
                id=job_id,
                task_type="webhook",
                queue="hooks",
                tenant="acme",
                payload={"order": 42, "items": [1, 2], "note": "café 😀"},
                attempts=2,
                max_attempts=5,
                timeout_seconds=None,
                receipt_handle=handle,
                visibility_timeout=30,
                visible_at=now,
                idempotency_key="order-42",
            )
        ],
        acks=[AckResult(id=ack_id, status=409)],
    )
    assert b'"acks"' not in encode_claimed([claimed], []), "no acks, no field"


def test_a_claim_that_did_not_ask_for_queue_and_tenant_gets_the_earlier_reply() -> None:
    """A worker of an earlier release refuses fields it does not know and never asks for
    `queue` or `tenant`: its reply has exactly the fields it knows, so the queue service can
    be upgraded before the workers."""
    claimed = Claimed(
        id=uuid.uuid4(),
        task_type="noop",
        queue="hooks",
        tenant="acme",
        payload=msgspec.Raw(b"{}"),
        attempts=1,
        max_attempts=5,
        timeout_seconds=None,
        receipt_handle=uuid.uuid4(),
        visibility_timeout=30,
        visible_at=datetime(2026, 11, 30, 12, 0, tzinfo=UTC),
        idempotency_key=None,
    )
    earlier = {
        "id", "taskType", "payload", "attempts", "maxAttempts", "timeoutSeconds",
        "receiptHandle", "visibilityTimeout", "visibleAt", "idempotencyKey",
    }  # fmt: skip
    for names, extra in (([], set()), (["tenant"], {"tenant"}), (["queue"], {"queue"})):
        sent = msgspec.json.decode(encode_claimed([claimed], [], names))["jobs"][0]
        assert set(sent) == earlier | extra, names
    both = msgspec.json.decode(encode_claimed([claimed], [], ["tenant", "queue"]))["jobs"][0]
    assert (both["queue"], both["tenant"]) == ("hooks", "acme")


def test_a_claim_reply_with_fields_a_worker_does_not_know_still_decodes() -> None:
    """A newer queue service may add fields to the claim reply: a worker (or SQS endpoint)
    ignores them instead of failing the claim it already made; one from a queue service
    older than `queue` and `tenant` decodes without them."""
    job = {
        "id": str(uuid.uuid4()),
        "taskType": "noop",
        "payload": {},
        "attempts": 1,
        "maxAttempts": 5,
        "timeoutSeconds": None,
        "receiptHandle": str(uuid.uuid4()),
        "visibilityTimeout": 30,
        "visibleAt": "2026-11-30T12:00:00Z",
        "idempotencyKey": None,
    }
    newer = {"jobs": [{**job, "queue": "q", "tenant": "t", "futureField": [1]}], "later": 1}
    decoded = msgspec.json.decode(msgspec.json.encode(newer), type=ClaimResponse).jobs[0]
    assert (decoded.queue, decoded.tenant) == ("q", "t")
    older = msgspec.json.decode(msgspec.json.encode({"jobs": [job]}), type=ClaimResponse)
    assert (older.jobs[0].queue, older.jobs[0].tenant) == (None, None)
