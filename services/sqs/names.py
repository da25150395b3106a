"""Names across the two doors: SQS queue names and jobq queue names, queue URLs, ARNs and
receipt handles (the table in README.md#sqs-compatibility).

- An SQS queue name (`A-Z a-z 0-9 - _`, 1..80) that is already a jobq queue name
  (`^[a-z0-9][a-z0-9._-]{0,63}$`) maps to itself, so `orders` is the jobq queue `orders`.
  Any other maps to its lower-cased legal characters (at most 55, leading `-`/`_` dropped)
  + `.` + the first 8 hex digits of the name's SHA-256: `MyQueue` -> `myqueue.7c903cad`. SQS
  names have no `.`, so the two kinds never collide, and the digest keeps `Orders` and
  `orders` apart.
- A queue URL is `<base>/<account>/<name>`, the account being the tenant; an ARN is
  `arn:aws:sqs:<region>:<account>:<name>`.
- A receipt handle is the job id and the lease's receipt handle, 64 hex digits.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from urllib.parse import urlsplit

from common.contracts import NAME_PATTERN
from common.sqs_registry import SQS_NAME_PATTERN
from services.sqs.errors import QUEUE_DOES_NOT_EXIST, RECEIPT_HANDLE_IS_INVALID, SqsError, invalid

_JOBQ_NAME = re.compile(NAME_PATTERN)
_SQS_NAME = re.compile(SQS_NAME_PATTERN)
_ILLEGAL = re.compile(r"[^a-z0-9_-]")
_HANDLE = re.compile(r"[0-9a-f]{64}")
_ARN = re.compile(r"arn:aws:sqs:(?P<region>[^:]+):(?P<account>[^:]+):(?P<name>[^:]+)")
FIFO_SUFFIX = ".fifo"


def jobq_queue(sqs_name: str) -> str:
    """The jobq queue the SQS queue `sqs_name` (already validated) maps to."""
    if _JOBQ_NAME.fullmatch(sqs_name):
        return sqs_name
    legal = _ILLEGAL.sub("", sqs_name.lower()).lstrip("_-")[:55] or "q"
    return f"{legal}.{hashlib.sha256(sqs_name.encode()).hexdigest()[:8]}"


def check_sqs_name(name: str) -> str:
    """`name` if it is a standard SQS queue name; raises InvalidParameterValue (FIFO names
    get UnsupportedOperation's message: FIFO queues are not offered)."""
    if name.endswith(FIFO_SUFFIX):
        raise invalid("FIFO queues (.fifo) are not supported by jobq's SQS endpoint")
    if not _SQS_NAME.fullmatch(name):
        raise invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
        )
    return name


def is_sqs_name(name: str) -> bool:
    """Whether `name` is a standard SQS queue name."""
    return _SQS_NAME.fullmatch(name) is not None


def is_account(account: str) -> bool:
    """Whether `account` can name a tenant."""
    return _JOBQ_NAME.fullmatch(account) is not None


def queue_url(base: str, account: str, name: str) -> str:
    """`<base>/<account>/<name>`."""
    return f"{base}/{account}/{name}"


def parse_queue_url(url: str) -> tuple[str, str]:
    """(account, name) of a queue URL; any scheme and host are accepted (clients reach us by
    many names). Raises QueueDoesNotExist for a path that is not `/<account>/<name>`."""
    parts = urlsplit(url).path.strip("/").split("/")
    if len(parts) != 2 or not _JOBQ_NAME.fullmatch(parts[0]) or not _SQS_NAME.fullmatch(parts[1]):
        raise SqsError(QUEUE_DOES_NOT_EXIST, "The specified queue does not exist.")
    return parts[0], parts[1]


def queue_arn(region: str, account: str, name: str) -> str:
    """`arn:aws:sqs:<region>:<account>:<name>`."""
    return f"arn:aws:sqs:{region}:{account}:{name}"


def parse_arn(arn: str) -> tuple[str, str]:
    """(account, name) of a queue ARN; raises InvalidParameterValue."""
    found = _ARN.fullmatch(arn)
    if found is None or not is_sqs_name(found["name"]) or not is_account(found["account"]):
        raise invalid(f"Value {arn} for parameter is not a queue ARN")
    return found["account"], found["name"]


def receipt_handle(job_id: uuid.UUID, lease: uuid.UUID) -> str:
    """The SQS receipt handle of a claimed job."""
    return job_id.hex + lease.hex


def parse_receipt_handle(handle: str) -> tuple[uuid.UUID, uuid.UUID]:
    """(job id, lease receipt handle); raises ReceiptHandleIsInvalid."""
    if not _HANDLE.fullmatch(handle):
        raise SqsError(
            RECEIPT_HANDLE_IS_INVALID, f'The input receipt handle "{handle[:100]}" is not valid.'
        )
    return uuid.UUID(handle[:32]), uuid.UUID(handle[32:])
