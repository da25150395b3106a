"""boto3's SQS client end to end against the SQS endpoint, the queue service and PostgreSQL
(README.md#sqs-compatibility): queues, messages, batches, visibility, digests."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from jobq import enqueue
from tests.e2e.sqs_helpers import (
    ACME_ADMIN,
    ACME_SUBMIT,
    BETA_ADMIN,
    REGION,
    SqsStack,
    counts_become,
    key_id,
)
from tests.helpers import md5_of_message_attributes


def _code(error: ClientError) -> tuple[str, str]:
    """(Error.Code, QueryErrorCode) as botocore parsed them."""
    info: dict[str, Any] = error.response["Error"]
    return info["Code"], info.get("QueryErrorCode", "")


def test_queue_lifecycle(sqs: SqsStack) -> None:
    client = sqs.client()
    url = client.create_queue(QueueName="life-orders", Attributes={"VisibilityTimeout": "45"})[
        "QueueUrl"
    ]
    assert url == f"{sqs.stack.sqs}/acme/life-orders"
    # The same declaration again is a replay; other attributes are QueueNameExists.
    assert (
        client.create_queue(QueueName="life-orders", Attributes={"VisibilityTimeout": "45"})[
            "QueueUrl"
        ]
        == url
    )
    with pytest.raises(client.exceptions.QueueNameExists) as exists:
        client.create_queue(QueueName="life-orders", Attributes={"VisibilityTimeout": "46"})
    assert _code(exists.value) == ("QueueAlreadyExists", "QueueNameExists")
    assert client.get_queue_url(QueueName="life-orders")["QueueUrl"] == url
    for name in ("life-a", "life-b", "Life_Upper"):
        client.create_queue(QueueName=name)

    listed = client.list_queues(QueueNamePrefix="life-")["QueueUrls"]
    assert listed == [f"{sqs.stack.sqs}/acme/{n}" for n in ("life-a", "life-b", "life-orders")]
    first = client.list_queues(QueueNamePrefix="life", MaxResults=2)
    assert len(first["QueueUrls"]) == 2
    rest = client.list_queues(QueueNamePrefix="life", MaxResults=2, NextToken=first["NextToken"])
    assert first["QueueUrls"] + rest["QueueUrls"] == listed  # the prefix is case-sensitive
    assert "NextToken" not in rest
    with pytest.raises(ClientError) as bad_prefix:
        client.list_queues(QueueNamePrefix="life/")
    assert _code(bad_prefix.value)[0] == "InvalidParameterValue"
    with pytest.raises(client.exceptions.QueueDoesNotExist):
        client.get_queue_url(QueueName="no such/queue")
    upper = client.list_queues(QueueNamePrefix="Life")["QueueUrls"]
    assert upper == [f"{sqs.stack.sqs}/acme/Life_Upper"]

    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "45"
    assert attributes["DelaySeconds"] == "0"
    assert attributes["QueueArn"] == "arn:aws:sqs:jobq-local-1:acme:life-orders"
    assert attributes["ApproximateNumberOfMessages"] == "0"
    client.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "5"})
    only = client.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds"])
    assert only["Attributes"] == {"DelaySeconds": "5"}
    with pytest.raises(ClientError) as bad:
        client.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "99999"})
    assert _code(bad.value)[0] == "InvalidAttributeValue"
    with pytest.raises(ClientError) as fifo:
        client.create_queue(QueueName="jobs.fifo", Attributes={"FifoQueue": "true"})
    assert _code(fifo.value)[0] == "InvalidParameterValue"

    client.delete_queue(QueueUrl=url)
    with pytest.raises(client.exceptions.QueueDoesNotExist) as gone:
        client.get_queue_url(QueueName="life-orders")
    assert _code(gone.value) == ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


def test_send_receive_delete_with_digests(sqs: SqsStack) -> None:
    client = sqs.client()
    url = client.create_queue(QueueName="digests")["QueueUrl"]
    attributes = {
        "City": {"DataType": "String", "StringValue": "Any City"},
        "Count": {"DataType": "Number", "StringValue": "12.5"},
        "Blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01binary"},
    }
    body = "héllo wörld ✓"
    sent = client.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == md5_of_message_attributes(attributes)

    got = client.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
        WaitTimeSeconds=5,
    )["Messages"]
    assert len(got) == 1
    message = got[0]
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == body
    assert message["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    assert int(message["Attributes"]["SentTimestamp"]) > 1_700_000_000_000
    # Only the attributes asked for, and the digest of those.
    only = client.receive_message(QueueUrl=url, MessageAttributeNames=["City"])
    assert "Messages" not in only  # in flight: nothing else to receive

    client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    counts_become(
        lambda: client.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"],
        {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"},
    )


def test_batches_with_partial_failures(sqs: SqsStack) -> None:
    client = sqs.client()
    url = client.create_queue(QueueName="batches")["QueueUrl"]
    reply = client.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "one"},
            {
                "Id": "bad",
                "MessageBody": "two",
                "MessageAttributes": {"AWS.reserved": {"DataType": "String", "StringValue": "x"}},
            },
            {"Id": "c", "MessageBody": "three", "DelaySeconds": 0},
        ],
    )
    assert sorted(entry["Id"] for entry in reply["Successful"]) == ["a", "c"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in reply["Failed"]] == [
        ("bad", "InvalidParameterValue", True)
    ]
    for entries, code in (
        ([{"Id": str(i), "MessageBody": "x"} for i in range(11)], "TooManyEntriesInBatchRequest"),
        ([{"Id": "same", "MessageBody": "x"}] * 2, "BatchEntryIdsNotDistinct"),
        ([{"Id": "no spaces", "MessageBody": "x"}], "InvalidBatchEntryId"),
    ):
        with pytest.raises(ClientError) as refused:
            client.send_message_batch(QueueUrl=url, Entries=entries)
        assert _code(refused.value)[1] == code

    messages = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5)[
        "Messages"
    ]
    assert sorted(m["Body"] for m in messages) == ["one", "three"]
    deleted = client.delete_message_batch(
        QueueUrl=url,
        Entries=[
            *({"Id": f"m{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)),
            {"Id": "junk", "ReceiptHandle": "not-a-handle"},
        ],
    )
    assert sorted(entry["Id"] for entry in deleted["Successful"]) == ["m0", "m1"]
    assert [(f["Id"], f["Code"]) for f in deleted["Failed"]] == [("junk", "ReceiptHandleIsInvalid")]
    assert "Messages" not in client.receive_message(QueueUrl=url, WaitTimeSeconds=0)


def _receive_one(client: Any, url: str, **extra: Any) -> dict[str, Any]:
    """Long-poll until one message arrives (the reaper returns expired leases every 200 ms)."""
    for _ in range(10):
        got = client.receive_message(QueueUrl=url, WaitTimeSeconds=5, **extra)
        if got.get("Messages"):
            message: dict[str, Any] = got["Messages"][0]
            return message
    raise AssertionError(f"no message arrived in {url}")


def test_visibility_change_and_release(sqs: SqsStack) -> None:
    client = sqs.client()
    url = client.create_queue(QueueName="visibility")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="lease me")
    first = _receive_one(client, url, VisibilityTimeout=600, MessageSystemAttributeNames=["All"])
    assert "Messages" not in client.receive_message(QueueUrl=url)
    client.change_message_visibility(
        QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=900
    )
    assert "Messages" not in client.receive_message(QueueUrl=url)
    # 0 releases the message: it can be received again at once, as its second receive.
    client.change_message_visibility(
        QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    second = _receive_one(client, url, VisibilityTimeout=600, MessageSystemAttributeNames=["All"])
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    reply = client.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "current", "ReceiptHandle": second["ReceiptHandle"], "VisibilityTimeout": 0},
            {"Id": "stale", "ReceiptHandle": first["ReceiptHandle"], "VisibilityTimeout": 0},
        ],
    )
    assert [entry["Id"] for entry in reply["Successful"]] == ["current"]
    assert [(f["Id"], f["Code"]) for f in reply["Failed"]] == [("stale", "MessageNotInflight")]
    third = _receive_one(client, url)
    client.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])


def test_receipt_handle_after_expiry(sqs: SqsStack) -> None:
    """As on SQS: an old receipt handle's delete succeeds and deletes nothing; changing its
    visibility is MessageNotInflight."""
    client = sqs.client()
    url = client.create_queue(QueueName="expiry")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="short lease")
    old = _receive_one(client, url, VisibilityTimeout=1)
    again = _receive_one(client, url, VisibilityTimeout=600)  # after the lease expired
    assert again["MessageId"] == old["MessageId"]
    client.delete_message(QueueUrl=url, ReceiptHandle=old["ReceiptHandle"])
    with pytest.raises(ClientError) as stale:
        client.change_message_visibility(
            QueueUrl=url, ReceiptHandle=old["ReceiptHandle"], VisibilityTimeout=10
        )
    assert _code(stale.value)[1] == "MessageNotInflight"
    # The message was not deleted: its current handle still releases it.
    client.change_message_visibility(
        QueueUrl=url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=0
    )
    last = _receive_one(client, url)
    assert last["MessageId"] == old["MessageId"]
    client.delete_message(QueueUrl=url, ReceiptHandle=last["ReceiptHandle"])


def test_long_poll_wakes_on_send(sqs: SqsStack) -> None:
    client, sender = sqs.client(), sqs.client()
    url = client.create_queue(QueueName="long-poll")["QueueUrl"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.receive_message, QueueUrl=url, WaitTimeSeconds=20)
        sender.send_message(QueueUrl=url, MessageBody="wake up")
        got = waiting.result()
    # One 20 s poll got the message: without the wake-up it would have ended empty, or had
    # to begin after the send.
    if "Messages" not in got:
        got = client.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    assert [m["Body"] for m in got["Messages"]] == ["wake up"]


def test_redrive_policy_to_dead_letter_queue_and_back(sqs: SqsStack) -> None:
    client = sqs.client()
    dlq = client.create_queue(QueueName="orders-dlq")["QueueUrl"]
    dlq_arn = client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})
    source = client.create_queue(QueueName="orders-main", Attributes={"RedrivePolicy": policy})[
        "QueueUrl"
    ]
    missing = json.dumps(
        {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:acme:nowhere", "maxReceiveCount": 2}
    )
    with pytest.raises(ClientError) as no_target:
        client.create_queue(QueueName="orders-other", Attributes={"RedrivePolicy": missing})
    assert _code(no_target.value)[0] == "InvalidParameterValue"
    assert client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]

    sent = client.send_message(QueueUrl=source, MessageBody="poison")["MessageId"]
    # Received twice and never deleted: its leases expire, then it is dead-lettered.
    for count in ("1", "2"):
        message = _receive_one(
            client, source, VisibilityTimeout=1, MessageSystemAttributeNames=["All"]
        )
        assert message["Attributes"]["ApproximateReceiveCount"] == count
    dead = _receive_one(client, dlq, VisibilityTimeout=600, MessageSystemAttributeNames=["All"])
    assert (dead["MessageId"], dead["Body"]) == (sent, "poison")
    assert dead["Attributes"]["ApproximateReceiveCount"] == "1"
    client.change_message_visibility(
        QueueUrl=dlq, ReceiptHandle=dead["ReceiptHandle"], VisibilityTimeout=0
    )

    task = client.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    tasks = client.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert [
        (t["TaskHandle"], t["Status"], t["ApproximateNumberOfMessagesMoved"]) for t in tasks
    ] == [(task, "COMPLETED", 1)]
    # The task's record is the endpoint's own bookkeeping: declaring the DLQ again still
    # finds it with the attributes it was created with.
    assert client.create_queue(QueueName="orders-dlq")["QueueUrl"] == dlq
    back = _receive_one(client, source, MessageSystemAttributeNames=["All"])
    assert (back["MessageId"], back["Attributes"]["ApproximateReceiveCount"]) == (sent, "1")
    client.delete_message(QueueUrl=source, ReceiptHandle=back["ReceiptHandle"])


def test_purge_queue(sqs: SqsStack) -> None:
    client = sqs.client()
    url = client.create_queue(QueueName="purged")["QueueUrl"]
    client.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(5)]
    )
    _receive_one(client, url, VisibilityTimeout=600)

    def counts() -> dict[str, str]:
        found = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return {k: v for k, v in found.items() if k.startswith("ApproximateNumberOfMessages")}

    counts_become(
        counts,
        {
            "ApproximateNumberOfMessages": "4",
            "ApproximateNumberOfMessagesNotVisible": "1",
            "ApproximateNumberOfMessagesDelayed": "0",
        },
    )
    with pytest.raises(ClientError) as submit_only:
        sqs.client(ACME_SUBMIT).purge_queue(QueueUrl=url)
    assert _code(submit_only.value)[0] == "AccessDenied"
    client.purge_queue(QueueUrl=url)
    assert "Messages" not in client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    counts_become(
        counts,
        {
            "ApproximateNumberOfMessages": "0",
            "ApproximateNumberOfMessagesNotVisible": "0",
            "ApproximateNumberOfMessagesDelayed": "0",
        },
    )


def _signed(
    sqs: SqsStack, key: str, secret: str, when: datetime, target: str = "AmazonSQS.ListQueues"
) -> httpx.Response:
    """A request signed by botocore's signer at time `when` (a skewed clock)."""
    request = AWSRequest(
        method="POST",
        url=sqs.stack.sqs + "/",
        data=b"{}",
        headers={"X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.0"},
    )
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    request.headers["X-Amz-Date"] = stamp
    request.context["timestamp"] = stamp
    signer = SigV4Auth(Credentials(key_id(key), secret), "sqs", REGION)
    canonical = signer.canonical_request(request)
    signature = signer.signature(signer.string_to_sign(request, canonical), request)
    request.headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={signer.scope(request)}, "
        f"SignedHeaders={signer.signed_headers(signer.headers_to_sign(request))}, "
        f"Signature={signature}"
    )
    return httpx.post(request.url, content=request.body, headers=dict(request.headers.items()))


