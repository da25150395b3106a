"""Real SQS clients no one here wrote, against the SQS endpoint: the AWS CLI (awscli from
PyPI) with nothing but the variables `make -s keys` exports, and Celery consuming through
kombu's SQS transport."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from infra.stack import ROOT
from tests.e2e import celery_app
from tests.e2e.sqs_helpers import (
    ACME_ADMIN,
    REGION,
    SqsStack,
    counts_become,
    key_id,
)

AWS = Path(sys.executable).parent / "aws"


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
    assert attributes["VisibilityTimeout"] == "60"
    assert attributes["QueueArn"] == f"arn:aws:sqs:{REGION}:acme:cli-queue"
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


def _celery_worker(sqs: SqsStack, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    log = (sqs.stack.logs / f"{name}.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.e2e.celery_app",
            "worker",
            "--pool=solo",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            "--loglevel=INFO",
            "-n",
            f"{name}@%h",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def test_celery_worker_consumes_through_jobq(sqs: SqsStack, redis_url: str) -> None:
    env = {
        **sqs.aws_env(),
        "JOBQ_SQS_BROKER": f"sqs://{key_id(ACME_ADMIN)}:{ACME_ADMIN}@127.0.0.1:{sqs.stack.sqs_port}",
        "JOBQ_SQS_REGION": REGION,
        "JOBQ_CELERY_REDIS": redis_url,
        "PYTHONPATH": str(ROOT),
    }
    # This process sends the tasks, with the same app the worker runs.
    celery_app.app.conf.broker_url = env["JOBQ_SQS_BROKER"]
    celery_app.app.conf.result_backend = redis_url
    key = uuid.uuid4().hex
    worker = _celery_worker(sqs, env, "celery1")
    try:
        assert celery_app.add.delay(2, 3).get(timeout=60) == 5
        assert celery_app.flaky.delay(f"flaky-{key}").get(timeout=60) == "ok after 2 runs"
        doomed = celery_app.dies_once.delay(f"dies-{key}")
        assert worker.wait(60) != 0, "the task killed its worker"
        worker = _celery_worker(sqs, env, "celery2")
        assert doomed.get(timeout=60) == "survived on run 2"
    finally:
        _stop(worker)
    with httpx.Client(base_url=sqs.stack.producer) as producer:
        listed = producer.get(
            "/jobs",
            params={"queue": "celery-jobs", "status": "COMPLETED", "limit": 50},
            headers={"Authorization": f"Bearer {ACME_ADMIN}"},
        ).json()["items"]
    # Every Celery message was a jobq job of the SQS door, acknowledged by DeleteMessage:
    # add, flaky's two runs (a retry is a new message), and dies_once's second delivery.
    assert len(listed) == 4
