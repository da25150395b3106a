"""Wire contracts (msgspec Structs, camelCase JSON) and every bound of docs/architecture.md#bounds.

The bounds are defined once here and flow into request validation, the OpenAPI documents and
the client library. Structs that arrive over HTTP forbid unknown fields, so a typo such as
`delay_seconds` is an error rather than silently ignored.
"""

from __future__ import annotations

import enum
import math
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

# --- bounds (docs/architecture.md#bounds) ---------------------------------------------------

# `(?!\n)` keeps Python's `$` from matching before a trailing newline ("default\n"); in
# ECMA-262 regexes (OpenAPI, JSON Schema) it is a no-op.
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}(?!\n)$"
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX = 1, 100
DEFAULT_MAX_ATTEMPTS = 5
"""`maxAttempts` of a job that does not say (`QUEUE_MAX_ATTEMPTS` changes it per deployment)."""
MAX_DELAY_SECONDS = 14 * 24 * 3600
TIMEOUT_SECONDS_MIN, TIMEOUT_SECONDS_MAX = 1, 43_200
VISIBILITY_TIMEOUT_MAX = 43_200
CLAIM_MAX = 100
WAIT_SECONDS_MAX = 20
IDEMPOTENCY_KEY_MAX_BYTES = 255
PAYLOAD_MAX_BYTES = 256 * 1024
PAYLOAD_MAX_DEPTH = 32
REQUEST_BODY_MAX_BYTES = 8 * 1024 * 1024
ERROR_MAX_BYTES = 8 * 1024
RESULT_MAX_BYTES = 256 * 1024
ERRORS_HISTORY_MAX = 10
PROGRESS_MESSAGE_MAX_CHARS = 200
WORKER_NAME_MAX = 200
REDRIVE_LIMIT_MAX = 10_000_000
BATCH_MAX = 500
CLIENT_IDLE_SECONDS = 2.0
"""jobq's own HTTP clients (the client library, the producer's and the workers' pools towards
the queue service) stop reusing a pooled connection idle this long (seconds)."""
SERVER_KEEP_ALIVE_MIN_SECONDS = 2 * CLIENT_IDLE_SECONDS
"""jobq's servers keep an idle keep-alive connection open at least this long
(`HTTP_KEEP_ALIVE_TIMEOUT` may not be lower), so a client never sends on a connection the
server is closing at that very moment; a proxy in front of a jobq server must follow the same
rule towards it (its idle timeout under the server's)."""
LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 50, 500
LIST_PAGE_MAX_BYTES = 1024 * 1024
"""A listing page's JSON stops at this many bytes (a page holds at least one job, whatever its
size); `nextCursor` carries on from its last job."""
REDRIVE_BATCH = 500

Name = Annotated[
    str,
    Meta(
        pattern=NAME_PATTERN,
        description="Lower-case letters, digits, '.', '_' and '-'; 1..64 characters.",
        examples=["default"],
    ),
]
Priority = Annotated[
    int, Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX, description="Higher is claimed first.")
]
MaxAttempts = Annotated[int, Meta(ge=MAX_ATTEMPTS_MIN, le=MAX_ATTEMPTS_MAX)]
DelaySeconds = Annotated[
    float, Meta(ge=0, le=MAX_DELAY_SECONDS, description="Seconds before the job is visible.")
]
TimeoutSeconds = Annotated[int, Meta(ge=TIMEOUT_SECONDS_MIN, le=TIMEOUT_SECONDS_MAX)]
ClaimVisibilityTimeout = Annotated[int, Meta(ge=1, le=VISIBILITY_TIMEOUT_MAX)]
HeartbeatVisibilityTimeout = Annotated[int, Meta(ge=0, le=VISIBILITY_TIMEOUT_MAX)]
RetryAfterSeconds = Annotated[float, Meta(ge=0, le=MAX_DELAY_SECONDS)]
IDEMPOTENCY_WINDOW_MAX = 30 * 86400
"""The longest idempotency window a submit may ask for, in seconds (30 days)."""
DEFAULT_IDEMPOTENCY_WINDOW = 7 * 86400.0
"""An idempotency key's window when neither the submit nor the queue service's
QUEUE_IDEMPOTENCY_WINDOW says otherwise (seconds; the client library's `enqueue` uses it)."""
IdempotencyWindowSeconds = Annotated[
    int,
    Meta(
        ge=1,
        le=IDEMPOTENCY_WINDOW_MAX,
        description="Seconds the idempotency key blocks a different request and replays this"
        " one (1..2592000; default the queue service's QUEUE_IDEMPOTENCY_WINDOW, 7 days).",
    ),
]
IdempotencyKey = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX_BYTES,
        pattern=r"^[\x20-\x7e]+(?!\n)$",
        description="Printable ASCII, 1..255 bytes; unique per tenant for its window"
        " (idempotencyWindowSeconds).",
    ),
]
WorkerName = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=WORKER_NAME_MAX,
        pattern=r"^[\x21-\x7e]+(?!\n)$",
        description="Printable ASCII without spaces, e.g. host-pid; shown as lockedBy.",
    ),
]
Payload = Annotated[
    dict[str, Any],
    Meta(description=f"A JSON object of at most {PAYLOAD_MAX_BYTES} bytes, nesting ≤ 32."),
]


