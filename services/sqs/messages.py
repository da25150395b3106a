"""SQS messages as jobq jobs and back (pure logic; the table in README.md#sqs-compatibility).

A message sent over SQS becomes a job of task type `sqs` whose payload is
`{"body": "<MessageBody>", "attributes": {<MessageAttributes as SQS states them>}}`
(`attributes` only when there are some); its job id is the MessageId. A job received over
SQS whose payload is not of that shape (submitted with jobq's own API) arrives with the
payload's JSON text as its body and its task type as the String attribute `jobq.taskType`.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
import uuid
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec

from common.contracts import JobMessage
from services.sqs import digests, names
from services.sqs.context import SQS_TASK_TYPE
from services.sqs.errors import invalid
from services.sqs.wire import AttributeValue

ATTRIBUTES_MAX = 10
TASK_TYPE_ATTRIBUTE = "jobq.taskType"
_ATTRIBUTE_NAME = re.compile(r"(?!\.)(?!.*\.\.)(?!.*\.$)[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\.[A-Za-z0-9_.-]{1,249})?")
# The characters SQS allows in a body or a string value (SQS API reference, SendMessage).
_ILLEGAL_TEXT = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
SYSTEM_ATTRIBUTES = (
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
)


def check_body(body: str) -> str:
    """`body` if SQS would take it; raises InvalidParameterValue (empty) or
    InvalidMessageContents (a character SQS does not allow)."""
    if not body:
        raise invalid("The request must contain the parameter MessageBody.")
    if _ILLEGAL_TEXT.search(body):
        raise invalid("Invalid binary character in the message body (InvalidMessageContents).")
    return body


def check_attributes(attributes: Mapping[str, AttributeValue]) -> dict[str, dict[str, str]]:
    """The message attributes in SQS's wire shape, validated; their size in bytes counts
    towards the message's. Raises InvalidParameterValue."""
    if len(attributes) > ATTRIBUTES_MAX:
        raise invalid(f"Number of message attributes [{len(attributes)}] exceeds the allowed 10.")
    checked: dict[str, dict[str, str]] = {}
    for name, value in attributes.items():
        if not _ATTRIBUTE_NAME.fullmatch(name) or name.lower().startswith(("aws.", "amazon.")):
            raise invalid(f"Message attribute name '{name}' is invalid.")
        if not _DATA_TYPE.fullmatch(value.data_type):
            raise invalid(f"The type of message attribute '{name}' is invalid.")
        if value.string_list_values or value.binary_list_values:
            raise invalid(f"Message attribute '{name}': list values are not supported.")
        kind = value.data_type.split(".", 1)[0]
        if kind == "Binary":
            checked[name] = {"DataType": value.data_type, "BinaryValue": _binary(name, value)}
            continue
        if not value.string_value:
            raise invalid(f"Message attribute '{name}' must contain a non-empty value.")
        if _ILLEGAL_TEXT.search(value.string_value):
            raise invalid(f"Message attribute '{name}' has an invalid character.")
        if kind == "Number":
            _number(name, value.string_value)
        checked[name] = {"DataType": value.data_type, "StringValue": value.string_value}
    return checked


def _binary(name: str, value: AttributeValue) -> str:
    try:
        if value.binary_value and base64.b64decode(value.binary_value, validate=True):
            return value.binary_value
    except (binascii.Error, ValueError):
        pass
    raise invalid(f"Message attribute '{name}' must contain a non-empty base64 BinaryValue.")


def _number(name: str, text: str) -> None:
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise invalid(f"Message attribute '{name}' is not a valid Number.") from None
    if not number.is_finite() or len(text) > 38 + 2:
        raise invalid(f"Message attribute '{name}' is out of the Number range.")


def size_of(body: str, attributes: Mapping[str, Mapping[str, str]]) -> int:
    """Bytes SQS counts for a message: the body's, and each attribute's name, type and
    value."""
    size = len(body.encode())
    for name, value in attributes.items():
        size += len(name.encode()) + len(value["DataType"].encode())
        if "BinaryValue" in value:
            size += len(base64.b64decode(value["BinaryValue"]))
        else:
            size += len(value["StringValue"].encode())
    return size


def payload_of(body: str, attributes: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The job payload of a message."""
    payload: dict[str, Any] = {"body": body}
    if attributes:
        payload["attributes"] = dict(attributes)
    return payload


def sent_reply(job_id: uuid.UUID, body: str, attributes: Mapping[str, Any]) -> dict[str, str]:
    """SendMessage's reply members for a message (MessageId and its digests)."""
    reply = {"MessageId": str(job_id), "MD5OfMessageBody": digests.md5_of_body(body)}
    md5 = digests.md5_of_attributes(attributes)
    if md5 is not None:
        reply["MD5OfMessageAttributes"] = md5
    return reply


def _body_and_attributes(job: JobMessage) -> tuple[str, dict[str, Any]]:
    payload = job.payload
    body = payload.get("body")
    attributes = payload.get("attributes", {})
    if (
        job.task_type == SQS_TASK_TYPE
        and isinstance(body, str)
        and isinstance(attributes, dict)
        and payload.keys() <= {"body", "attributes"}
    ):
        return body, attributes
    text = msgspec.json.encode(payload).decode()
    return text, {TASK_TYPE_ATTRIBUTE: {"DataType": "String", "StringValue": job.task_type}}


def _wanted(name: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        if pattern in ("All", ".*") or pattern == name:
            return True
        if pattern.endswith(".*") and name.startswith(pattern[:-1]):
            return True
    return False


def received(
    job: JobMessage, sender: str, system_names: list[str], attribute_names: list[str]
) -> dict[str, Any]:
    """The SQS Message of a claimed job: body, digests, the requested system attributes
    (`system_names`: All or names of SYSTEM_ATTRIBUTES) and message attributes
    (`attribute_names`: All, `.*`, `prefix.*` or names)."""
    body, attributes = _body_and_attributes(job)
    message: dict[str, Any] = {
        "MessageId": str(job.id),
        "ReceiptHandle": names.receipt_handle(job.id, job.receipt_handle),
        "MD5OfBody": digests.md5_of_body(body),
        "Body": body,
    }
    now_ms = str(int(time.time() * 1000))
    system = {
        "SenderId": sender,
        # Job ids are UUIDv7: their first 48 bits are the send time in milliseconds.
        "SentTimestamp": str(job.id.int >> 80),
        "ApproximateReceiveCount": str(job.attempts),
        # jobq keeps no first-receive time: later receives report their own time.
        "ApproximateFirstReceiveTimestamp": now_ms,
    }
    chosen = {k: v for k, v in system.items() if "All" in system_names or k in system_names}
    if chosen:
        message["Attributes"] = chosen
    shown = {k: v for k, v in attributes.items() if _wanted(k, attribute_names)}
    if shown:
        message["MessageAttributes"] = shown
        message["MD5OfMessageAttributes"] = digests.md5_of_attributes(shown)
    return message
