"""boto3's SQS client end to end against the SQS endpoint, the queue service and PostgreSQL
(README.md#sqs-compatibility): queues, messages, batches, visibility, digests."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.e2e.sqs_helpers import SqsStack, start_sqs_stack
from tests.helpers import md5_of_message_attributes


@pytest.fixture(scope="module")
async def sqs(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SqsStack]:
    async for running in start_sqs_stack(database_url, redis_url, tmp_path_factory):
        yield running


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
    assert client.create_queue(QueueName="life-orders", Attributes={"VisibilityTimeout": "45"})[
        "QueueUrl"
    ] == url
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
    upper = client.list_queues(QueueNamePrefix="Life")["QueueUrls"]
    assert upper == [f"{sqs.stack.sqs}/acme/Life_Upper"]

    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "45"
    assert attributes["DelaySeconds"] == "0"
    assert attributes["QueueArn"] == "arn:aws:sqs:us-east-1:acme:life-orders"
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
    counts = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert counts == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}


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
