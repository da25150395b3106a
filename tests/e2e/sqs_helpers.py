"""A stack with the SQS endpoint, and SQS clients for its keys (boto3, the AWS CLI, Celery)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3

from infra.stack import LocalStack

REGION = "jobq-local-1"
ACME_ADMIN = "acme-admin-key-0123456789abcdef"
ACME_SUBMIT = "acme-submit-key-0123456789abcdef"
BETA_ADMIN = "beta-admin-key-0123456789abcdef"
KEYS = f"admin:acme:{ACME_ADMIN},submit:acme:{ACME_SUBMIT},admin:beta:{BETA_ADMIN}"


def key_id(key: str) -> str:
    """The access key id of an API key: the first 12 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class SqsStack:
    """The running stack and its SQS endpoint."""

    stack: LocalStack

    def client(self, key: str = ACME_ADMIN, secret: str | None = None, **config: Any) -> Any:
        """A boto3 SQS client signing with `key` (and `secret`, default the key itself)."""
        return boto3.client(
            "sqs",
            endpoint_url=self.stack.sqs,
            region_name=REGION,
            aws_access_key_id=key_id(key),
            aws_secret_access_key=key if secret is None else secret,
            **config,
        )

    def aws_env(self, key: str = ACME_ADMIN) -> dict[str, str]:
        """The environment `make -s keys` gives the AWS CLI and boto3, for this stack."""
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
            "AWS_ACCESS_KEY_ID": key_id(key),
            "AWS_SECRET_ACCESS_KEY": key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_SQS": self.stack.sqs,
        }


def counts_become(read: Callable[[], dict[str, str]], expected: dict[str, str]) -> None:
    """Read the Approximate* counts until they are `expected`: they come from jobq's depth
    cache, refreshed every QUEUE_DEPTH_INTERVAL (approximate, as on SQS)."""
    seen: dict[str, str] = {}
    for _ in range(100):
        seen = read()
        if seen == expected:
            return
        time.sleep(0.2)
    raise AssertionError(f"counts stayed {seen}, expected {expected}")
