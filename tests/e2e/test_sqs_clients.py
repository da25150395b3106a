"""Real SQS clients no one here wrote, against the SQS endpoint: the AWS CLI (awscli from
PyPI) with nothing but the variables `make -s keys` exports, and Celery consuming through
kombu's SQS transport."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.sqs_helpers import SqsStack, counts_become, start_sqs_stack

AWS = Path(sys.executable).parent / "aws"


@pytest.fixture(scope="module")
async def sqs(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SqsStack]:
    async for running in start_sqs_stack(database_url, redis_url, tmp_path_factory):
        yield running


def _aws(sqs: SqsStack, *args: str) -> Any:
    """Run `aws sqs …` with the environment `make -s keys` gives; its JSON output."""
    done = subprocess.run(
        [str(AWS), "sqs", *args, "--output", "json"],
        env=sqs.aws_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_aws_cli(sqs: SqsStack) -> None:
    url = _aws(
        sqs, "create-queue", "--queue-name", "cli-queue", "--attributes", "VisibilityTimeout=60"
    )["QueueUrl"]
    assert url == f"{sqs.stack.sqs}/acme/cli-queue"
    sent = _aws(
        sqs,
        "send-message",
        "--queue-url",
        url,
        "--message-body",
        "from the CLI",
        "--message-attributes",
        '{"Kind": {"DataType": "String", "StringValue": "cli"}}',
    )
    got = _aws(
        sqs,
        "receive-message",
        "--queue-url",
        url,
        "--wait-time-seconds",
        "5",
        "--message-attribute-names",
        "All",
    )["Messages"]
    assert [(m["MessageId"], m["Body"]) for m in got] == [(sent["MessageId"], "from the CLI")]
    assert got[0]["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    attributes = _aws(sqs, "get-queue-attributes", "--queue-url", url, "--attribute-names", "All")[
        "Attributes"
    ]
    assert (
        attributes["VisibilityTimeout"],
        attributes["ApproximateNumberOfMessagesNotVisible"],
    ) == (
        "60",
        "1",
    )
    _aws(sqs, "delete-message", "--queue-url", url, "--receipt-handle", got[0]["ReceiptHandle"])
    counts_become(
        lambda: _aws(
            sqs,
            "get-queue-attributes",
            "--queue-url",
            url,
            "--attribute-names",
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
        )["Attributes"],
        {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"},
    )
    failed = subprocess.run(
        [str(AWS), "sqs", "get-queue-url", "--queue-name", "no-such-queue"],
        env=sqs.aws_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode != 0
    assert "AWS.SimpleQueueService.NonExistentQueue" in failed.stderr
