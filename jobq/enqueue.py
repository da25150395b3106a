"""`enqueue(connection, …)`: create a job inside the caller's own transaction.

"Order saved but job never queued" cannot happen (docs/architecture.md#client-library): the job
row and its wake-up notification commit or roll back with the caller's writes, because they are
written through the caller's connection by the same statement the queue service uses
(`common.enqueue`), with the same validation. Workers long-polling the queue are woken at commit
by `pg_notify`.

Callers running at REPEATABLE READ or SERIALIZABLE must be ready to retry their transaction
on a serialization failure, as for any other write.
"""

from __future__ import annotations

import re
from typing import Any, Unpack

from common.contracts import (
    DEFAULT_MAX_ATTEMPTS,
    MAX_ATTEMPTS_MAX,
    MAX_ATTEMPTS_MIN,
    NAME_PATTERN,
    SubmitJobResponse,
)
from common.drivers import executor_for
from common.enqueue import insert_jobs, job_row
from common.errors import InvalidInput, JobqError
from common.ids import new_job_id
from jobq.request import SubmitOptions, build_request
from jobq.tracecontext import caller_trace_context


async def enqueue(
    connection: Any,
    task_type: str,
    payload: dict[str, Any],
    *,
    default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    tenant: str = "default",
    **options: Unpack[SubmitOptions],
) -> SubmitJobResponse:
    """Insert one job through `connection` (an `asyncpg.Connection` or a SQLAlchemy
    `AsyncConnection`), inside whatever transaction it has open, owned by `tenant`
    (docs/architecture.md#tenants). `options` are those of `Client.submit` (queue, priority,
    delay_seconds, max_attempts, timeout_seconds, idempotency_key, idempotency_window_seconds:
    without it the key is held for DEFAULT_IDEMPOTENCY_WINDOW, 7 days, whatever the queue
    service's QUEUE_IDEMPOTENCY_WINDOW says).

    Returns `{jobId, status}`; with an idempotency key the tenant used before for the same
    request, the existing job (a replay). Raises InvalidInput/PayloadTooLarge for input the
    producer would refuse, IdempotencyConflict when the key belongs to a different request,
    ServiceUnavailable when the job it collided with kept vanishing (retry), TypeError for a
    connection of another kind. The same path as the queue service's (`common.enqueue`).
    With OpenTelemetry in the application, the job stores the current span's W3C context,
    which its attempts' spans link to (`jobq.tracecontext`).
    """
    request = build_request(task_type, payload, **options)
    if not MAX_ATTEMPTS_MIN <= default_max_attempts <= MAX_ATTEMPTS_MAX:
        raise InvalidInput(
            f"default_max_attempts {default_max_attempts!r} is out of range",
            errors=[
                {
                    "pointer": "default_max_attempts",
                    "detail": f"must be within {MAX_ATTEMPTS_MIN}..{MAX_ATTEMPTS_MAX}",
                }
            ],
        )
    if not re.match(NAME_PATTERN, tenant):
        raise InvalidInput(
            f"tenant {tenant!r} is not a name like a queue's",
            errors=[{"pointer": "tenant", "detail": f"must match {NAME_PATTERN}"}],
        )
    row = job_row(request, new_job_id(), default_max_attempts, tenant, caller_trace_context())
    [outcome] = await insert_jobs(executor_for(connection), [row])
    if isinstance(outcome, JobqError):
        raise outcome
    return outcome.response
