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

from common.contracts import DEFAULT_MAX_ATTEMPTS, NAME_PATTERN, JobStatus, SubmitJobResponse
from common.enqueue import (
    ENQUEUE_ASYNCPG,
    ENQUEUE_NAMED,
    FIND_EXISTING_ASYNCPG,
    FIND_EXISTING_NAMED,
    JobRow,
    encode_rows,
    job_row,
)
from common.errors import IdempotencyConflict, InvalidInput, JobqError
from common.ids import new_job_id
from jobq.request import SubmitOptions, build_request


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
    delay_seconds, max_attempts, timeout_seconds, idempotency_key).

    Returns `{jobId, status}`; with an idempotency key the tenant used before for the same
    request, the existing job (a replay). Raises InvalidInput/PayloadTooLarge for input the
    producer would refuse, IdempotencyConflict when the key belongs to a different request.
    """
    request = build_request(task_type, payload, **options)
    if not re.match(NAME_PATTERN, tenant):
        raise InvalidInput(
            f"tenant {tenant!r} is not a name like a queue's",
            errors=[{"pointer": "tenant", "detail": f"must match {NAME_PATTERN}"}],
        )
    row = job_row(request, new_job_id(), default_max_attempts, tenant)
    inserted = await _insert(connection, row)
    if inserted is not None:
        return inserted
    existing = await _find_existing(connection, row)
    if existing is None:
        raise JobqError("the job collided with one that has since been deleted; retry")
    existing_id, status, fingerprint = existing
    if fingerprint != row.request_hash:
        raise IdempotencyConflict(
            f"idempotency key {row.idempotency_key!r} is already used by job {existing_id} "
            "with a different request"
        )
    return SubmitJobResponse(job_id=existing_id, status=JobStatus(status))


def _is_asyncpg(connection: Any) -> bool:
    return type(connection).__module__.startswith("asyncpg")


async def _insert(connection: Any, row: JobRow) -> SubmitJobResponse | None:
    rows_json = encode_rows([row])
    if _is_asyncpg(connection):
        found = await connection.fetchrow(ENQUEUE_ASYNCPG, rows_json)
    else:
        from sqlalchemy import text

        result = await connection.execute(text(ENQUEUE_NAMED), {"rows": rows_json})
        found = result.mappings().first()
    if found is None:
        return None
    return SubmitJobResponse(job_id=found["id"], status=JobStatus(found["status"]))


async def _find_existing(connection: Any, row: JobRow) -> tuple[Any, Any, str | None] | None:
    if _is_asyncpg(connection):
        found = await connection.fetchrow(
            FIND_EXISTING_ASYNCPG, row.id, row.idempotency_key, row.tenant
        )
    else:
        from sqlalchemy import text

        result = await connection.execute(
            text(FIND_EXISTING_NAMED),
            {"id": row.id, "key": row.idempotency_key, "tenant": row.tenant},
        )
        found = result.mappings().first()
    if found is None:
        return None
    return found["id"], found["status"], found["request_hash"]