def test_signatures_and_tenants(sqs: SqsStack) -> None:
    now = datetime.now(UTC)
    assert _signed(sqs, ACME_ADMIN, ACME_ADMIN, now).status_code == 200
    wrong = _signed(sqs, ACME_ADMIN, "not-the-key-0123456789", now)
    assert (wrong.status_code, wrong.json()["__type"].split("#")[1]) == (
        403,
        "SignatureDoesNotMatch",
    )
    skewed = _signed(sqs, ACME_ADMIN, ACME_ADMIN, now - timedelta(minutes=20))
    assert (skewed.status_code, skewed.json()["__type"].split("#")[1]) == (400, "RequestExpired")
    unknown = _signed(sqs, "some-other-key-0123456789abcdef", "x" * 20, now)
    assert unknown.json()["__type"].split("#")[1] == "InvalidClientTokenId"
    unsigned = httpx.post(
        sqs.stack.sqs + "/", content=b"{}", headers={"X-Amz-Target": "AmazonSQS.ListQueues"}
    )
    assert (unsigned.status_code, unsigned.json()["__type"].split("#")[1]) == (
        403,
        "MissingAuthenticationToken",
    )

    with pytest.raises(ClientError) as bad_secret:
        sqs.client(secret="wrong-secret-0123456789").list_queues()
    assert _code(bad_secret.value)[0] == "SignatureDoesNotMatch"

    acme, beta = sqs.client(), sqs.client(BETA_ADMIN)
    url = acme.create_queue(QueueName="acme-private")["QueueUrl"]
    acme.send_message(QueueUrl=url, MessageBody="acme's")
    for call in (
        lambda: beta.receive_message(QueueUrl=url),
        lambda: beta.send_message(QueueUrl=url, MessageBody="x"),
        lambda: beta.get_queue_url(QueueName="acme-private", QueueOwnerAWSAccountId="acme"),
    ):
        with pytest.raises(ClientError) as denied:
            call()
        assert _code(denied.value)[0] == "AccessDenied"
    with pytest.raises(beta.exceptions.QueueDoesNotExist):
        beta.get_queue_url(QueueName="acme-private")
    # jobq queues are shared by every tenant: the name is taken.
    with pytest.raises(beta.exceptions.QueueNameExists):
        beta.create_queue(QueueName="acme-private")
    assert url not in beta.list_queues().get("QueueUrls", [])


