"""Wire contracts of the queue service's SQS queue registry (`/sqs/...`, internal).

The SQS endpoint (`services.sqs`) is stateless: the queues it declared, their owner tenant and
their SQS attributes live in the queue service's `sqs_queue` table, reached through these
routes (docs/architecture.md#sqs-compatibility). Attribute values are kept as SQS states them,
strings, and validated by the SQS endpoint, which owns their meaning.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from msgspec import Meta

from common.contracts import NAME_PATTERN, REDRIVE_LIMIT_MAX, Name, _Wire

SQS_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,80}(?!\n)$"
"""A standard SQS queue name: letters, digits, `-` and `_`, 1..80 characters (AWS)."""
SQS_ATTRIBUTES_MAX = 32
"""Stored attributes of one queue at most (SQS defines about 20)."""
SQS_ATTRIBUTE_VALUE_MAX = 8192
"""Characters of one stored attribute value (a RedrivePolicy JSON is a few hundred)."""
SQS_LIST_MAX = 1000
"""Queues one registry page lists at most (SQS's ListQueues `MaxResults` bound)."""

Tenant = Annotated[str, Meta(pattern=NAME_PATTERN, description="A tenant name.")]
SqsName = Annotated[str, Meta(pattern=SQS_NAME_PATTERN, description="An SQS queue name.")]
Attributes = Annotated[
    dict[
        # No NUL (PostgreSQL's jsonb cannot store it) and no lone surrogate: refused with 422.
        Annotated[str, Meta(min_length=1, max_length=64, pattern="^[^\\x00\\ud800-\\udfff]+$")],
        Annotated[
            str, Meta(max_length=SQS_ATTRIBUTE_VALUE_MAX, pattern="^[^\\x00\\ud800-\\udfff]*$")
        ],
    ],
    Meta(max_length=SQS_ATTRIBUTES_MAX),
]


class SqsQueue(_Wire):
    """One declared SQS queue: its `tenant` (the SQS account), its SQS `name`, the jobq
    `queue` its messages are jobs of, its SQS attributes (name -> string value) and when it
    was created and last changed."""

    tenant: str
    name: str
    queue: str
    attributes: dict[str, str]
    created_at: datetime
    updated_at: datetime


class SqsQueueRequest(_Wire):
    """`POST /sqs/queues`: declare `name` for `tenant` as the jobq queue `queue`, with
    `attributes`. Declaring it again answers the queue as it is (200)."""

    tenant: Tenant
    name: SqsName
    queue: Name
    attributes: Attributes


class SqsQueueReply(_Wire):
    """`POST /sqs/queues` reply: the queue as declared, and whether this call created it."""

    created: bool
    queue: SqsQueue


class SqsAttributesRequest(_Wire):
    """`PATCH /sqs/queues/{tenant}/{name}`: set these attributes (others keep their value);
    an empty value removes an attribute."""

    attributes: Attributes


class SqsQueueList(_Wire):
    """`GET /sqs/queues` page, by name; `next_name` continues after this page (None: last)."""

    items: list[SqsQueue]
    next_name: str | None


class SqsMoveRequest(_Wire):
    """`POST /sqs/move`: move up to `limit` jobs of queue `source` in `status` to queue
    `destination`, each PENDING again with its receive count reset and `max_attempts`
    attempts: dead letters into an SQS dead-letter queue, or messages moved back out of it
    (SQS StartMessageMoveTask)."""

    source: Name
    destination: Name
    status: Literal["DEAD_LETTER", "PENDING"]
    max_attempts: Annotated[int, Meta(ge=1, le=100)]
    limit: Annotated[int, Meta(ge=1, le=REDRIVE_LIMIT_MAX)] = 10_000


class SqsCountReply(_Wire):
    """How many jobs a move (`moved`) or a purge (`deleted`) touched."""

    count: int