class JobStatus(enum.StrEnum):
    """A job's lifecycle state (docs/architecture.md#job-states)."""

    SCHEDULED = "SCHEDULED"
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    DEAD_LETTER = "DEAD_LETTER"
    CANCELLED = "CANCELLED"


FINISHED_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.DEAD_LETTER, JobStatus.CANCELLED})


class _Wire(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """Base of every struct on the wire: camelCase names, unknown fields rejected."""


# --- submit ----------------------------------------------------------------------------------


class SubmitJobRequest(_Wire):
    """`POST /jobs` body on the producer."""

    task_type: Name
    payload: Payload
    queue: Name = "default"
    priority: Priority = 0
    delay_seconds: DelaySeconds = 0
    max_attempts: MaxAttempts | None = None
    timeout_seconds: TimeoutSeconds | None = None
    idempotency_key: IdempotencyKey | None = None
    idempotency_window_seconds: IdempotencyWindowSeconds | None = None


TRACEPARENT_PATTERN = r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$(?!\n)"
"""A W3C Trace Context `traceparent` of version 00, with a non-zero trace id and parent id
(the final lookahead because Python's `$` also matches before a final newline)."""
TRACESTATE_MAX_CHARS = 512
"""The longest `tracestate` a job keeps (W3C: 32 list members; vendors keep it short)."""


class TraceContext(_Wire):
    """The W3C Trace Context (`traceparent`, optional `tracestate`) of the span that submitted
    a job: stored with the job, so each attempt's span can link to it
    (docs/architecture.md#tracing)."""

    traceparent: Annotated[str, Meta(pattern=TRACEPARENT_PATTERN)]
    tracestate: (
        Annotated[str, Meta(max_length=TRACESTATE_MAX_CHARS, pattern=r"^[\x20-\x7e]*$(?!\n)")]
        | None
    ) = None


class EnqueueRequest(SubmitJobRequest, omit_defaults=True):
    """`POST /jobs` body on the queue service: the producer's request plus the id it minted
    and the tenant that owns the job (docs/architecture.md#tenants; default `default`).

    Carrying the id makes a retried forward a replay of the same job, never a duplicate.
    Encoded without the fields at their defaults (a forward without tracing carries no
    `"traceContext": null`); decoding restores them.
    """

    job_id: uuid.UUID | None = None
    trace_context: TraceContext | None = None
    tenant: Annotated[
        str,
        Meta(
            pattern=NAME_PATTERN,
            description="The tenant that owns the job; idempotency keys are unique per tenant.",
        ),
    ] = "default"


class BatchSubmitRequest(_Wire):
    """`POST /jobs/batch`: up to 500 entries, each a `SubmitJobRequest` (on the queue service,
    an `EnqueueRequest`), validated one by one: a bad entry fails alone. Entries are kept as
    their JSON text (`msgspec.Raw`) until each is decoded on its own, its payload's byte span
    checked first."""

    jobs: Annotated[
        list[msgspec.Raw],
        Meta(
            min_length=1,
            max_length=BATCH_MAX,
            description="Each entry has the shape of a single POST /jobs body.",
        ),
    ]


class BatchEntryResult(_Wire, omit_defaults=True):
    """One entry's outcome, in request order: `status` 202 (created), 200 (replay, including
    a repeated idempotency key within the batch), 409, 413, 422 or 429 (the tenant's email
    rate) with `error` problem details."""

    index: int
    status: int
    job_id: uuid.UUID | None = None
    job_status: JobStatus | None = None
    error: dict[str, Any] | None = None


class BatchSubmitResponse(_Wire):
    """`POST /jobs/batch` reply."""

    results: list[BatchEntryResult]


class SubmitJobResponse(_Wire):
    """`202` (created) or `200` (replay) reply to a submit."""

    job_id: uuid.UUID
    status: JobStatus


class ErrorEntry(_Wire):
    """One failure in a job's bounded `errors` history."""

    attempt: int
    at: datetime
    error: str


class JobProgress(_Wire):
    """The latest progress a job's processor reported: `fraction` done (0 to 1), its message,
    the `attempt` that reported it, and when (the database's clock). Kept when the job
    finishes (how far a failed attempt got); cleared by a retry or redrive."""

    fraction: float
    message: str | None
    attempt: int
    at: datetime


class JobView(_Wire):
    """Everything known about a job, as `GET /jobs/{id}` returns it."""

    id: uuid.UUID
    tenant: str
    queue: str
    task_type: str
    payload: dict[str, Any]
    status: JobStatus
    priority: int
    attempts: int
    releases: int
    max_attempts: int
    timeout_seconds: int | None
    last_error: str | None
    errors: list[ErrorEntry]
    result: Any
    idempotency_key: str | None
    locked_by: str | None
    created_at: datetime
    updated_at: datetime
    visible_at: datetime
    claimed_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool
    progress: JobProgress | None = None


ListView = Literal["summary", "full"]
"""What a listing shows of each job: `summary` (the default) leaves out `payload`, `errors` and
`result`; `full` includes them, as `GET /jobs/{id}` does."""


class ListedJob(_Wire):
    """A job as `GET /jobs` lists it: the summary view (a `JobView` without `payload`, `errors`
    and `result`), or with `view=full` all of `JobView`'s fields."""

    id: uuid.UUID
    tenant: str
    queue: str
    task_type: str
    status: JobStatus
    priority: int
    attempts: int
    releases: int
    max_attempts: int
    timeout_seconds: int | None
    last_error: str | None
    idempotency_key: str | None
    locked_by: str | None
    created_at: datetime
    updated_at: datetime
    visible_at: datetime
    claimed_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool
    payload: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    errors: list[ErrorEntry] | msgspec.UnsetType = msgspec.UNSET
    result: Any | msgspec.UnsetType = msgspec.UNSET


class JobList(_Wire):
    """`GET /jobs` page, newest first; pass `next_cursor` as `cursor` for the next page
    (None on the last page). Keyset pagination: stable while new jobs arrive. A page stops at
    `limit` jobs or LIST_PAGE_MAX_BYTES of JSON, whichever comes first (at least one job)."""

    items: list[ListedJob]
    next_cursor: str | None


# --- worker protocol -------------------------------------------------------------------------


class AckEntry(_Wire):
    """One ack of a batch: the job, its receipt handle and an optional result."""

    id: uuid.UUID
    receipt_handle: uuid.UUID
    result: Any = None


class AckResult(_Wire):
    """One batch-ack outcome: 200 completed (or a replay), 404 unknown job, 409 stale handle
    (the lease was lost: the job was handed out again or settled by another claim)."""

    id: uuid.UUID
    status: int


ClaimAttribute = Literal["queue", "tenant"]
"""A job attribute a claim may ask its reply to carry (`ClaimRequest.attribute_names`)."""


class ClaimRequest(_Wire):
    """`POST /jobs/next`: claim up to `max` jobs, long-polling up to `wait_seconds`.

    `acks` completes jobs the worker finished since its last claim, in the same statement as
    the claim (Oban Pro's "bundled acks": one round trip instead of two). The acks are
    committed before the claim waits for work; their outcomes come with the reply.
    """

    worker: WorkerName
    queues: Annotated[list[Name], Meta(min_length=1, max_length=50)]
    max: Annotated[int, Meta(ge=1, le=CLAIM_MAX)] = 1
    wait_seconds: Annotated[float, Meta(ge=0, le=WAIT_SECONDS_MAX)] = 0
    visibility_timeout: ClaimVisibilityTimeout | None = None
    acks: Annotated[list[AckEntry], Meta(max_length=CLAIM_MAX)] = msgspec.field(
        default_factory=list
    )
    slots: Annotated[int, Meta(ge=1, le=100_000)] | None = None
    """The worker's concurrency, shown in the workers view (optional: older workers omit it)."""
    attribute_names: Annotated[list[ClaimAttribute], Meta(max_length=2)] = msgspec.field(
        default_factory=list
    )
    """The job attributes beyond the usual ones the reply should carry, `queue` and `tenant`
    (asked for by name, as SQS's ReceiveMessage asks for `MessageSystemAttributeNames`), so a
    worker of an earlier release, which refuses fields it does not know, never receives them
    (docs/architecture.md#tracing)."""


class _Reply(msgspec.Struct, kw_only=True, rename="camel"):
    """Base of a reply a jobq process decodes from another (camelCase): fields it does not
    know are ignored, so a newer sender may add fields without breaking an older reader."""


class JobMessage(_Reply):
    """A claimed job as a worker receives it; `receipt_handle` fences every later report.
    `queue` and `tenant` are the job's when the claim asked for them
    (`ClaimRequest.attribute_names`), else None."""

    id: uuid.UUID
    task_type: str
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    timeout_seconds: int | None
    receipt_handle: uuid.UUID
    visibility_timeout: int
    visible_at: datetime
    idempotency_key: str | None
    queue: str | None = None
    tenant: str | None = None
    trace_context: TraceContext | None = None


class ClaimResponse(_Reply, omit_defaults=True):
    """`200` reply to a claim: the jobs claimed (at least one, unless the claim carried
    acks), and one outcome per ack it carried, in order."""

    jobs: list[JobMessage]
    acks: list[AckResult] = msgspec.field(default_factory=list)


class AckRequest(_Wire):
    """`POST /jobs/{id}/ack`: the job succeeded; `result` is stored (sanitised, truncated)."""

    receipt_handle: uuid.UUID
    result: Any = None


class BatchAckRequest(_Wire):
    """`POST /jobs/ack`: complete up to 100 jobs in one statement (distinct ids)."""

    entries: Annotated[list[AckEntry], Meta(min_length=1, max_length=CLAIM_MAX)]


class BatchAckResponse(_Wire):
    """`POST /jobs/ack` reply, in request order."""

    results: list[AckResult]


class FailRequest(_Wire):
    """`POST /jobs/{id}/fail`: the attempt failed; retry with backoff or dead-letter."""

    receipt_handle: uuid.UUID
    error: str
    retryable: bool = True
    retry_after_seconds: RetryAfterSeconds | None = None


ReleaseReason = Literal["shutdown"]
"""Why a worker releases a job (recorded in its `errors` as `released: <reason>`; a release
without one records `released: requested`)."""


class HeartbeatRequest(_Wire):
    """`POST /jobs/{id}/heartbeat` (SQS ChangeMessageVisibility): extend the lease to
    `visibility_timeout` seconds from now; 0 releases the job, optionally saying why
    (`reason`, only with 0)."""

    receipt_handle: uuid.UUID
    visibility_timeout: HeartbeatVisibilityTimeout
    reason: ReleaseReason | None = None


class HeartbeatResponse(_Wire):
    """The lease as it is now; `cancel_requested` tells the worker to stop the processor."""

    visible_at: datetime
    visibility_timeout: int
    cancel_requested: bool
    status: JobStatus


class FailEntry(_Wire):
    """One failed attempt of a batch: like `FailRequest`, with the job's id."""

    id: uuid.UUID
    receipt_handle: uuid.UUID
    error: str
    retryable: bool = True
    retry_after_seconds: RetryAfterSeconds | None = None


class BatchFailRequest(_Wire):
    """`POST /jobs/fail`: record up to 100 failed attempts in one statement (distinct ids)."""

    entries: Annotated[list[FailEntry], Meta(min_length=1, max_length=CLAIM_MAX)]


class FailResult(_Wire, omit_defaults=True):
    """One batch-fail outcome: 200 recorded (or a replay) with the job's status now
    (`SCHEDULED`, `DEAD_LETTER` or `CANCELLED`), 404 unknown job, 409 stale handle."""

    id: uuid.UUID
    status: int
    job_status: JobStatus | None = None


class BatchFailResponse(_Wire):
    """`POST /jobs/fail` reply, in request order."""

    results: list[FailResult]


class ProgressReport(_Wire):
    """How far a running job has got, as its worker reports it with a heartbeat: the
    `fraction` done (0 to 1) and an optional short `message` (at most
    `PROGRESS_MESSAGE_MAX_CHARS` characters), as BullMQ's `job.updateProgress` and Celery's
    `update_state(meta=…)` report it."""

    fraction: Annotated[float, Meta(ge=0, le=1)]
    message: Annotated[str, Meta(max_length=PROGRESS_MESSAGE_MAX_CHARS)] | None = None


class HeartbeatEntry(_Wire):
    """One lease change of a batch: like `HeartbeatRequest`, with the job's id, and the
    job's latest `progress` when its processor reported any since the last heartbeat."""

    id: uuid.UUID
    receipt_handle: uuid.UUID
    visibility_timeout: HeartbeatVisibilityTimeout
    reason: ReleaseReason | None = None
    progress: ProgressReport | None = None


class BatchHeartbeatRequest(_Wire):
    """`POST /jobs/heartbeat` (SQS ChangeMessageVisibilityBatch): extend or release up to 100
    leases in one statement (distinct ids)."""

    entries: Annotated[list[HeartbeatEntry], Meta(min_length=1, max_length=CLAIM_MAX)]


class HeartbeatResult(_Wire, omit_defaults=True):
    """One batch-heartbeat outcome: 200 with the lease as it is now, 404 unknown job, 409
    stale handle (the lease was lost)."""

    id: uuid.UUID
    status: int
    job_status: JobStatus | None = None
    visible_at: datetime | None = None
    cancel_requested: bool = False


class BatchHeartbeatResponse(_Wire):
    """`POST /jobs/heartbeat` reply, in request order."""

    results: list[HeartbeatResult]


class CancelledRequest(_Wire):
    """`POST /jobs/{id}/cancelled`: the worker stopped the job after a cancel request."""

    receipt_handle: uuid.UUID


class RedriveRequest(_Wire):
    """`POST /dead-letter/redrive`: move dead-lettered jobs back to PENDING.

    `limit` is the total to move (default: all), done in batches of at most 500.
    """

    queue: Name | None = None
    task_type: Name | None = None
    limit: Annotated[int, Meta(ge=1, le=REDRIVE_LIMIT_MAX)] | None = None


class RedriveResponse(_Wire):
    """How many jobs the redrive moved."""

    moved: int


DepthSource = Literal["redis", "postgres"]
"""Where depth figures came from: the Redis cache (refreshed every QUEUE_DEPTH_INTERVAL) or a
count in PostgreSQL made for this request."""


ACTOR_MAX = 200
"""Characters of a recorded actor (`QueueChange.by`)."""


class QueueChange(_Wire):
    """The last change an operator made to a queue's state: when (`at`), by whom (`by`: the
    caller as the producer identified it, `<role>:<tenant>:key-<first 12 hex digits of the
    key's SHA-256>`, or what a direct caller of the queue service named), and what
    (`pause`, `resume`, `limits`: its concurrency limits were set, or `weights`: its
    tenants' weights in the fair share were set)."""

    at: datetime
    by: str
    what: Literal["pause", "resume", "limits", "weights"]


CONCURRENCY_MAX = 100_000
"""The largest concurrency limit (jobs running at once); more is no limit at all."""
LIMITED_TASK_TYPES_MAX = 100
"""Task types one queue may limit."""

Concurrency = Annotated[int, Meta(ge=1, le=CONCURRENCY_MAX)]
RATE_MIN, RATE_MAX = 0.01, 100_000.0
"""The range of a dispatch rate (jobs handed out per second)."""
Rate = Annotated[float, Meta(ge=RATE_MIN, le=RATE_MAX)]
Burst = Annotated[int, Meta(ge=1, le=CONCURRENCY_MAX)]


class ConcurrencyLimit(_Wire):
    """How many jobs of task type `taskType` of a queue may run (be PROCESSING) at once, and
    how fast they may be handed out, across every worker and queue-service replica:

    - `concurrency`: at most this many running in all; `tenantConcurrency`: of any one tenant;
    - `rate`: at most this many handed out per second (a token bucket of `burst` tokens,
      default the rate rounded up: a quiet pair may hand out `burst` jobs at once, then `rate`
      per second); `tenantRate` / `tenantBurst`: the same for each tenant's jobs.

    Any of the bounds may be omitted, not all; `tenantConcurrency` is at most `concurrency`
    and a burst needs its rate. A limit of 0 is no limit: pause the queue instead
    (`POST /queues/{queue}/pause`)."""

    task_type: Name
    concurrency: Concurrency | None = None
    tenant_concurrency: Concurrency | None = None
    rate: Rate | None = None
    burst: Burst | None = None
    tenant_rate: Rate | None = None
    tenant_burst: Burst | None = None

    def __post_init__(self) -> None:
        bounds = (self.concurrency, self.tenant_concurrency, self.rate, self.tenant_rate)
        if all(bound is None for bound in bounds):
            raise ValueError(
                "a limit needs `concurrency`, `tenantConcurrency`, `rate` or `tenantRate`"
            )
        if (
            self.concurrency is not None
            and self.tenant_concurrency is not None
            and self.tenant_concurrency > self.concurrency
        ):
            raise ValueError("`tenantConcurrency` cannot exceed `concurrency`")
        if self.burst is not None and self.rate is None:
            raise ValueError("`burst` needs `rate`")
        if self.tenant_burst is not None and self.tenant_rate is None:
            raise ValueError("`tenantBurst` needs `tenantRate`")
        if self.rate is not None and self.burst is None:
            self.burst = max(1, math.ceil(self.rate))
        if self.tenant_rate is not None and self.tenant_burst is None:
            self.tenant_burst = max(1, math.ceil(self.tenant_rate))


class LimitsRequest(_Wire):
    """`PUT /queues/{queue}/limits` body: the queue's concurrency limits, one per task type,
    which replace the ones it had (`{"limits": []}` removes them all)."""

    limits: Annotated[list[ConcurrencyLimit], Meta(max_length=LIMITED_TASK_TYPES_MAX)]

    def __post_init__(self) -> None:
        named = [limit.task_type for limit in self.limits]
        if len(set(named)) != len(named):
            raise ValueError("each task type may have one limit")


WEIGHT_MIN, WEIGHT_MAX = 0.01, 1000.0
"""The range of a tenant's weight in a queue's fair share."""
WEIGHTED_TENANTS_MAX = 1000
"""Tenants one queue may weigh (every other tenant weighs 1)."""


class TenantWeight(_Wire):
    """Tenant `tenant`'s weight in its queue's fair share (docs/architecture.md#fair-shares):
    while several tenants have ready jobs in the queue, each claim hands out jobs to each in
    proportion to its weight (a tenant of weight 3 gets three jobs for every one of a tenant
    of weight 1). A tenant not named weighs 1."""

    tenant: Annotated[str, Meta(pattern=NAME_PATTERN, description="A tenant name.")]
    weight: Annotated[float, Meta(ge=WEIGHT_MIN, le=WEIGHT_MAX)]


class WeightsRequest(_Wire):
    """`PUT /queues/{queue}/weights` body: the queue's tenant weights, which replace the ones
    it had (`{"weights": []}`: every tenant weighs 1 again)."""

    weights: Annotated[list[TenantWeight], Meta(max_length=WEIGHTED_TENANTS_MAX)]

    def __post_init__(self) -> None:
        named = [entry.tenant for entry in self.weights]
        if len(set(named)) != len(named):
            raise ValueError("each tenant may have one weight")


class QueueDepth(_Wire):
    """Per-queue counts of `GET /queues` (approximate when served from the Redis cache), and
    whether the queue is paused (since `pausedAt`; read from PostgreSQL when it answers) with
    its last change."""

    queue: str
    pending: int
    scheduled: int
    processing: int
    dead_letter: int
    oldest_pending_age_seconds: float
    source: DepthSource
    refreshed_at: datetime
    paused: bool = False
    paused_at: datetime | None = None
    limits: list[ConcurrencyLimit] = msgspec.field(default_factory=list)
    weights: list[TenantWeight] = msgspec.field(default_factory=list)
    last_change: QueueChange | None = None


class QueueState(_Wire):
    """`POST /queues/{queue}/pause|resume`, `PUT /queues/{queue}/limits` and
    `PUT /queues/{queue}/weights` reply: the queue's state after the change (paused or not,
    its concurrency limits by task type, its tenants' weights)."""

    queue: str
    paused: bool
    paused_at: datetime | None
    last_change: QueueChange
    limits: list[ConcurrencyLimit] = msgspec.field(default_factory=list)
    weights: list[TenantWeight] = msgspec.field(default_factory=list)


class QueuesResponse(_Wire):
    """`GET /queues` reply: counts per queue, and where and when they were taken (`source`,
    `refreshedAt`), stated even when there are no queues. Each entry repeats both, as the
    reply did before they were added at the top."""

    queues: list[QueueDepth]
    source: DepthSource
    refreshed_at: datetime
