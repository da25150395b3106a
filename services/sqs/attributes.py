"""SQS queue attributes: which are supported, their bounds and defaults (SQS API reference,
SetQueueAttributes), and what they mean for jobq (README.md#sqs-compatibility).

Attributes are stored as SQS states them, strings, in the queue service's `sqs_queue` table;
`jobq:`-prefixed keys are the endpoint's own bookkeeping and never shown to clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from common.contracts import MAX_ATTEMPTS_MAX
from common.sqs_registry import SQS_ATTRIBUTE_VALUE_MAX
from services.sqs.errors import (
    INVALID_ATTRIBUTE_NAME,
    INVALID_ATTRIBUTE_VALUE,
    UNSUPPORTED_OPERATION,
    SqsError,
)

INTERNAL_PREFIX = "jobq:"
PAYLOAD_LIMIT = 262_144
"""Bytes of a message (body and attributes) at most: SQS's classic 256 KiB, also jobq's
payload bound."""

_BOUNDS: dict[str, tuple[int, int, int]] = {
    # name: (lowest, highest, default)
    "DelaySeconds": (0, 900, 0),
    "MaximumMessageSize": (1024, PAYLOAD_LIMIT, PAYLOAD_LIMIT),
    "MessageRetentionPeriod": (60, 1_209_600, 345_600),
    "ReceiveMessageWaitTimeSeconds": (0, 20, 0),
    "VisibilityTimeout": (0, 43_200, 30),
}
_STORED_ONLY = frozenset({"RedriveAllowPolicy", "SqsManagedSseEnabled", "Policy"})
_FIFO_ONLY = frozenset(
    {"FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"}
)
COMPUTED = (
    "QueueArn",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
)
SETTABLE = (*_BOUNDS, "RedrivePolicy", *sorted(_STORED_ONLY))
ALL_NAMES = frozenset((*SETTABLE, *COMPUTED))


class RedrivePolicy(msgspec.Struct, forbid_unknown_fields=True):
    """SQS's RedrivePolicy JSON: after `maxReceiveCount` receives a message moves to the
    queue `deadLetterTargetArn`. `maxReceiveCount` may be a number or a numeric string."""

    deadLetterTargetArn: str
    maxReceiveCount: int | str


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """What a queue's attributes mean for its messages (seconds; bytes)."""

    visibility_timeout: int
    delay_seconds: int
    wait_seconds: int
    maximum_message_size: int
    max_receive_count: int
    """jobq's `maxAttempts` of its messages: the RedrivePolicy's maxReceiveCount, else jobq's
    largest (a queue without a dead-letter queue receives a message that often at most)."""
    dead_letter_arn: str | None


def _number(name: str, value: str) -> int:
    low, high, _ = _BOUNDS[name]
    if not value.strip().isdigit() or not low <= int(value) <= high:
        raise SqsError(
            INVALID_ATTRIBUTE_VALUE,
            f"Invalid value for the parameter {name}: must be an integer from {low} to {high}.",
        )
    return int(value)


def parse_redrive_policy(value: str) -> RedrivePolicy:
    """The RedrivePolicy; raises InvalidAttributeValue unless maxReceiveCount is 1..100 (jobq
    counts at most 100 attempts; SQS allows 1000)."""
    try:
        policy = msgspec.json.decode(value, type=RedrivePolicy)
        count = int(policy.maxReceiveCount)
    except (msgspec.DecodeError, ValueError):
        raise SqsError(
            INVALID_ATTRIBUTE_VALUE,
            "Invalid value for the parameter RedrivePolicy. Reason: it must be JSON with "
            "deadLetterTargetArn and maxReceiveCount.",
        ) from None
    if not 1 <= count <= MAX_ATTEMPTS_MAX:
        raise SqsError(
            INVALID_ATTRIBUTE_VALUE,
            f"Invalid value for the parameter RedrivePolicy. Reason: maxReceiveCount must be "
            f"1 to {MAX_ATTEMPTS_MAX} on jobq.",
        )
    return RedrivePolicy(policy.deadLetterTargetArn, count)


def check(attributes: Mapping[str, str]) -> dict[str, str]:
    """The attributes a client may set, validated; raises InvalidAttributeName for unknown or
    read-only names, UnsupportedOperation for FIFO attributes, InvalidAttributeValue for a
    value out of bounds. Checking a RedrivePolicy's target exists is the caller's job."""
    checked: dict[str, str] = {}
    for name, value in attributes.items():
        if len(value) > SQS_ATTRIBUTE_VALUE_MAX:
            raise SqsError(
                INVALID_ATTRIBUTE_VALUE,
                f"Invalid value for the parameter {name[:64]}: longer than "
                f"{SQS_ATTRIBUTE_VALUE_MAX} characters.",
            )
        if name in _FIFO_ONLY:
            raise SqsError(UNSUPPORTED_OPERATION, "FIFO queues are not supported by jobq.")
        if name in _BOUNDS:
            checked[name] = str(_number(name, value))
        elif name == "RedrivePolicy":
            if value:
                parse_redrive_policy(value)
            checked[name] = value
        elif name in _STORED_ONLY:
            checked[name] = value
        else:
            raise SqsError(INVALID_ATTRIBUTE_NAME, f"Unknown Attribute {name}.")
    return checked


def config(attributes: Mapping[str, str]) -> QueueConfig:
    """The queue's configuration from its stored attributes (defaults for the missing)."""

    def get(name: str) -> int:
        return int(attributes.get(name) or _BOUNDS[name][2])

    redrive = attributes.get("RedrivePolicy")
    policy = parse_redrive_policy(redrive) if redrive else None
    return QueueConfig(
        visibility_timeout=get("VisibilityTimeout"),
        delay_seconds=get("DelaySeconds"),
        wait_seconds=get("ReceiveMessageWaitTimeSeconds"),
        maximum_message_size=get("MaximumMessageSize"),
        max_receive_count=int(policy.maxReceiveCount) if policy else MAX_ATTEMPTS_MAX,
        dead_letter_arn=policy.deadLetterTargetArn if policy else None,
    )


def visible(attributes: Mapping[str, str]) -> dict[str, str]:
    """The stored attributes with every default filled in, bookkeeping left out."""
    shown = {name: str(bounds[2]) for name, bounds in _BOUNDS.items()}
    shown.update({k: v for k, v in attributes.items() if not k.startswith(INTERNAL_PREFIX) and v})
    return shown
