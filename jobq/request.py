"""One validated `SubmitJobRequest` from keyword arguments, shared by `Client.submit` and
`enqueue`, so both refuse bad input with the same errors the producer would return."""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

import msgspec

from common.contracts import SubmitJobRequest
from common.validation import check_payload, msgspec_error


class SubmitOptions(TypedDict, total=False):
    """Optional submit fields: `queue` ("default"), `priority` (0; higher first),
    `delay_seconds` (0), `max_attempts` (server default), `timeout_seconds` (processor or
    worker default), `idempotency_key`, and `idempotency_window_seconds`: how long the key
    blocks a different request and replays this one, in whole seconds, 1 to 2,592,000 (30
    days; `IDEMPOTENCY_WINDOW_MAX`), else the queue service's QUEUE_IDEMPOTENCY_WINDOW (7 days;
    SQS deduplicates for 5 minutes). Out of bounds raises InvalidInput
    (`/idempotencyWindowSeconds`)."""

    queue: str
    priority: int
    delay_seconds: float
    max_attempts: int | None
    timeout_seconds: int | None
    idempotency_key: str | None
    idempotency_window_seconds: int | None


_CAMEL = {
    "queue": "queue",
    "priority": "priority",
    "delay_seconds": "delaySeconds",
    "max_attempts": "maxAttempts",
    "timeout_seconds": "timeoutSeconds",
    "idempotency_key": "idempotencyKey",
    "idempotency_window_seconds": "idempotencyWindowSeconds",
}


def build_request(
    task_type: str, payload: dict[str, Any], **options: Unpack[SubmitOptions]
) -> SubmitJobRequest:
    """The request, checked against every bound of docs/architecture.md#bounds.

    Raises InvalidInput (with a JSON pointer such as `/taskType`) or PayloadTooLarge.
    """
    fields = {
        "taskType": task_type,
        "payload": payload,
        **{_CAMEL[name]: value for name, value in options.items()},
    }
    try:
        request = msgspec.convert(fields, SubmitJobRequest)
    except msgspec.ValidationError as exc:
        raise msgspec_error(str(exc)) from None
    check_payload(request.payload)
    return request
