"""Query-string parameters of `GET /jobs`, with the bounds of docs/architecture.md#bounds,
shared by both services so validation and OpenAPI agree."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from litestar import Request
from litestar.params import QueryParameter

from common.contracts import (
    IDEMPOTENCY_KEY_MAX_BYTES,
    LIST_LIMIT_DEFAULT,
    LIST_LIMIT_MAX,
    LIST_PAGE_MAX_BYTES,
    NAME_PATTERN,
    WAIT_SECONDS_MAX,
    JobStatus,
    ListView,
)
from common.operations import THROUGHPUT_MINUTES_MAX
from common.web.query_params import unknown_parameters_error

StatusFilter = Annotated[JobStatus | None, QueryParameter(description="Only jobs in this state.")]
QueueFilter = Annotated[
    str | None, QueryParameter(pattern=NAME_PATTERN, description="Only jobs of this queue.")
]
TaskTypeFilter = Annotated[
    str | None,
    QueryParameter(name="taskType", pattern=NAME_PATTERN, description="Only this task type."),
]
KeyFilter = Annotated[
    str | None,
    QueryParameter(
        name="idempotencyKey",
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX_BYTES,
        pattern=r"^[\x20-\x7e]+(?!\n)$",
        description="Only the job submitted with this idempotency key (one per tenant).",
    ),
]
Cursor = Annotated[
    uuid.UUID | None,
    QueryParameter(description="`nextCursor` of the previous page."),
]
Limit = Annotated[
    int,
    QueryParameter(
        ge=1,
        le=LIST_LIMIT_MAX,
        description=f"Page size (default {LIST_LIMIT_DEFAULT}); a page also stops at "
        f"{LIST_PAGE_MAX_BYTES} bytes of JSON (at least one job).",
    ),
]
View = Annotated[
    ListView,
    QueryParameter(
        description="`summary` (default): each job without `payload`, `errors` and `result`; "
        "`full`: with them."
    ),
]

TenantScope = Annotated[
    str | None,
    QueryParameter(
        pattern=NAME_PATTERN,
        description="Only this tenant's jobs (another tenant's job is a 404); omitted: every "
        "tenant's. The producer sends its caller's tenant.",
    ),
]
"""The queue service's tenant scope (docs/architecture.md#tenants), on every route that reads
or changes jobs by id or filter."""

WaitSeconds = Annotated[
    float,
    QueryParameter(
        name="waitSeconds",
        ge=0,
        le=WAIT_SECONDS_MAX,
        description=f"Wait up to this many seconds (0 to {WAIT_SECONDS_MAX}, like the claim's "
        "long poll; default 0: answer at once) for the job to be COMPLETED, DEAD_LETTER or "
        "CANCELLED; the answer comes as soon as it is, or with the job as it is when the time "
        "is up.",
    ),
]
"""`GET /jobs/{id}?waitSeconds=N` on both services
(docs/architecture.md#waiting-for-the-outcome)."""

LIST_PARAMETERS = frozenset(
    {"status", "queue", "taskType", "idempotencyKey", "cursor", "limit", "view", "tenant"}
)


def refuse_unknown_parameters(
    request: Request[Any, Any, Any], known: frozenset[str] = LIST_PARAMETERS
) -> None:
    """Raise InvalidInput for a query parameter `GET /jobs` does not know (`known`): a typo
    such as `task_type` must not silently return an unfiltered list."""
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise unknown_parameters_error(unknown)


Minutes = Annotated[
    int,
    QueryParameter(
        ge=1, le=THROUGHPUT_MINUTES_MAX, description="How many minutes back (at most a day)."
    ),
]
"""`GET /throughput`'s window."""
