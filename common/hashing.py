"""The idempotency "same request" hash of docs/architecture.md#idempotency, defined once."""

from __future__ import annotations

import hashlib

import msgspec

from common.contracts import SubmitJobRequest


def request_hash(request: SubmitJobRequest) -> str:
    """SHA-256 (hex, 64 chars) of the canonical JSON of the fields that define a job.

    Canonical: keys sorted, fixed defaults filled in; an omitted `maxAttempts` or
    `timeoutSeconds` hashes as null (never an environment-dependent default), and
    `delaySeconds` is hashed as a float so `1` and `1.0` are the same request.
    """
    canonical = {
        "queue": request.queue,
        "taskType": request.task_type,
        "payload": request.payload,
        "priority": request.priority,
        "delaySeconds": float(request.delay_seconds),
        "maxAttempts": request.max_attempts,
        "timeoutSeconds": request.timeout_seconds,
    }
    encoded = msgspec.json.encode(canonical, order="sorted")
    return hashlib.sha256(encoded).hexdigest()
