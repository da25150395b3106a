"""One validated `SubmitJobRequest` from keyword arguments, shared by `Client.submit` and
`enqueue`, so both refuse bad input with the same errors the producer would return."""

from __future__ import annotations

from typing import Any

import msgspec

from common.contracts import SubmitJobRequest
from common.validation import check_payload
from common.web import msgspec_error


def build_request(
    task_type: str,
    payload: dict[str, Any],
    *,
    queue: str = "default",
    priority: int = 0,
    delay_seconds: float = 0,
    max_attempts: int | None = None,
    timeout_seconds: int | None = None,
    idempotency_key: str | None = None,
) -> SubmitJobRequest:
    """The request, checked against every bound of DESIGN.md §5.

    Raises InvalidInput (with a JSON pointer such as `/taskType`) or PayloadTooLarge.
    """
    fields = {
        "taskType": task_type,
        "payload": payload,
        "queue": queue,
        "priority": priority,
        "delaySeconds": delay_seconds,
        "maxAttempts": max_attempts,
        "timeoutSeconds": timeout_seconds,
        "idempotencyKey": idempotency_key,
    }
    try:
        request = msgspec.convert(fields, SubmitJobRequest)
    except msgspec.ValidationError as exc:
        raise msgspec_error(str(exc)) from None
    check_payload(request.payload)
    return request