async def test_one_queue_system_two_doors(sqs: SqsStack) -> None:
    client = sqs.client()
    url = client.create_queue(QueueName="two-doors")["QueueUrl"]
    sent = client.send_message(QueueUrl=url, MessageBody="from boto3")["MessageId"]
    headers = {"Authorization": f"Bearer {ACME_ADMIN}"}
    async with httpx.AsyncClient(base_url=sqs.stack.producer, headers=headers) as producer:
        job = (await producer.get(f"/jobs/{sent}")).json()
        assert (job["queue"], job["taskType"], job["tenant"]) == ("two-doors", "sqs", "acme")
        assert job["payload"] == {"body": "from boto3"}
        submitted = await producer.post(
            "/jobs",
            json={"queue": "two-doors", "taskType": "resize", "payload": {"image": "a.png"}},
        )
        assert submitted.status_code == 202
        messages = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5, MessageAttributeNames=["All"]
        )["Messages"]
        by_id = {m["MessageId"]: m for m in messages}
        assert by_id[sent]["Body"] == "from boto3"
        native = by_id[submitted.json()["jobId"]]
        assert json.loads(native["Body"]) == {"image": "a.png"}
        assert native["MessageAttributes"]["jobq.taskType"]["StringValue"] == "resize"
        for message in messages:
            client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        assert (await producer.get(f"/jobs/{sent}")).json()["status"] == "COMPLETED"


