"""The errors `Client` and `enqueue` raise, for an application to catch: `from jobq.errors
import JobNotFound`.

They are the services' own `common.errors` classes (one family, `JobqError`, each with its
HTTP `status` and problem `slug`), re-exported here because the client distribution installs
only the `jobq` namespace (its copy of the pure core is the private `jobq._core`). A test
(tests/unit/test_packaging.py) keeps this list equal to the classes `common.errors` defines.
"""

from __future__ import annotations

from common.errors import (
    DeadlineExceeded,
    Forbidden,
    IdempotencyConflict,
    InvalidInput,
    InvalidState,
    JobNotFound,
    JobqError,
    MalformedRequest,
    OutcomeUnknown,
    PayloadTooLarge,
    QueueExists,
    QueueNotFound,
    RateLimited,
    ServiceUnavailable,
    StaleReceiptHandle,
    Unauthorized,
    UpstreamMisconfigured,
)

__all__ = [
    "DeadlineExceeded",
    "Forbidden",
    "IdempotencyConflict",
    "InvalidInput",
    "InvalidState",
    "JobNotFound",
    "JobqError",
    "MalformedRequest",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "QueueExists",
    "QueueNotFound",
    "RateLimited",
    "ServiceUnavailable",
    "StaleReceiptHandle",
    "Unauthorized",
    "UpstreamMisconfigured",
]
