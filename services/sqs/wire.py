"""Request shapes of the SQS actions (AWS JSON 1.0: PascalCase members), decoded with msgspec.

Bounds are SQS's (API reference); members jobq does not use (tags, MessageSystemAttributes,
ReceiveRequestAttemptId) are accepted and ignored, as SQS ignores what a standard queue does
not use. Unknown members are ignored too, so a newer SDK's additions do not break requests.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from services.sqs.errors import MISSING_PARAMETER, SqsError, invalid

BATCH_MAX = 10
"""Entries of one SQS batch at most."""
RECEIVE_MAX = 10
"""Messages of one ReceiveMessage at most."""

VisibilityTimeout = Annotated[int, Meta(ge=0, le=43_200)]
DelaySeconds = Annotated[int, Meta(ge=0, le=900)]


class _Request(msgspec.Struct, kw_only=True, rename="pascal"):
    """Base of the action requests."""


class AttributeValue(msgspec.Struct, kw_only=True, rename="pascal"):
    """A message attribute: `DataType` and a string or a base64 binary value."""

    data_type: str
    string_value: str | None = None
    binary_value: str | None = None
    string_list_values: list[str] | None = None
    binary_list_values: list[str] | None = None


class QueueRequest(_Request):
    """Every action on one queue names it by URL."""

    queue_url: str


class CreateQueue(_Request):
    queue_name: str
    attributes: dict[str, str] = {}
    tags: dict[str, str] | None = msgspec.field(default=None, name="tags")


class GetQueueUrl(_Request):
    queue_name: str
    queue_owner_aws_account_id: str | None = msgspec.field(
        default=None, name="QueueOwnerAWSAccountId"
    )


class ListQueues(_Request):
    queue_name_prefix: str = ""
    next_token: str | None = None
    max_results: Annotated[int, Meta(ge=1, le=1000)] | None = None


class GetQueueAttributes(QueueRequest):
    attribute_names: list[str] = []


class SetQueueAttributes(QueueRequest):
    attributes: dict[str, str]


class _Message(_Request):
    """What a message to send carries."""

    message_body: str
    delay_seconds: DelaySeconds | None = None
    message_attributes: dict[str, AttributeValue] = {}
    message_system_attributes: dict[str, Any] | None = None
    message_deduplication_id: str | None = None
    message_group_id: str | None = None


class SendMessage(_Message, kw_only=True):
    queue_url: str


class SendEntry(_Message, kw_only=True):
    id: str


class SendMessageBatch(QueueRequest):
    entries: list[SendEntry]


class ReceiveMessage(QueueRequest):
    max_number_of_messages: Annotated[int, Meta(ge=1, le=RECEIVE_MAX)] = 1
    wait_time_seconds: Annotated[int, Meta(ge=0, le=20)] | None = None
    visibility_timeout: VisibilityTimeout | None = None
    attribute_names: list[str] = []
    message_system_attribute_names: list[str] = []
    message_attribute_names: list[str] = []
    receive_request_attempt_id: str | None = None


class DeleteMessage(QueueRequest):
    receipt_handle: str


class DeleteEntry(_Request):
    id: str
    receipt_handle: str


class DeleteMessageBatch(QueueRequest):
    entries: list[DeleteEntry]


class ChangeMessageVisibility(QueueRequest):
    receipt_handle: str
    visibility_timeout: VisibilityTimeout


class VisibilityEntry(_Request):
    id: str
    receipt_handle: str
    visibility_timeout: VisibilityTimeout


class ChangeMessageVisibilityBatch(QueueRequest):
    entries: list[VisibilityEntry]


class ListDeadLetterSourceQueues(QueueRequest):
    next_token: str | None = None
    max_results: Annotated[int, Meta(ge=1, le=1000)] | None = None


class StartMessageMoveTask(_Request):
    source_arn: str
    destination_arn: str | None = None
    max_number_of_messages_per_second: Annotated[int, Meta(ge=1, le=500)] | None = None


class ListMessageMoveTasks(_Request):
    source_arn: str
    max_results: Annotated[int, Meta(ge=1, le=10)] | None = None


class CancelMessageMoveTask(_Request):
    task_handle: str


def decode_request(body: bytes, shape: type[_Request]) -> Any:
    """`body` decoded as `shape`; raises MissingParameter for a missing required member,
    InvalidParameterValue for anything else wrong (msgspec's message names the member)."""
    try:
        return msgspec.json.decode(body or b"{}", type=shape)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if text.startswith("Object missing required field"):
            member = text.split("`")[1] if "`" in text else "?"
            raise SqsError(
                MISSING_PARAMETER, f"The request must contain the parameter {member}."
            ) from None
        raise invalid(f"Invalid request: {text}") from None
    except msgspec.DecodeError as exc:
        raise invalid(f"The request body is not JSON: {exc}") from None