def test_unsupported_and_admin_only_actions(sqs: SqsStack) -> None:
    client, submit = sqs.client(), sqs.client(ACME_SUBMIT)
    url = client.create_queue(QueueName="rules")["QueueUrl"]
    with pytest.raises(ClientError) as tags:
        client.tag_queue(QueueUrl=url, Tags={"team": "shop"})
    assert _code(tags.value) == (
        "AWS.SimpleQueueService.UnsupportedOperation",
        "UnsupportedOperation",
    )
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.cancel_message_move_task(TaskHandle="no-such-task")
    for call in (
        lambda: submit.delete_queue(QueueUrl=url),
        lambda: submit.start_message_move_task(SourceArn="arn:aws:sqs:jobq-local-1:acme:rules"),
    ):
        with pytest.raises(ClientError) as denied:
            call()
        assert _code(denied.value)[0] == "AccessDenied"
    # A submit key sends, receives and deletes.
    submit.send_message(QueueUrl=url, MessageBody="by a submit key")
    message = _receive_one(submit, url)
    submit.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    with pytest.raises(ClientError) as not_a_dlq:
        client.start_message_move_task(SourceArn="arn:aws:sqs:jobq-local-1:acme:rules")
    assert _code(not_a_dlq.value)[0] == "InvalidParameterValue"
    with pytest.raises(ClientError) as too_big:
        client.send_message(QueueUrl=url, MessageBody="x" * (256 * 1024 + 1))
    assert _code(too_big.value)[0] == "InvalidParameterValue"
    unknown = _signed(sqs, ACME_ADMIN, ACME_ADMIN, datetime.now(UTC), "AmazonSQS.Frobnicate")
    assert (unknown.status_code, unknown.json()["__type"].split("#")[1]) == (400, "InvalidAction")


async def test_transactional_send_with_the_client_library(sqs: SqsStack) -> None:
    """A message enqueued inside the application's own transaction arrives when it commits,
    and never when it rolls back."""
    client = sqs.client()
    url = client.create_queue(QueueName="transactional")["QueueUrl"]
    connection = await asyncpg.connect(sqs.stack.database_url)
    try:
        async with connection.transaction():
            await enqueue(
                connection, "sqs", {"body": "committed"}, queue="transactional", tenant="acme"
            )
        with contextlib.suppress(RuntimeError):
            async with connection.transaction():
                await enqueue(
                    connection, "sqs", {"body": "rolled back"}, queue="transactional", tenant="acme"
                )
                raise RuntimeError("the application's transaction fails")
    finally:
        await connection.close()
    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5)
    assert [m["Body"] for m in got["Messages"]] == ["committed"]
    assert "Messages" not in client.receive_message(QueueUrl=url, WaitTimeSeconds=1)
