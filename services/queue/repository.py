"""All SQL of the queue service: one method per operation, each one atomic statement.

Rules that decide *what* to do live in `service.py`; this module only knows *how* to make
PostgreSQL do it safely under concurrency. It talks to PostgreSQL through an asyncpg pool, one
statement per round trip in autocommit (a single statement is its own transaction), so a claim
or a settle costs one round trip and no BEGIN/COMMIT. Statements are prepared once per
connection (asyncpg's statement cache). Driver errors are translated here into the
`common.errors` family, so nothing above this module imports asyncpg.

Every statement that makes jobs claimable sends its wake-up `pg_notify` itself, in the same
statement, one notification per queue: nothing is woken for a change that did not commit.
Arithmetic on row values is overflow-safe (bigint or clamped), so no single row, whatever its
columns hold, can make a statement fail for every other job of its queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import msgspec
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from common.contracts import (
    ERRORS_HISTORY_MAX,
    FINISHED_STATUSES,
    ConcurrencyLimit,
    ErrorEntry,
    JobProgress,
    JobStatus,
    JobView,
    ListedJob,
    ProgressReport,
    QueueChange,
    QueueState,
    TenantWeight,
)
from common.drivers import AsyncpgExecutor
from common.enqueue import WAKEUP_CHANNEL, Existing, Inserted, JobRow
from common.errors import ServiceUnavailable
from common.logging import RepeatedEvents
from common.web import tracing
from common.web.pools import PoolMetrics
from services.queue import statements
from services.queue.readings import WAITING_COUNTED, DatabaseHealth, DepthRow, LimitReading
from services.queue.retry import BACKOFF_CEILING_SQL, Backoff
from services.queue.statements import TracedConnection

logger = logging.getLogger(__name__)

T = TypeVar("T")

LEASE_CAP_HOURS = 12
"""No lease extends past this many hours after its claim (as in SQS)."""

INT_MAX = 2_147_483_647
"""Largest value of a PostgreSQL `integer`; counters stop there instead of overflowing."""


class Claimed(msgspec.Struct, rename="camel", frozen=True, omit_defaults=True):
    """A job one claim handed out, shaped as the `JobMessage` the worker receives: the payload
    is the JSON text PostgreSQL stored (`msgspec.Raw`), passed through to the worker without
    being decoded and encoded again. `visibility_timeout` is in seconds; `trace_context` is the
    submit's (a `TraceContext`'s JSON as stored), left out when the job has none. `queue` and
    `tenant` come from the claim's RETURNING, which needs them anyway (the per-tenant counts,
    the fair claim's cursor), so they cost the reply a few bytes and nothing else."""

    id: uuid.UUID
    task_type: str
    queue: str
    tenant: str
    payload: msgspec.Raw
    attempts: int
    max_attempts: int
    timeout_seconds: int | None
    receipt_handle: uuid.UUID
    visibility_timeout: int
    visible_at: datetime
    idempotency_key: str | None
    trace_context: msgspec.Raw | None = None


@dataclass(frozen=True, slots=True)
class Settled:
    """One job a settle statement changed: its queue, task type and status now, its attempt,
    its last error (for fails), and seconds from submit to completion (for acks)."""

    id: uuid.UUID
    queue: str
    task_type: str
    status: JobStatus
    attempts: int = 0
    last_error: str | None = None
    end_to_end_seconds: float | None = None
    trace_json: str | None = None
    """The submit's trace context as stored (JSON text), for the settle span's link."""


@dataclass(frozen=True, slots=True)
class Extended:
    """Outcome of one heartbeat: the job's status and lease end now, any cancel request, and
    whether it was a release."""

    id: uuid.UUID
    queue: str
    task_type: str
    status: JobStatus
    visible_at: datetime
    cancel_requested: bool
    released: bool = False


@dataclass(frozen=True, slots=True)
class FailEntry:
    """One failed attempt to record: `retry_after` (seconds) overrides the backoff; `jitter`
    is the full-jitter factor u in (0, 1]."""

    id: uuid.UUID
    receipt_handle: uuid.UUID
    error: str
    retryable: bool
    retry_after: float | None
    jitter: float


@dataclass(frozen=True, slots=True)
class ScheduleFiring:
    """What firing a schedule's bucket did: the job it created (None: none), and the stored
    bucket it rewound from when the database's clock had been stepped back (None: no rewind)."""

    created: Inserted | None
    rewound_from: datetime | None


_SUMMARY_FIELDS = (
    "id", "tenant", "queue", "task_type", "priority", "attempts", "releases", "max_attempts",
    "timeout_seconds", "last_error", "idempotency_key", "locked_by", "created_at", "updated_at",
    "visible_at", "claimed_at", "finished_at", "cancel_requested",
)  # fmt: skip
"""Columns a job view and a listed summary share, by the same names."""


def _summary_fields(row: asyncpg.Record) -> dict[str, Any]:
    fields = {name: row[name] for name in _SUMMARY_FIELDS}
    fields["status"] = JobStatus(row["status"])
    return fields


def _errors(row: asyncpg.Record) -> list[ErrorEntry]:
    return msgspec.convert(row["errors"] or [], list[ErrorEntry], strict=False)


def _to_view(row: asyncpg.Record) -> JobView:
    progress = row["progress"]
    return JobView(
        **_summary_fields(row),
        payload=row["payload"],
        errors=_errors(row),
        result=row["result"],
        progress=None if progress is None else msgspec.convert(progress, JobProgress),
    )


def _to_state(row: asyncpg.Record) -> QueueState:
    return QueueState(
        queue=row["queue"],
        paused=row["paused_at"] is not None,
        paused_at=row["paused_at"],
        limits=[
            msgspec.convert({**bounds, "taskType": task_type}, ConcurrencyLimit)
            for task_type, bounds in sorted(row["limits"].items())
        ],
        weights=[
            TenantWeight(tenant=tenant, weight=weight)
            for tenant, weight in sorted(row["weights"].items())
        ],
        last_change=QueueChange(at=row["changed_at"], by=row["changed_by"], what=row["change"]),
    )


def _to_listed(row: asyncpg.Record, full: bool) -> ListedJob:
    listed = ListedJob(**_summary_fields(row))
    if full:
        listed.payload = row["payload"]
        listed.errors = _errors(row)
        listed.result = row["result"]
    return listed


_SUMMARY_COLUMNS = (
    "id, tenant, queue, task_type, status, priority, attempts, releases, max_attempts, "
    "timeout_seconds, last_error, idempotency_key, locked_by, created_at, updated_at, "
    "visible_at, claimed_at, finished_at, cancel_requested"
)

_LONGEST_TIME = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
_LONGEST_SUMMARY = ListedJob(
    id=uuid.UUID(int=0),
    tenant="",
    queue="",
    task_type="",
    status=JobStatus.DEAD_LETTER,
    priority=-1000,
    attempts=INT_MAX,
    releases=INT_MAX,
    max_attempts=100,
    timeout_seconds=43_200,
    last_error=None,
    idempotency_key=None,
    locked_by=None,
    created_at=_LONGEST_TIME,
    updated_at=_LONGEST_TIME,
    visible_at=_LONGEST_TIME,
    claimed_at=_LONGEST_TIME,
    finished_at=_LONGEST_TIME,
    cancel_requested=False,
)
_SUMMARY_BYTES = len(msgspec.json.encode(_LONGEST_SUMMARY)) + 1
"""JSON bytes of a listed job's fixed part at its longest (plus the comma between items); a
row's variable parts are measured in SQL (`_listed_bytes`)."""

_FULL_BYTES = _SUMMARY_BYTES + len(b',"payload":,"errors":,"result":')


def _listed_bytes(full: bool) -> str:
    """SQL for an upper bound of one row's JSON in a listing: the fixed part, plus its texts as
    JSON strings (`to_json` escapes as msgspec does) and, for the full view, its jsonb
    columns as text (jsonb's text has a space after each separator, so it is never shorter
    than msgspec's JSON of the same value)."""
    summary = (
        "octet_length(tenant) + octet_length(queue) + octet_length(task_type)"
        " + COALESCE(octet_length(to_json(last_error)::text), 0)"
        " + COALESCE(octet_length(to_json(idempotency_key)::text), 0)"
        " + COALESCE(octet_length(to_json(locked_by)::text), 0)"
    )
    if not full:
        return f"{_SUMMARY_BYTES} + {summary}"
    return (
        f"{_FULL_BYTES} + {summary} + octet_length(payload::text)"
        " + octet_length(errors::text) + COALESCE(octet_length(result::text), 4)"
    )


_JOB_COLUMNS = (
    "id, tenant, queue, task_type, payload, status, priority, attempts, releases, max_attempts, "
    "timeout_seconds, last_error, errors, result, idempotency_key, locked_by, created_at, "
    "updated_at, visible_at, claimed_at, finished_at, cancel_requested, lease_id, progress"
)

# Reads, cancels, retries, listings and redrives take a tenant scope: NULL for every tenant,
# else only that tenant's jobs, so another tenant's job looks exactly like a missing one.
_IN_SCOPE = "($2::text IS NULL OR tenant = $2)"

ALL_COLUMNS = (
    "id", "tenant", "queue", "task_type", "payload", "status", "priority", "attempts",
    "releases", "max_attempts", "timeout_seconds", "visible_at", "ready_at", "claimed_at",
    "lease_id", "locked_by", "cancel_requested", "awaited", "last_error", "errors", "result",
    "progress", "trace_context", "idempotency_key", "request_hash", "created_at", "updated_at",
    "finished_at",
)  # fmt: skip
"""Every column of `job`, and of `job_history` (the same columns); a moved row keeps each."""

_ALL = ", ".join(ALL_COLUMNS)


def _moved_into(table: str, source: str, changed: Mapping[str, str]) -> str:
    """`INSERT INTO {table} (every column) SELECT … FROM {source} AS job`: the rows of CTE
    `source` (a DELETE's `RETURNING <table>.*`, maybe with more columns) as they are, but for
    the columns `changed` gives an SQL expression for (over `job.<column>`)."""
    values = ", ".join(changed.get(column, f"job.{column}") for column in ALL_COLUMNS)
    return f"INSERT INTO {table} ({_ALL}) SELECT {values} FROM {source} AS job"


def archive(source: str, **changed: str) -> str:
    """The INSERT that puts the rows a `DELETE FROM job … RETURNING job.*` (CTE `source`)
    took out of the live table into `job_history`, in the same statement: the one shape of
    every settle that finishes a job (docs/architecture.md#storage). `changed`: the columns
    the settle sets, as SQL over `job.<column>`; `finished_at` must be among them."""
    return _moved_into("job_history", source, changed)


def revive(source: str) -> str:
    """The INSERT that puts the rows a `DELETE FROM job_history … RETURNING job_history.*`
    (CTE `source`) took out of the history back into `job` as PENDING work, attempts and
    releases reset (retry and redrive; the SQS moves of dead letters)."""
    return _moved_into("job", source, RESET_VALUES)


RESET_VALUES = {
    "status": "'PENDING'",
    "attempts": "0",
    "releases": "0",
    "lease_id": "NULL::uuid",
    "locked_by": "NULL::text",
    "cancel_requested": "false",
    "awaited": "false",
    "result": "NULL::jsonb",
    "progress": "NULL::jsonb",
    "claimed_at": "NULL::timestamptz",
    "finished_at": "NULL::timestamptz",
    "visible_at": "statement_timestamp()",
    "ready_at": "statement_timestamp()",
    "updated_at": "statement_timestamp()",
    # A key's life is its window in `idempotency_key`; once the window is over another job may
    # hold the same key live (`uq_job_tenant_idempotency_key`), and so may a second revived
    # job of the same key: the revived job then comes back without its key, not as a unique
    # violation (found by the OpenAPI fuzz test's bulk retry with one-second windows).
    "idempotency_key": (
        "CASE WHEN row_number() OVER (PARTITION BY job.tenant, job.idempotency_key"
        " ORDER BY job.id DESC) = 1 AND NOT EXISTS (SELECT FROM job AS live"
        " WHERE live.tenant = job.tenant AND live.idempotency_key = job.idempotency_key)"
        " THEN job.idempotency_key END"
    ),
}
"""What retry and redrive set, as `revive` inserts it (the UPDATE form: `_RESET_FOR_RETRY`)."""

_NOW = "statement_timestamp()"

# Reads see a job wherever it is: `job_all` is `job UNION ALL job_history` (a view; each
# branch is read through its own index). One statement has one snapshot, and a move is one
# statement's DELETE and INSERT, so a read finds the job in exactly one of the two.
_GET = f"SELECT {_JOB_COLUMNS} FROM job_all WHERE id = $1 AND {_IN_SCOPE}"

_GET_MANY = f"SELECT {_JOB_COLUMNS} FROM job_all WHERE id = ANY($1::uuid[])"

# A waiter flags a live job, and gets its view as this update left it: a settle that commits
# before the update makes it match nothing (the job is read again), one after it sees the flag
# and fires the `job_settled_awaited` trigger (docs/adr/008-waiting-for-outcomes.md).
_MARK_AWAITED = f"""
UPDATE job SET awaited = true
WHERE id = $1 AND {_IN_SCOPE} AND status IN ('PENDING', 'SCHEDULED', 'PROCESSING')
RETURNING {_JOB_COLUMNS}
"""


def _notify_ready(source: str) -> str:
    """A CTE body sending one wake-up per queue for the PENDING rows of `source` (a CTE with
    `queue` and `status` columns). The main query must read it, or PostgreSQL skips it."""
    return (
        f"SELECT pg_notify('{WAKEUP_CHANNEL}', queue || ':' || count(*)) FROM {source} "
        "WHERE status = 'PENDING' GROUP BY queue"
    )


def _claimed_cte(worker: str, visibility: str, flow: str = "NULL::bigint") -> str:
    """The CTEs `leased` and `claimed`: the jobs of CTE `picked` (`id`, `rank`) made
    PROCESSING for `worker` with a fresh lease of `visibility` seconds (both SQL expressions,
    parameters), then (`claimed`) each with its queue, tenant, `rank` and `flow` (an SQL
    expression over `picked`: the job's flow in the fair claim)."""
    return f"""leased AS (
    UPDATE job SET status = 'PROCESSING',
                   attempts = LEAST(job.attempts, {INT_MAX} - 1) + 1,
                   lease_id = gen_random_uuid(),
                   locked_by = {worker},
                   claimed_at = statement_timestamp(),
                   visible_at = statement_timestamp() + make_interval(secs => {visibility}),
                   updated_at = statement_timestamp()
    -- By primary key, not a join with `picked`: the plan, made once for every `max`, must
    -- not depend on how many rows the LIMIT lets through.
    WHERE job.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING job.id, job.task_type, job.payload::text AS payload_json, job.attempts,
              job.max_attempts, job.timeout_seconds, job.lease_id, job.visible_at,
              job.idempotency_key, job.queue, job.tenant, job.trace_context::text AS trace_json
), claimed AS (
    -- Rank and flow by one join, not a lookup in `picked` per returned row (2-4 % of a
    -- claim's time, benchmark/README.md "Where the time goes: the claim statements").
    SELECT leased.*, picked.rank, {flow} AS flow
    FROM leased JOIN picked ON picked.id = leased.id
)"""


def _next_tenant(flow: str, after: str, wrapped: str, cursor: str) -> str:
    """SQL for the next tenant with PENDING jobs in `flow`'s queue in window order, by one
    descent of ix_job_claim_tenant, as `(tenant, wrapped, priority, ready_at, id)`: the first
    ready job of the least tenant above `after` (below or at `cursor` once `wrapped`), else,
    not yet wrapped and with a `cursor`, of the least tenant of the queue (the window wraps
    round). All arguments are SQL expressions."""
    columns = "job.tenant, {wrapped} AS wrapped, job.priority, job.ready_at, job.id"
    return f"""(SELECT found.* FROM (
            (SELECT {columns.format(wrapped=wrapped)} FROM job
             WHERE job.status = 'PENDING' AND job.queue = {flow}.queue AND job.tenant > {after}
               AND (NOT {wrapped} OR job.tenant <= {cursor})
             ORDER BY job.tenant, job.priority DESC, job.ready_at, job.id LIMIT 1)
            UNION ALL
            (SELECT {columns.format(wrapped="true")} FROM job
             WHERE job.status = 'PENDING' AND job.queue = {flow}.queue
               AND NOT {wrapped} AND {cursor} IS NOT NULL AND job.tenant <= {cursor}
             ORDER BY job.tenant, job.priority DESC, job.ready_at, job.id LIMIT 1)
        ) AS found LIMIT 1)"""


# The claim of queues where one tenant has ready jobs (the usual case; which statement a
# replica runs is `JobRepository._shared`'s): it walks ix_job_claim once per queue asked for,
# in the index's own order, and merges the walks: each queue's walk stops after `max`
# unlocked rows, so the cost is O(queues x max) however long the backlog, never a sort of
# every waiting job. Rows locked by another claimer are skipped, not waited for, so claimers
# never block each other and never share a row. Rows a walk locked but the merge did not pick
# are unlocked at the end of the statement. `probe` then tells, per queue, whether a tenant
# other than that of its first claimed job has ready jobs too (two descents of
# ix_job_claim_tenant, one on each side of that tenant, which stop at once when there is
# none): then the replica shares the queue's next claims (_CLAIM_FAIR_CTE_TEMPLATE).
# Parameters: $1 queues, $2 max, $3 worker, $4 visibility timeout (seconds). A claim that
# began before a pause (or a limit) committed may still take that queue's jobs (its snapshot
# predates it): such jobs have a `claimed_at` before the change's commit.
_CLAIM_WALK_CTES = f"""
picked AS (
    SELECT candidate.id,
           -- Claim order, computed here: the rows come back from the UPDATE in no order.
           row_number() OVER (
               ORDER BY candidate.priority DESC, candidate.ready_at, candidate.id) AS rank
    -- A paused queue hands out nothing: its walk is never made; the task types it limits
    -- are left to the limited claim (_CLAIM_LIMITED). One primary-key probe of the small
    -- queue_control table per queue asked for (docs/architecture.md#flow-control).
    FROM (SELECT asked.queue, control.limits
          FROM unnest($1::text[]) AS asked(queue)
          LEFT JOIN queue_control AS control ON control.queue = asked.queue
          WHERE control.paused_at IS NULL) AS wanted
    CROSS JOIN LATERAL (
        SELECT id, priority, ready_at FROM job
        WHERE status = 'PENDING' AND queue = wanted.queue
          AND (wanted.limits IS NULL OR NOT wanted.limits ? task_type)
        ORDER BY priority DESC, ready_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ) AS candidate
    ORDER BY candidate.priority DESC, candidate.ready_at, candidate.id
    LIMIT $2
), {_claimed_cte("$3", "$4")}, probe AS (
    SELECT first_claimed.queue,
           (SELECT job.id FROM job
            WHERE job.status = 'PENDING' AND job.queue = first_claimed.queue
              AND job.tenant < first_claimed.tenant
            ORDER BY job.tenant, job.priority DESC, job.ready_at, job.id LIMIT 1) IS NOT NULL
           OR (SELECT job.id FROM job
               WHERE job.status = 'PENDING' AND job.queue = first_claimed.queue
                 AND job.tenant > first_claimed.tenant
               ORDER BY job.tenant, job.priority DESC, job.ready_at, job.id LIMIT 1) IS NOT NULL
               AS shared
    FROM (SELECT DISTINCT ON (claimed.queue) claimed.queue, claimed.tenant FROM claimed
          ORDER BY claimed.queue, claimed.rank) AS first_claimed
)"""


def _claim_rows(shared: str, cursor: str = "NULL::text") -> str:
    """The claimed rows, then one row per queue of `shared` (an SQL relation of `queue` and
    `shared`, whether the queue's next claims should be fair), its `id` NULL and its `tenant`
    the `cursor` (an SQL expression over `shared`: a tenant the queue's cursor moves to, NULL
    for none)."""
    return f"""
SELECT id, task_type, payload_json, attempts, max_attempts, timeout_seconds, lease_id,
       visible_at, idempotency_key, rank, queue, tenant, flow, NULL::bool AS shared, trace_json
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, queue, {cursor}, NULL, shared,
       NULL
FROM {shared}"""


_CLAIM_WALK_ROWS = _claim_rows("probe")


FAIR_JOBS_PER_FLOW = 8
"""How many jobs of a claim's `max` a fair claim's window has per tenant when the queue has no
weights: a claim of `max` jobs looks at ceil(max / 8) tenants (at least two) and the cursor
rotates the rest through later claims, so a claim of 32 among 20 tenants costs four descents
and four walks, not twenty. With weights set the window holds `max` tenants (at least two),
so their proportions hold within each claim whenever the queue has no more tenants than
that (docs/architecture.md#fair-shares)."""


# The claim of queues where several tenants have ready jobs (`JobRepository._shared`) shares
# each batch between the flows (queue, tenant) that have ready work, in proportion to their
# weights (docs/architecture.md#fair-shares), and walks the indexes in their own order
# throughout, so its cost is O(flows x max) however long the backlog:
# 1. `flows`: per queue asked for (not paused; one primary-key probe of the small
#    queue_control table), up to its window's count of tenants with PENDING jobs
#    (`window_flows`: ceil(max / FAIR_JOBS_PER_FLOW) without weights, `max` with them; at
#    least 2), found by a loose index scan of ix_job_claim_tenant (one descent per tenant),
#    starting after the tenant this replica served last in the queue (the cursor,
#    $cursors) and wrapping round, so every tenant gets its turn however many there are.
# 2. `walked`: of each flow at most its share of `max` (ceil(max x weight / total weight))
#    jobs in claim order (priority first, then the time each became ready), each
#    walk cut by its LIMIT right above the index scan, rows locked by other claimers skipped.
# 3. `fair`: the `max` jobs with the smallest keys (n - u) / weight, n the job's place in its
#    flow's walk and u a random offset in [0, 1) per flow and claim: a flow of weight 3 gets
#    three jobs for each one of a flow of weight 1, in expectation exactly.
# 4. `topped`: what the shares left over (a flow with fewer ready jobs than its share) is
#    taken in claim order over the queues' whole backlogs (ix_job_claim), so the claim is
#    work-conserving: a tenant alone still gets the whole batch.
# Rows a walk locked but the claim did not pick are unlocked at the end of the statement. The
# task types a queue limits are left to the limited claim (_CLAIM_LIMITED).
# Parameters: $1 queues, $2 max, $3 worker, $4 visibility timeout (seconds), {cursors} the
# cursor tenant per queue (NULL: none yet), aligned with $1. A claim that began before a pause
# (or a limit) committed may still take that queue's jobs (its snapshot predates it): such
# jobs have a `claimed_at` before the change's commit.
_CLAIM_FAIR_CTE_TEMPLATE = """
wanted AS (
    SELECT asked.queue, asked.cursor_tenant, control.limits, control.weights,
           CASE WHEN control.weights IS NULL OR control.weights = '{{}}'::jsonb
                THEN GREATEST(($2 + {jobs_per_flow} - 1) / {jobs_per_flow}, 2)
                ELSE GREATEST($2, 2) END AS window_flows
    FROM unnest($1::text[], {cursors}::text[]) AS asked(queue, cursor_tenant)
    LEFT JOIN queue_control AS control ON control.queue = asked.queue
    WHERE control.paused_at IS NULL
), flows AS (
    SELECT wanted.queue, wanted.cursor_tenant, wanted.limits, wanted.weights,
           wanted.window_flows, 1 AS n, first.*
    FROM wanted CROSS JOIN LATERAL {first} AS first
    UNION ALL
    SELECT flows.queue, flows.cursor_tenant, flows.limits, flows.weights, flows.window_flows,
           flows.n + 1, next.*
    FROM flows CROSS JOIN LATERAL {next} AS next
    -- One tenant past the window is looked for: it tells whether the window is full.
    WHERE flows.n <= flows.window_flows
), shares AS (
    SELECT flows.queue, flows.tenant, flows.n AS flow, flows.priority, flows.ready_at,
           flows.id, flows.limits, weighed.weight, random() AS offset_u,
           LEAST($2, ceil($2 * weighed.weight / sum(weighed.weight) OVER ())::int) AS quota
    FROM flows CROSS JOIN LATERAL (
        SELECT COALESCE((flows.weights ->> flows.tenant)::float8, 1) AS weight
    ) AS weighed
    WHERE flows.n <= flows.window_flows
), walked AS (
    SELECT candidate.id, candidate.tenant, shares.queue, shares.flow,
           (candidate.nth - shares.offset_u) / shares.weight AS share_key
    FROM shares CROSS JOIN LATERAL (
        SELECT locked.id, locked.tenant,
               row_number() OVER (ORDER BY locked.priority DESC, locked.ready_at, locked.id)
                   AS nth
        -- From the flow's first ready job on (its priority, then the lower ones), so the
        -- walk never reads again the index entries of jobs claimed since the last vacuum
        -- that the descent finding the flow has just read.
        FROM (SELECT * FROM (
                  SELECT id, tenant, priority, ready_at FROM job
                  WHERE status = 'PENDING' AND queue = shares.queue AND tenant = shares.tenant
                    AND priority = shares.priority
                    AND (ready_at, id) >= (shares.ready_at, shares.id)
                    AND (shares.limits IS NULL OR NOT shares.limits ? task_type)
                  ORDER BY ready_at, id
                  LIMIT shares.quota
                  FOR UPDATE SKIP LOCKED) AS at_first_priority
              UNION ALL
              SELECT * FROM (
                  SELECT id, tenant, priority, ready_at FROM job
                  WHERE status = 'PENDING' AND queue = shares.queue AND tenant = shares.tenant
                    AND priority < shares.priority
                    AND (shares.limits IS NULL OR NOT shares.limits ? task_type)
                  ORDER BY priority DESC, ready_at, id
                  LIMIT shares.quota
                  FOR UPDATE SKIP LOCKED) AS below_it
              LIMIT shares.quota) AS locked
    ) AS candidate
), fair AS (
    SELECT id, flow, share_key FROM walked ORDER BY share_key LIMIT $2
), topped AS (
    SELECT candidate.id, row_number() OVER (
               ORDER BY candidate.priority DESC, candidate.ready_at, candidate.id) AS nth
    FROM wanted CROSS JOIN LATERAL (
        SELECT id, priority, ready_at FROM job
        WHERE status = 'PENDING' AND queue = wanted.queue
          AND (wanted.limits IS NULL OR NOT wanted.limits ? task_type)
          AND id <> ALL(ARRAY(SELECT id FROM fair))
        ORDER BY priority DESC, ready_at, id
        LIMIT $2 - (SELECT count(*) FROM fair)
        FOR UPDATE SKIP LOCKED
    ) AS candidate
    ORDER BY candidate.priority DESC, candidate.ready_at, candidate.id
    LIMIT $2 - (SELECT count(*) FROM fair)
), picked AS (
    -- Claim order, computed here: the rows come back from the UPDATE in no order. The flow
    -- (its place in the window) of a fair pick moves the cursor; a top-up has none.
    SELECT id, flow, row_number() OVER (ORDER BY grade, sort_key) AS rank
    FROM (SELECT id, flow, 0 AS grade, share_key AS sort_key FROM fair
          UNION ALL
          SELECT id, NULL, 1, nth FROM topped) AS both_kinds
), {claimed}"""


# A fair claim's queue stays shared while the walks of two flows or more found jobs to claim
# (a tenant whose ready jobs are all of limited task types, or all locked by other claimers,
# does not count), or while its window was full (`flows` found a tenant past it, which no
# share takes): tenants past it may have such jobs. A full window in which fewer than two
# flows found jobs moves the cursor to its last tenant, so the next window looks at the
# tenants after it instead of the same ones again.
_CLAIM_FAIR_ROWS = _claim_rows(
    """(SELECT flows.queue,
           count(DISTINCT walked.flow) >= 2 OR max(flows.n) > max(flows.window_flows)
               AS shared,
           CASE WHEN count(DISTINCT walked.flow) < 2 AND max(flows.n) > max(flows.window_flows)
                THEN max(flows.tenant) FILTER (WHERE flows.n = flows.window_flows)
           END AS window_end
    FROM flows LEFT JOIN walked ON walked.queue = flows.queue AND walked.flow = flows.n
    GROUP BY flows.queue) AS spread""",
    cursor="window_end",
)


def _fair_claim_ctes(cursors: str) -> str:
    """The fair claim's CTEs (ending with `claimed`), with `cursors` the parameter that holds
    the cursor tenant per queue."""
    return _CLAIM_FAIR_CTE_TEMPLATE.format(
        cursors=cursors,
        jobs_per_flow=FAIR_JOBS_PER_FLOW,
        first=_next_tenant(
            "wanted", "COALESCE(wanted.cursor_tenant, '')", "false", "wanted.cursor_tenant"
        ),
        next=_next_tenant("flows", "flows.tenant", "flows.wrapped", "flows.cursor_tenant"),
        claimed=_claimed_cte("$3", "$4", flow="picked.flow"),
    )


# Claims of one limited (queue, task type) take a transaction-scoped advisory lock on the pair
# first (_LOCK_LIMIT), then count in a statement of their own: its snapshot is taken after the
# lock, so it sees every claim of the pair committed before, and two claimers can never both
# fill the last slot. A claimer that finds the lock taken waits for it (a claim of the pair
# takes milliseconds); the claims of one replica take turns in memory first
# (QueueService._claim_pair), so no more than one per replica waits here, holding a pooled
# connection, and claimers that skipped the pair instead slept a poll interval, which held a
# pair with many claimers well below its rate limit. Other pairs, queues and the unlimited
# claim never touch it.
def _pair_lock(queue: str, task_type: str) -> str:
    """SQL for the advisory-lock key of the limited pair (`queue`, `task_type`: SQL
    expressions), the same for its claims (_LOCK_LIMIT) and for limit changes (_LOCK_PAIRS)."""
    return f"hashtextextended('jobq.limit:' || {queue} || '/' || {task_type}, 0)"


_LOCK_LIMIT = f"SELECT pg_advisory_xact_lock({_pair_lock('$1', '$2')})"

# The PENDING jobs of the pair ($1 queue, $2 task type), found through ix_job_claim_type. The
# range on the task type, the same value as its equality, says nothing new, but it makes
# PostgreSQL's estimate of the pair's share of the queue small (a range of unknown bounds is
# estimated at 0.5 %): the generic plan of a table whose jobs are nearly all of one type
# estimates `task_type = $2` at 100 % and would walk ix_job_claim filtered on the type as
# cheaply, reading the queue's whole backlog of other types when the pair has few ready jobs
# or none (`make bench-compare --limit-other`).
_PAIR_PENDING = (
    "status = 'PENDING' AND queue = $1::text AND task_type = $2::text"
    " AND task_type >= $2::text AND task_type <= $2::text"
)

# At most `concurrency` PROCESSING jobs of the pair and `tenantConcurrency` of one tenant, and
# no more handed out than the pair's token bucket (`rate` per second, `burst` at most) and
# each tenant's (`tenantRate`, `tenantBurst`) hold: the room left (`room`) bounds the walk
# (ix_job_claim_type: the pair's jobs in claim order); tenants at their bound or out of
# tokens are skipped by it, and of each other tenant no more rows are taken than it has slots
# and tokens left. The buckets (`rate_bucket`, no row: full) are refilled on read, as
# `tokens + rate x seconds since`, and what the claim took is spent in the same statement,
# under the pair's lock, so replicas never spend a token twice. No row in `control` (no limit
# for the pair any more, or the queue paused) is no room: the unlimited claim takes such jobs.
# After the claimed rows comes one row without an id: which bound held the claim back
# (`held_by`: concurrency, rate or tenant; NULL: none) and, when a token bucket did, the
# seconds until its next token (`wait_seconds`).
# Parameters: $1 queue, $2 task type, $3 max, $4 worker, $5 visibility timeout (seconds).
_CLAIM_LIMITED = f"""
WITH control AS (
    SELECT (limits -> $2::text ->> 'concurrency')::int AS concurrency,
           (limits -> $2::text ->> 'tenantConcurrency')::int AS per_tenant,
           (limits -> $2::text ->> 'rate')::float8 AS rate,
           (limits -> $2::text ->> 'burst')::float8 AS burst,
           (limits -> $2::text ->> 'tenantRate')::float8 AS tenant_rate,
           (limits -> $2::text ->> 'tenantBurst')::float8 AS tenant_burst
    FROM queue_control WHERE queue = $1::text AND paused_at IS NULL AND limits ? $2::text
), running AS (
    SELECT tenant, count(*)::int AS n FROM job
    WHERE status = 'PROCESSING' AND queue = $1::text AND task_type = $2::text
    GROUP BY tenant
), buckets AS (
    SELECT bucket.tenant,
           LEAST(CASE WHEN bucket.tenant = '' THEN control.burst ELSE control.tenant_burst END,
                 bucket.tokens + EXTRACT(EPOCH FROM statement_timestamp() - bucket.updated_at)
                     * CASE WHEN bucket.tenant = '' THEN control.rate
                            ELSE control.tenant_rate END) AS tokens
    FROM rate_bucket AS bucket, control
    WHERE bucket.queue = $1::text AND bucket.task_type = $2::text
      AND CASE WHEN bucket.tenant = '' THEN control.rate ELSE control.tenant_rate END
          IS NOT NULL
), pair_tokens AS (
    SELECT COALESCE((SELECT tokens FROM buckets WHERE tenant = ''), control.burst) AS n
    FROM control WHERE control.rate IS NOT NULL
), room AS (
    SELECT GREATEST(0, LEAST(
               $3::int,
               COALESCE(control.concurrency - (SELECT COALESCE(sum(n), 0) FROM running)::int,
                        $3::int),
               COALESCE(floor((SELECT n FROM pair_tokens))::int, $3::int))) AS n,
           control.concurrency - (SELECT COALESCE(sum(n), 0) FROM running)::int
               AS concurrency_room
    FROM control
), excluded AS (
    -- Tenants the walk skips: at their tenantConcurrency, or out of tenantRate tokens.
    SELECT running.tenant FROM running, control WHERE running.n >= control.per_tenant
    UNION ALL
    SELECT buckets.tenant FROM buckets, control
    WHERE buckets.tenant <> '' AND buckets.tokens < 1 AND control.tenant_rate IS NOT NULL
), walked AS (
    SELECT candidate.*,
           row_number() OVER (PARTITION BY candidate.tenant
                              ORDER BY candidate.priority DESC, candidate.ready_at,
                                       candidate.id) AS nth
    FROM (SELECT id, tenant, priority, ready_at FROM job
          WHERE {_PAIR_PENDING}
            AND tenant <> ALL(ARRAY(SELECT tenant FROM excluded))
          ORDER BY priority DESC, ready_at, id
          LIMIT COALESCE((SELECT n FROM room), 0)
          FOR UPDATE SKIP LOCKED) AS candidate
), picked AS (
    SELECT walked.id, walked.tenant,
           row_number() OVER (ORDER BY walked.priority DESC, walked.ready_at, walked.id)
               AS rank
    FROM walked
    WHERE walked.nth + COALESCE((SELECT n FROM running WHERE running.tenant = walked.tenant), 0)
          <= COALESCE((SELECT per_tenant FROM control), {INT_MAX})
      AND walked.nth <= COALESCE(
              floor((SELECT tokens FROM buckets WHERE buckets.tenant = walked.tenant)),
              (SELECT tenant_burst FROM control), {INT_MAX})
), {_claimed_cte("$4", "$5")}, spent AS (
    INSERT INTO rate_bucket AS bucket (queue, task_type, tenant, tokens, updated_at)
    SELECT $1::text, $2::text, '', pair_tokens.n - (SELECT count(*) FROM claimed),
           statement_timestamp()
    FROM pair_tokens
    UNION ALL
    SELECT $1::text, $2::text, claimed.tenant,
           COALESCE(min(buckets.tokens), min(control.tenant_burst)) - count(*),
           statement_timestamp()
    FROM claimed CROSS JOIN control LEFT JOIN buckets ON buckets.tenant = claimed.tenant
    WHERE control.tenant_rate IS NOT NULL
    GROUP BY claimed.tenant
    ON CONFLICT (queue, task_type, tenant) DO UPDATE
        SET tokens = EXCLUDED.tokens, updated_at = EXCLUDED.updated_at
), pruned AS (
    -- A tenant's bucket refilled to its burst is the same as none: its row goes, so the
    -- pair keeps rows only for tenants served within the last tenantBurst / tenantRate
    -- seconds, and each claim reads no more.
    DELETE FROM rate_bucket AS bucket USING buckets, control
    WHERE bucket.queue = $1::text AND bucket.task_type = $2::text
      AND bucket.tenant = buckets.tenant AND buckets.tenant <> ''
      AND buckets.tokens >= control.tenant_burst
      AND buckets.tenant <> ALL(ARRAY(SELECT tenant FROM claimed))
)
SELECT id, task_type, payload_json, attempts, max_attempts, timeout_seconds, lease_id,
       visible_at, idempotency_key, rank, queue, tenant, flow,
       NULL::text AS held_by, NULL::float8 AS wait_seconds, trace_json
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       CASE WHEN NOT held.waiting OR held.claimed >= $3 THEN NULL
            WHEN held.tokens_left < 1 THEN 'rate'
            WHEN held.claimed >= room.concurrency_room THEN 'concurrency'
            WHEN held.claimed < held.walked OR held.tenants_out THEN 'tenant' END,
       CASE WHEN NOT held.waiting OR held.claimed >= $3 THEN NULL
            WHEN held.tokens_left < 1 THEN (1 - held.tokens_left) / (SELECT rate FROM control)
            ELSE (SELECT min((1 - buckets.tokens) / control.tenant_rate)
                  FROM buckets, control WHERE buckets.tenant <> '' AND buckets.tokens < 1) END,
       NULL
FROM room CROSS JOIN LATERAL (
    SELECT (SELECT count(*) FROM claimed) AS claimed, (SELECT count(*) FROM walked) AS walked,
           (SELECT n FROM pair_tokens) - (SELECT count(*) FROM claimed) AS tokens_left,
           EXISTS (SELECT FROM excluded) AS tenants_out,
           -- Jobs of the pair this claim left waiting: those it walked but did not claim,
           -- else looked for only when the room cut the walk or the walk skipped tenants
           -- (else it found every one, and a queue without jobs of the pair would be read
           -- whole at each claim).
           CASE WHEN (SELECT count(*) FROM claimed) < (SELECT count(*) FROM walked) THEN true
                WHEN (SELECT count(*) FROM walked) < room.n AND NOT EXISTS (SELECT FROM excluded)
                THEN false
                ELSE (SELECT id FROM job WHERE {_PAIR_PENDING}
                                          AND id <> ALL(ARRAY(SELECT id FROM walked))
                      ORDER BY priority DESC, ready_at, id LIMIT 1) IS NOT NULL END AS waiting
) AS held
"""

# Each entry is fenced by its own receipt handle: only the latest claim may complete a job.
# Parameters: ids, receipt handles and results (JSON text or NULL), as arrays.
_ACK_CTES = """
entries AS (
    SELECT * FROM unnest({ids}::uuid[], {handles}::uuid[], {results}::text[])
        AS e(id, receipt_handle, result)
), finished AS (
    -- The job leaves the live table in the statement that completes it (settle-and-move).
    DELETE FROM job USING entries
    -- `id = ANY(ids)` lets the plan fetch the rows by primary key, however many jobs run.
    WHERE job.id = ANY({ids}::uuid[]) AND job.id = entries.id
      AND job.lease_id = entries.receipt_handle AND job.status = 'PROCESSING'
    RETURNING job.*, entries.result AS new_result
), acked AS (
    {archive}
    RETURNING id, queue, task_type, attempts,
              EXTRACT(EPOCH FROM finished_at - created_at)::float8 AS end_to_end,
              trace_context::text AS trace_json
)"""

_ACK_CTES = _ACK_CTES.replace(
    "{archive}",
    archive(
        "finished",
        status="'COMPLETED'",
        result="CAST(job.new_result AS jsonb)",
        locked_by="NULL::text",
        finished_at=_NOW,
        updated_at=_NOW,
    )
    .replace("{", "{{")
    .replace("}", "}}"),
)

_CLAIM = f"WITH {_CLAIM_WALK_CTES} {_CLAIM_WALK_ROWS}"

_CLAIM_FAIR = f"WITH RECURSIVE {_fair_claim_ctes('$5')} {_CLAIM_FAIR_ROWS}"

_ACK = f"WITH {_ACK_CTES.format(ids='$1', handles='$2', results='$3')} SELECT * FROM acked"


def _ack_and_claim(claim_ctes: str, claim_rows: str, recursive: str = "") -> str:
    """A worker's acks and its next claim in one statement: one round trip and one commit
    (one WAL flush) for both. The acked rows are PROCESSING and the claimed ones PENDING, so
    the two updates never touch the same row. `is_claim` is true for a claimed job (and a
    probe row, which has no id), false for an acked one."""
    return f"""
WITH {recursive}{_ACK_CTES.format(ids="$5", handles="$6", results="$7")}, {claim_ctes}
SELECT true AS is_claim, id, task_type, payload_json, attempts, max_attempts, timeout_seconds,
       lease_id, visible_at, idempotency_key, rank, queue, tenant, flow, shared,
       NULL::float8 AS end_to_end, trace_json
FROM ({claim_rows}) AS claim_rows
UNION ALL
SELECT false, id, task_type, NULL, attempts, NULL, NULL, NULL, NULL, NULL, NULL,
       queue, NULL, NULL, NULL, end_to_end, trace_json
FROM acked
"""


_ACK_AND_CLAIM = _ack_and_claim(_CLAIM_WALK_CTES, _CLAIM_WALK_ROWS)
_ACK_AND_CLAIM_FAIR = _ack_and_claim(_fair_claim_ctes("$8"), _CLAIM_FAIR_ROWS, "RECURSIVE ")

_LEASES = "SELECT id, lease_id, status FROM job_all WHERE id = ANY($1::uuid[])"

_CONTROL_COLUMNS = "queue, paused_at, limits, weights, changed_at, changed_by, change"

# Whether queue $1 is known: it has jobs (waiting or running in `job`, finished in
# `job_history`: a queue whose jobs all finished is still known) or a row of queue_control.
_QUEUE_KNOWN = """
WHERE EXISTS (SELECT FROM job WHERE queue = $1::text)
   OR EXISTS (SELECT FROM job_history WHERE queue = $1::text)
   OR EXISTS (SELECT FROM queue_control WHERE queue = $1::text)"""

# Pause ($2 true) or resume a known queue (`_QUEUE_KNOWN`); pausing a paused queue keeps the
# time it was first paused. No row comes back for a queue nobody knows.
_SET_PAUSED = f"""
INSERT INTO queue_control AS control (queue, paused_at, changed_at, changed_by, change)
SELECT $1::text, CASE WHEN $2::bool THEN statement_timestamp() END, statement_timestamp(),
       $3::text, CASE WHEN $2::bool THEN 'pause' ELSE 'resume' END{_QUEUE_KNOWN}
ON CONFLICT (queue) DO UPDATE
    SET paused_at = CASE WHEN $2 THEN COALESCE(control.paused_at, statement_timestamp()) END,
        changed_at = EXCLUDED.changed_at, changed_by = EXCLUDED.changed_by,
        change = EXCLUDED.change
RETURNING {_CONTROL_COLUMNS}
"""


def _set_control(column: str) -> str:
    """SQL replacing a queue's `column` of queue_control (`limits` or `weights`) with $2
    (jsonb), for a known queue (`_QUEUE_KNOWN`), recorded as the change `column` by $3; a
    pause is kept. No row comes back for a queue nobody knows."""
    return f"""
INSERT INTO queue_control AS control (queue, {column}, changed_at, changed_by, change)
SELECT $1::text, $2::jsonb, statement_timestamp(), $3::text, '{column}'{_QUEUE_KNOWN}
ON CONFLICT (queue) DO UPDATE
    SET {column} = EXCLUDED.{column}, changed_at = EXCLUDED.changed_at,
        changed_by = EXCLUDED.changed_by, change = EXCLUDED.change
RETURNING {_CONTROL_COLUMNS}
"""


_SET_LIMITS = _set_control("limits")
_SET_WEIGHTS = _set_control("weights")

# After a queue's limits ($2, jsonb) change, the buckets of bounds that are gone (a task type
# no longer limited, a `rate` or `tenantRate` removed) go with them; the others keep their
# tokens (a lower burst caps them when next read), so editing a limit is no refill.
# Before a queue's limits change, the locks of every pair they limit now or will limit ($2),
# in one order (two concurrent changes never deadlock; claims only try the lock): a claim of
# a pair under way finishes first, so none spends into a bucket after its bound was dropped.
_LOCK_PAIRS = f"""
SELECT count(pg_advisory_xact_lock({_pair_lock("$1::text", "pair")}))
FROM (SELECT jsonb_object_keys(limits) AS pair FROM queue_control
      WHERE queue = $1::text AND limits IS NOT NULL
      UNION
      SELECT jsonb_object_keys($2::jsonb)
      ORDER BY 1) AS pairs
"""

_DROP_BUCKETS = """
DELETE FROM rate_bucket AS bucket
WHERE bucket.queue = $1::text
  AND (($2::jsonb -> bucket.task_type ->> CASE WHEN bucket.tenant = '' THEN 'rate'
                                               ELSE 'tenantRate' END) IS NULL)
"""

# A resumed queue's long polls, on every replica, are woken to claim at once.
_WAKE_ALL = f"SELECT pg_notify('{WAKEUP_CHANNEL}', $1::text || ':' || {INT_MAX})"

_CONTROLS = f"SELECT {_CONTROL_COLUMNS} FROM queue_control ORDER BY queue"

# Each limited (queue, task type) with its limit, its PROCESSING jobs (found through
# ix_job_reaper, the partial index of PROCESSING jobs), its PENDING ones (through
# ix_job_claim_type, at most $1 of them counted) and the tokens of its rate bucket (NULL: no rate).
_LIMIT_READINGS = """
SELECT control.queue, limited.task_type, (limited.bounds ->> 'concurrency')::int AS concurrency,
       (SELECT count(*) FROM job WHERE status = 'PROCESSING' AND queue = control.queue
                                   AND task_type = limited.task_type)::int AS running,
       (SELECT count(*) FROM (SELECT FROM job WHERE status = 'PENDING' AND queue = control.queue
                                               AND task_type = limited.task_type
                                               -- as in _PAIR_PENDING
                                               AND task_type >= limited.task_type
                                               AND task_type <= limited.task_type
                              LIMIT $1::int) AS pending)::int AS waiting,
       LEAST((limited.bounds ->> 'burst')::float8, COALESCE(
           (SELECT bucket.tokens + EXTRACT(EPOCH FROM statement_timestamp() - bucket.updated_at)
                                   * (limited.bounds ->> 'rate')::float8
            FROM rate_bucket AS bucket
            WHERE bucket.queue = control.queue AND bucket.task_type = limited.task_type
              AND bucket.tenant = ''),
           (limited.bounds ->> 'burst')::float8)) AS tokens
FROM queue_control AS control, jsonb_each(control.limits) AS limited(task_type, bounds)
ORDER BY 1, 2
"""


def _append_error(entry: str) -> str:
    # Keep the newest entries only, so a job failing forever cannot grow without bound.
    return (
        f"(CASE WHEN jsonb_array_length(job.errors) >= {ERRORS_HISTORY_MAX} "
        f"THEN job.errors - 0 ELSE job.errors END) || jsonb_build_array({entry})"
    )


_FAIL_CEILING = BACKOFF_CEILING_SQL.format(
    attempt="job.attempts", max_delay="$7", base_delay="$8", multiplier="$9"
)

# Workers' failure reports. A cancel requested meanwhile wins over a retry; `retry_after` (the
# processor's own wish) wins over the backoff. Rows are locked in id order, so two batches
# touching the same jobs wait for each other instead of deadlocking.
_FAIL_ERRORS = _append_error(
    "jsonb_build_object('attempt', job.attempts, 'at', statement_timestamp(), 'error', {error})"
)

# A failure that ends the job (dead letter, or a cancel confirmed) moves it to the history in
# this statement; a retry stays live as SCHEDULED. The two CTEs change disjoint rows.
_FAIL = f"""
WITH entries AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bool[], $5::float8[],
                         $6::float8[])
        AS e(id, receipt_handle, error, retryable, retry_after, jitter)
), decided AS (
    SELECT job.id, entries.error, entries.retry_after, entries.jitter,
           CASE WHEN job.cancel_requested THEN 'CANCELLED'
                WHEN NOT entries.retryable
                     OR job.attempts::bigint - job.releases >= job.max_attempts THEN 'DEAD_LETTER'
                ELSE 'SCHEDULED' END AS next_status
    FROM job JOIN entries
      ON job.id = entries.id AND job.lease_id = entries.receipt_handle
    WHERE job.id = ANY($1::uuid[]) AND job.status = 'PROCESSING'
    ORDER BY job.id
    FOR UPDATE OF job
), finished AS (
    DELETE FROM job USING decided
    WHERE job.id = ANY($1::uuid[]) AND job.id = decided.id
      AND decided.next_status <> 'SCHEDULED'
    RETURNING job.*, decided.next_status, decided.error AS new_error
), archived AS (
    {
    archive(
        "finished",
        status="job.next_status",
        finished_at=_NOW,
        last_error="job.new_error",
        errors=_FAIL_ERRORS.format(error="job.new_error"),
        locked_by="NULL::text",
        updated_at=_NOW,
    )
}
    RETURNING id, queue, task_type, status, attempts, last_error,
              trace_context::text AS trace_json
), retried AS (
    UPDATE job SET
        status = decided.next_status,
        visible_at = statement_timestamp() + make_interval(secs => COALESCE(
                         decided.retry_after,
                         decided.jitter * {_FAIL_CEILING})),
        finished_at = NULL,
        last_error = decided.error,
        errors = {_FAIL_ERRORS.format(error="decided.error")},
        locked_by = NULL,
        updated_at = statement_timestamp()
    FROM decided
    WHERE job.id = ANY($1::uuid[]) AND job.id = decided.id
      AND decided.next_status = 'SCHEDULED'
    RETURNING job.id, job.queue, job.task_type, job.status, job.attempts, job.last_error,
              job.trace_context::text AS trace_json
)
SELECT * FROM archived UNION ALL SELECT * FROM retried
"""

_EXPIRY_OUTCOME = """(CASE WHEN job.cancel_requested THEN 'CANCELLED'
          WHEN job.attempts::bigint - job.releases >= job.max_attempts THEN 'DEAD_LETTER'
          ELSE 'PENDING' END)"""
"""What an expired lease leads to, from the row as it is now (used twice in one UPDATE)."""

_REAP_ERRORS = _append_error(
    "jsonb_build_object('attempt', job.attempts, 'at', statement_timestamp(),"
    " 'error', 'lease expired')"
)

_REAP_MESSAGE = "'lease expired: no ack, fail or heartbeat within the visibility timeout'"

# An expired lease whose job is out of attempts (or was asked to stop) ends it: moved to the
# history in this statement. Otherwise the job is ready again at once (the expiry consumed
# the attempt), behind the work already waiting. Each outcome is computed from the row as it
# is now, locked by `expired`, so the two CTEs change disjoint rows.
_REAP = f"""
WITH expired AS (
    SELECT id FROM job
    WHERE status = 'PROCESSING' AND visible_at < statement_timestamp()
    ORDER BY visible_at
    LIMIT $1
    -- A row being acked right now is locked: skip it rather than wait. A row locked and
    -- released after this snapshot is re-checked by the outer WHERE as it is now.
    FOR UPDATE SKIP LOCKED
), finished AS (
    DELETE FROM job
    WHERE job.id = ANY(ARRAY(SELECT id FROM expired))
      AND job.status = 'PROCESSING' AND job.visible_at < statement_timestamp()
      AND {_EXPIRY_OUTCOME} <> 'PENDING'
    RETURNING job.*, {_EXPIRY_OUTCOME} AS outcome
), archived AS (
    {
    archive(
        "finished",
        status="job.outcome",
        finished_at=_NOW,
        visible_at=_NOW,
        ready_at=_NOW,
        last_error=_REAP_MESSAGE,
        errors=_REAP_ERRORS,
        lease_id="NULL::uuid",
        locked_by="NULL::text",
        updated_at=_NOW,
    )
}
    RETURNING id, queue, task_type, status
), reaped AS (
    UPDATE job SET
        status = 'PENDING',
        finished_at = NULL,
        visible_at = statement_timestamp(),
        ready_at = statement_timestamp(),
        last_error = {_REAP_MESSAGE},
        errors = {_REAP_ERRORS},
        -- The lost lease's receipt handle must no longer settle the job.
        lease_id = NULL,
        locked_by = NULL,
        updated_at = statement_timestamp()
    WHERE job.id = ANY(ARRAY(SELECT id FROM expired))
      AND job.status = 'PROCESSING' AND job.visible_at < statement_timestamp()
      AND {_EXPIRY_OUTCOME} = 'PENDING'
    RETURNING job.id, job.queue, job.task_type, job.status
), woken AS ({_notify_ready("reaped")})
SELECT settled.*, (SELECT count(*) FROM woken) AS notified
FROM (SELECT * FROM archived UNION ALL SELECT * FROM reaped) AS settled
"""

# SQS ChangeMessageVisibility: the new timeout counts from this call, the whole lease is capped
# at 12 h from the claim, and 0 releases the job (counted in `releases`; past 3 x maxAttempts
# releases the job is dead-lettered, so a job released on every shutdown cannot loop forever).
# The 12 h cap is only computed for claims older than the new lease's length, so a claim time
# near the end of the timestamp range cannot overflow.
_RELEASE_ERRORS = _append_error(
    "jsonb_build_object('attempt', job.attempts, 'at', statement_timestamp(),"
    " 'error', 'released: ' || {reason})"
)


def _progress(fraction: str, message: str) -> str:
    # The processor's latest progress report rides the heartbeat (no fraction: none).
    return (
        f"CASE WHEN {fraction} IS NULL THEN job.progress"
        f" ELSE jsonb_build_object('fraction', {fraction}, 'message', {message},"
        " 'attempt', job.attempts, 'at', statement_timestamp()) END"
    )


# A release that ends the job (cancel requested, released too often) moves it to the history
# in this statement; every other entry stays live. The two CTEs change disjoint rows.
_HEARTBEAT = f"""
WITH entries AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::text[], $5::float8[],
                         $6::text[])
        AS e(id, receipt_handle, visibility_timeout, reason, fraction, message)
), decided AS (
    SELECT job.id, entries.visibility_timeout, entries.reason, entries.fraction,
           entries.message,
           statement_timestamp() + make_interval(secs => entries.visibility_timeout) AS lease_end,
           CASE WHEN entries.visibility_timeout > 0 THEN 'PROCESSING'
                WHEN job.cancel_requested THEN 'CANCELLED'
                WHEN job.releases::bigint + 1 > 3 * job.max_attempts::bigint THEN 'DEAD_LETTER'
                ELSE 'PENDING' END AS next_status
    FROM job JOIN entries
      ON job.id = entries.id AND job.lease_id = entries.receipt_handle
    WHERE job.id = ANY($1::uuid[]) AND job.status = 'PROCESSING'
    ORDER BY job.id
    FOR UPDATE OF job
), finished AS (
    DELETE FROM job USING decided
    WHERE job.id = ANY($1::uuid[]) AND job.id = decided.id
      AND decided.next_status IN ('CANCELLED', 'DEAD_LETTER')
    RETURNING job.*, decided.next_status, decided.reason AS release_reason,
              decided.fraction AS new_fraction, decided.message AS new_message
), archived AS (
    {
    archive(
        "finished",
        status="job.next_status",
        releases=f"LEAST(job.releases, {INT_MAX} - 1) + 1",
        visible_at=_NOW,
        lease_id="NULL::uuid",
        locked_by="NULL::text",
        finished_at=_NOW,
        last_error="CASE WHEN job.next_status = 'DEAD_LETTER'"
        " THEN 'released too often: more than 3 x maxAttempts releases'"
        " ELSE job.last_error END",
        progress=_progress("job.new_fraction", "job.new_message"),
        errors=_RELEASE_ERRORS.format(reason="job.release_reason"),
        updated_at=_NOW,
    )
}
    RETURNING id, queue, task_type, status, visible_at, cancel_requested, true AS released
), extended AS (
    UPDATE job SET
        status = decided.next_status,
        releases = CASE WHEN decided.visibility_timeout = 0
                        THEN LEAST(job.releases, {INT_MAX} - 1) + 1 ELSE job.releases END,
        visible_at = CASE
            WHEN decided.visibility_timeout = 0 THEN statement_timestamp()
            WHEN job.claimed_at < decided.lease_end - interval '{LEASE_CAP_HOURS} hours'
                THEN job.claimed_at + interval '{LEASE_CAP_HOURS} hours'
            ELSE decided.lease_end END,
        ready_at = CASE WHEN decided.next_status = 'PENDING' THEN statement_timestamp()
                        ELSE job.ready_at END,
        lease_id = CASE WHEN decided.visibility_timeout > 0 THEN job.lease_id END,
        locked_by = CASE WHEN decided.visibility_timeout > 0 THEN job.locked_by END,
        finished_at = NULL,
        progress = {_progress("decided.fraction", "decided.message")},
        -- A release says why in the job's history (not in last_error: it is no failure).
        errors = CASE WHEN decided.visibility_timeout = 0
                      THEN {_RELEASE_ERRORS.format(reason="decided.reason")}
                      ELSE job.errors END,
        updated_at = statement_timestamp()
    FROM decided
    WHERE job.id = ANY($1::uuid[]) AND job.id = decided.id
      AND decided.next_status IN ('PROCESSING', 'PENDING')
    RETURNING job.id, job.queue, job.task_type, job.status, job.visible_at, job.cancel_requested,
              decided.visibility_timeout = 0 AS released
), woken AS ({_notify_ready("extended")})
SELECT settled.*, (SELECT count(*) FROM woken) AS notified
FROM (SELECT * FROM archived UNION ALL SELECT * FROM extended) AS settled
"""

# Waiting jobs end now (moved to the history in this statement); a running one is asked to
# stop, and its worker confirms.
_CANCEL = f"""
WITH finished AS (
    DELETE FROM job
    WHERE id = $1 AND status IN ('PENDING', 'SCHEDULED') AND {_IN_SCOPE}
    RETURNING job.*
), archived AS (
    {
    archive(
        "finished",
        status="'CANCELLED'",
        cancel_requested="false",
        finished_at=_NOW,
        updated_at=_NOW,
    )
}
    RETURNING {_JOB_COLUMNS}
), asked AS (
    UPDATE job SET cancel_requested = true, finished_at = NULL,
                   updated_at = statement_timestamp()
    WHERE id = $1 AND status = 'PROCESSING' AND {_IN_SCOPE}
    RETURNING {_JOB_COLUMNS}
)
SELECT * FROM archived UNION ALL SELECT * FROM asked
"""

_CONFIRM_CANCELLED = f"""
WITH finished AS (
    DELETE FROM job WHERE id = $1 AND lease_id = $2 AND status = 'PROCESSING'
    RETURNING job.*
)
{
    archive(
        "finished", status="'CANCELLED'", locked_by="NULL::text", finished_at=_NOW, updated_at=_NOW
    )
}
RETURNING id, queue, task_type, status, attempts
"""

_RESET_FOR_RETRY = """
        status = 'PENDING', attempts = 0, releases = 0, lease_id = NULL, locked_by = NULL,
        cancel_requested = false, awaited = false, result = NULL, progress = NULL,
        claimed_at = NULL, finished_at = NULL,
        visible_at = statement_timestamp(), ready_at = statement_timestamp(),
        updated_at = statement_timestamp()
"""

# Only a finished, unsuccessful job may run again: a live job must never get a second copy.
# The job moves from the history back to the live table in this statement (`legacy`: a
# finished row a release before the history left in `job` and the sweep did not move yet).
_RETRY = f"""
WITH revived AS (
    DELETE FROM job_history
    WHERE id = $1 AND status IN ('DEAD_LETTER', 'CANCELLED') AND {_IN_SCOPE}
    RETURNING job_history.*
), retried AS (
    {revive("revived")}
    RETURNING {_JOB_COLUMNS}
), legacy AS (
    UPDATE job SET {_RESET_FOR_RETRY}
    WHERE id = $1 AND status IN ('DEAD_LETTER', 'CANCELLED') AND {_IN_SCOPE}
    RETURNING {_JOB_COLUMNS}
), both_ AS (
    SELECT * FROM retried UNION ALL SELECT * FROM legacy
), woken AS ({_notify_ready("both_")})
SELECT both_.*, (SELECT count(*) FROM woken) AS notified FROM both_
"""

# Dead letters picked in the history's id order (the primary key of each partition of
# job_history_dead, merged), moved back to the live table.
_REDRIVE = f"""
WITH picked AS (
    SELECT id FROM job_history
    WHERE status = 'DEAD_LETTER'
      AND ($1::text IS NULL OR queue = $1)
      AND ($2::text IS NULL OR task_type = $2)
      AND ($4::text IS NULL OR tenant = $4)
    ORDER BY id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), revived AS (
    DELETE FROM job_history
    WHERE id = ANY(ARRAY(SELECT id FROM picked)) AND status = 'DEAD_LETTER'
    RETURNING job_history.*
), moved AS (
    {revive("revived")}
    RETURNING queue, status
), woken AS ({_notify_ready("moved")})
SELECT count(*) AS moved, (SELECT count(*) FROM woken) AS notified FROM moved
"""

# A job becomes ready at the moment it came due, so it queues behind work that was waiting
# before then and ahead of work submitted after. Statements that update rows a LIMITed CTE
# picked find them by primary key (`id = ANY(ARRAY(…))`), never by joining the CTE: plans are
# generic (made once for every parameter value), and a join planned for an unknown LIMIT
# would scan the whole table.
_PROMOTE = f"""
WITH due AS (
    SELECT id FROM job
    WHERE status = 'SCHEDULED' AND visible_at <= statement_timestamp()
    ORDER BY visible_at
    LIMIT $1
    -- Several queue-service replicas promote concurrently; each takes different rows.
    FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE job SET status = 'PENDING', ready_at = job.visible_at,
                   updated_at = statement_timestamp()
    WHERE job.id = ANY(ARRAY(SELECT id FROM due)) AND job.status = 'SCHEDULED'
    RETURNING job.queue, job.status
), woken AS ({_notify_ready("promoted")})
SELECT queue, count(*) AS promoted, (SELECT count(*) FROM woken) AS notified
FROM promoted GROUP BY queue
"""


def listing_statement(
    conditions: Sequence[str],
    full: bool,
    limit_at: int,
    bytes_at: int,
    status: JobStatus | None = None,
) -> str:
    """The statement of `JobRepository.list_jobs`: jobs matching every SQL condition of
    `conditions` (`status = $1`, `id < $2`, …; `status` names the status the conditions ask
    for, if any), newest first, at most `$<limit_at>` of them and at most `$<bytes_at>` bytes
    of JSON (the first always), each with the count of the page before the byte cut
    (`total`).

    The page is the newest of up to three walks, each stopped at the limit: `job` without its
    leased rows (`ix_job_unleased_status_id`, `…_queue_id`, `…_tenant_id` or the primary
    key, backwards), the leased rows (`ix_job_reaper`, at most one per worker slot, sorted)
    and `job_history`; a walk that cannot hold the asked status is left out (a generic plan
    cannot see that `status <> 'PROCESSING' AND status = $1` is empty for PROCESSING, and
    would walk the primary key through every other row). They are walked apart because a
    view's branch with a WHERE clause is planned without the page's order and limit, and
    would read the table."""
    columns = _SUMMARY_COLUMNS + (", payload, errors, result" if full else "")
    where = " AND ".join(conditions) or "true"
    walks = []
    if status is not JobStatus.PROCESSING:
        walks.append(
            f"(SELECT {columns} FROM job WHERE status <> 'PROCESSING' AND {where}"
            f" ORDER BY id DESC LIMIT ${limit_at})"
        )
    if status in (None, JobStatus.PROCESSING):
        # Found first and sorted after (OFFSET 0 keeps the order out of their walk): walked
        # backwards by the primary key, filtering them out of a backlog, they would read all
        # of `job` whenever fewer than a page are leased, as is usual.
        walks.append(
            f"(SELECT {columns} FROM (SELECT {columns} FROM job"
            f" WHERE status = 'PROCESSING' AND {where} OFFSET 0) AS leased"
            f" ORDER BY id DESC LIMIT ${limit_at})"
        )
    if status is None or status in FINISHED_STATUSES:
        walks.append(
            f"(SELECT {columns} FROM job_history WHERE {where} ORDER BY id DESC LIMIT ${limit_at})"
        )
    walks_sql = " UNION ALL ".join(walks)
    # A running sum of each row's JSON size (an upper bound) keeps the prefix that fits; the
    # first row always does. The big columns of rows past the cut are never sent.
    return f"""
SELECT {columns}, total FROM (
    SELECT {columns}, count(*) OVER () AS total, row_number() OVER w AS n,
           sum(bytes) OVER w AS running
    FROM (SELECT {columns}, {_listed_bytes(full)} AS bytes
          FROM (SELECT {columns} FROM ({walks_sql}) AS walks
                ORDER BY id DESC LIMIT ${limit_at}) AS newest) AS page
    WINDOW w AS (ORDER BY id DESC ROWS UNBOUNDED PRECEDING)
) AS sized
WHERE n = 1 OR running <= ${bytes_at}
ORDER BY id DESC"""


def depth_statement(tenant: str | None = None) -> str:
    """Counts per (queue, status) of live jobs (in `job`) and dead letters (in
    `job_history_dead`, and any a release before the history left in `job`), with the age of
    the oldest PENDING job; `tenant`: an SQL expression restricting them to one tenant."""
    scope = f" AND tenant = {tenant}" if tenant else ""
    return f"""
SELECT queue, status, sum(count)::bigint AS count, max(oldest_age)::float8 AS oldest_age FROM (
    SELECT queue, status, count(*) AS count,
           COALESCE(EXTRACT(EPOCH FROM max(statement_timestamp() - visible_at)
                                       FILTER (WHERE status = 'PENDING')), 0) AS oldest_age
    FROM job
    WHERE status IN ('PENDING', 'SCHEDULED', 'DEAD_LETTER'){scope}
    GROUP BY queue, status
    UNION ALL
    -- Leased rows apart: the listing indexes leave them out (ix_job_unleased_tenant_id).
    SELECT queue, status, count(*), 0 FROM job
    WHERE status = 'PROCESSING'{scope}
    GROUP BY queue, status
    UNION ALL
    SELECT queue, status, count(*), 0 FROM job_history
    WHERE status = 'DEAD_LETTER'{scope}
    GROUP BY queue, status
) AS counted
GROUP BY queue, status
"""


_DEPTH = depth_statement()

# Expired idempotency keys, 500 per statement, oldest first; a key a submit is taking over at
# this moment is locked and skipped, and the outer WHERE re-checks the expiry as it is now.
# Both sides of the join are read by index, never the whole table: with a few thousand expired
# keys PostgreSQL joins them through the expiry index, with 100,000 it joins the 500 picked
# (the literal LIMIT) by primary key (tests/integration/test_claims.py).
FORGET_KEYS_STATEMENT = """
WITH expired AS (
    SELECT tenant, key FROM idempotency_key WHERE expires_at <= statement_timestamp()
    ORDER BY expires_at LIMIT 500 FOR UPDATE SKIP LOCKED
), forgotten AS (
    DELETE FROM idempotency_key AS held USING expired
    WHERE held.tenant = expired.tenant AND held.key = expired.key
      AND held.expires_at <= statement_timestamp()
    RETURNING 1
)
SELECT count(*) AS forgotten FROM forgotten
"""

# Finished rows a release before the history left in `job` (a rollout), moved $1 at a time,
# oldest first, by ix_job_retention (statuses as literals inside its predicate, so a generic
# plan can prove the index applies). services/queue/history.py runs it.
SWEEP_STATEMENT = f"""
WITH finished AS (
    DELETE FROM job WHERE id = ANY(ARRAY(
        SELECT id FROM job
        WHERE status IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER')
        ORDER BY finished_at
        LIMIT $1
        FOR UPDATE SKIP LOCKED))
      AND status IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER')
    RETURNING job.*
), archived AS (
    {archive("finished", finished_at="COALESCE(job.finished_at, job.updated_at)")}
    RETURNING 1
)
SELECT count(*) AS moved FROM archived
"""


_SCHEMA_REVISION = "SELECT version_num FROM alembic_version"

# Upsert the schedule's state, but only forward: on a concurrent fire the second replica waits
# for the first's row lock, then sees its committed bucket and updates nothing. The one way back
# is a clock stepped back: a stored bucket more than one period ($5) ahead of the database's
# clock would otherwise block the schedule until the clock caught up, so it is rewound to this
# bucket. clock_timestamp(), not statement_timestamp(): the WHERE is evaluated after the row
# lock was waited for, and the bucket another replica committed meanwhile must not look ahead.
# `previous` (read before the lock) only tells the caller whether it was a rewind.
_ADVANCE_SCHEDULE = """
WITH previous AS (SELECT last_bucket FROM schedule WHERE name = $1)
INSERT INTO schedule (name, cron, last_bucket, last_job_id, fired_at)
VALUES ($1, $2, $3, $4, statement_timestamp())
ON CONFLICT (name) DO UPDATE
    SET cron = EXCLUDED.cron, last_bucket = EXCLUDED.last_bucket,
        last_job_id = EXCLUDED.last_job_id, fired_at = EXCLUDED.fired_at
    WHERE schedule.last_bucket < EXCLUDED.last_bucket
       OR schedule.last_bucket > clock_timestamp() + $5::interval
RETURNING (SELECT last_bucket FROM previous) AS previous
"""

# The bucket's job existed already (created under its idempotency key before the schedule table
# did): the bucket counts as fired, but no job of this call backs it.
_FORGET_SCHEDULE_JOB = "UPDATE schedule SET last_job_id = NULL WHERE name = $1"

# One cheap statement (catalog views, no table scan). Only client sessions of this database
# count: PostgreSQL computes the horizon for this database's tables from them (and prepared
# transactions); this session's own short statement is left out. Other roles' sessions show
# their times only to a superuser or a member of pg_read_all_stats.
_HEALTH = """
SELECT GREATEST(
           (SELECT EXTRACT(EPOCH FROM max(clock_timestamp() - xact_start))
            FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid()
              AND backend_type = 'client backend'
              AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)),
           (SELECT EXTRACT(EPOCH FROM max(clock_timestamp() - prepared))
            FROM pg_prepared_xacts WHERE database = current_database()),
           0)::float8 AS oldest_transaction_age,
       COALESCE(s.n_live_tup, 0) AS live_tuples,
       COALESCE(s.n_dead_tup, 0) AS dead_tuples,
       EXTRACT(EPOCH FROM clock_timestamp() - GREATEST(s.last_vacuum, s.last_autovacuum)
       )::float8 AS last_vacuum_age
FROM (SELECT 1) AS one
LEFT JOIN pg_stat_user_tables AS s ON s.relid = 'job'::regclass
"""

CLAIM_STATEMENT = _CLAIM
"""The claim statement itself, for plan-regression tests (EXPLAIN of the real statement):
parameters ($1 queues, $2 max, $3 worker, $4 visibility timeout in seconds)."""

CLAIM_LIMITED_STATEMENT = _CLAIM_LIMITED
"""The claim of one limited (queue, task type), for the same tests: ($1 queue, $2 task type,
$3 max, $4 worker, $5 visibility timeout in seconds)."""

LIMIT_READINGS_STATEMENT = _LIMIT_READINGS
"""The depth refresh's reading of every limited pair, for the same tests: ($1 the most
waiting jobs counted)."""

ACK_AND_CLAIM_STATEMENT = _ACK_AND_CLAIM
"""The combined ack-and-claim statement, for plan-regression tests: the claim's four
parameters, then ($5 ids, $6 receipt handles, $7 results as JSON text)."""

CLAIM_CTES = _CLAIM_WALK_CTES
"""The claim statement's CTEs (`claimed` and `probe`), for benchmark/pgbench.py's script."""

CLAIM_FAIR_STATEMENT = _CLAIM_FAIR
"""The fair claim statement (queues shared by several tenants): the claim's four parameters,
then $5 the cursor tenant per queue."""

ACK_AND_CLAIM_FAIR_STATEMENT = _ACK_AND_CLAIM_FAIR
"""The fair ack-and-claim statement: the ack-and-claim's seven parameters, then $8 the cursor
tenant per queue."""

# The other transitions, for the same tests (each statement's parameters are documented above
# it).
ACK_STATEMENT = _ACK
FAIL_STATEMENT = _FAIL
HEARTBEAT_STATEMENT = _HEARTBEAT
REAP_STATEMENT = _REAP
PROMOTE_STATEMENT = _PROMOTE
REDRIVE_STATEMENT = _REDRIVE
CANCEL_STATEMENT = _CANCEL
RETRY_STATEMENT = _RETRY
GET_STATEMENT = _GET


_CONTENTION = {"40P01", "40001"}
"""deadlock_detected, serialization_failure: the statement can simply be run again."""
_CONTENTION_RETRIES = 3

_UNAVAILABLE_STATES = {"57P01", "57P02", "57P03", "57014"}
"""admin_shutdown, crash_shutdown, cannot_connect_now (starting, stopping or recovering), and
query_canceled (statement_timeout): the database cannot serve this statement right now."""


_BROKEN_CONNECTION = (asyncpg.InterfaceError, asyncpg.exceptions._base.InternalClientError)
"""The driver's own connection went wrong (closed under it, or left mid-operation when the
server went away): the connection is discarded, and the statement answered 503."""


def _never_sent(exc: BaseException) -> bool:
    """True when asyncpg refused to start a statement because the connection was still in an
    earlier operation's state ("cannot switch to state N; another operation (M) is in
    progress"; under load a pooled connection is sometimes handed out stuck so:
    MagicStack/asyncpg#784 and #1069). Nothing reached the server, so the statement can run
    again on another connection, whatever it does."""
    return (
        isinstance(exc, asyncpg.exceptions._base.InternalClientError)
        and str(exc).startswith("cannot switch to state")
        and "another operation" in str(exc)
    )


def _unavailable(exc: BaseException) -> bool:
    """True when `exc` means "the database cannot serve us right now": a lost or refused
    connection, a server starting, stopping or out of connections, a pool or statement
    timeout. Such errors are answered 503 with Retry-After, never 500."""
    if isinstance(exc, (OSError, TimeoutError, *_BROKEN_CONNECTION)):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = exc.sqlstate or ""
        # Class 08: connection exception; class 53: insufficient resources (too many
        # connections, out of memory, disk full).
        return state.startswith(("08", "53")) or state in _UNAVAILABLE_STATES
    return False


@contextlib.asynccontextmanager
async def _translated(refusals: RepeatedEvents) -> AsyncIterator[None]:
    """Turn "database unavailable" driver errors into `ServiceUnavailable` (HTTP 503),
    logged through `refusals`."""
    try:
        yield
    except (asyncpg.PostgresError, *_BROKEN_CONNECTION, OSError, TimeoutError) as exc:
        if not _unavailable(exc):
            raise
        raise _database_unavailable(refusals, "database unavailable", exc) from exc


def _database_unavailable(
    refusals: RepeatedEvents, what: str, exc: BaseException
) -> ServiceUnavailable:
    """Log `what` happened (`exc`, the driver's error) through `refusals`, and return the 503
    to raise. Every request refused during an outage would log a line: the first of each kind
    is written, the rest folded (`common.logging.RepeatedEvents`)."""
    kind = type(exc).__name__
    refusals.log(
        logger,
        logging.WARNING,
        f"{what}: {kind}",
        "%s: %s: %s",
        what,
        kind,
        exc,
        extra={"event": "database_unavailable"},
    )
    return ServiceUnavailable("the database is unavailable; retry shortly")


async def _init_connection(connection: asyncpg.Connection) -> None:
    """Decode and encode jsonb with msgspec on every pooled connection."""
    await connection.set_type_codec(
        "jsonb",
        encoder=lambda value: msgspec.json.encode(value).decode(),
        decoder=msgspec.json.decode,
        schema="pg_catalog",
        format="text",
    )


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Pool release hook: nothing to reset. The repository never changes session state (no
    SET, LISTEN or advisory locks on pooled connections; HotVacuum's SET statement_timeout
    and advisory lock are undone before it gives its connection back), and asyncpg's default
    reset costs a round trip per statement."""


_NOT_YET = (OSError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError)
"""Connection errors of a database that is not accepting connections yet: nothing listens on
the port (refused, or the host name does not resolve yet), or it is starting up or shutting
down (`CannotConnectNowError`, SQLSTATE 57P03), or it is full. Anything else (a wrong password,
a missing database) is not waited out."""


async def wait_for_database(dsn: str, wait: float) -> None:
    """Return once PostgreSQL at `dsn` (a `postgresql://` URL) accepts a connection, trying
    again with exponential backoff (0.2 s up to 2 s, jittered) for up to `wait` seconds while
    it refuses or is starting up; each wait is logged at WARNING.

    `alembic upgrade head` calls this first: in compose the database's first start runs a
    temporary socket-only server (the image's initialisation), so a TCP connection is refused
    for a while even after a socket healthcheck passed (issue 25 item 1). Raises the last
    connection error when `wait` runs out, and any other error (authentication, unknown
    database) at once.
    """

    def waiting(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        logger.warning(
            "waiting for the database (%.1f s of %.0f s): %s",
            state.seconds_since_start or 0.0,
            wait,
            error,
            extra={"event": "database_wait"},
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(_NOT_YET),
        stop=stop_after_delay(wait),
        wait=wait_exponential_jitter(initial=0.2, max=2.0),
        before_sleep=waiting,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            connection = await asyncpg.connect(dsn, timeout=min(max(wait, 1.0), 10.0))
            await connection.close()


async def create_pool(
    dsn: str,
    *,
    size: int,
    command_timeout: float = 30.0,
    server_settings: dict[str, str] | None = None,
) -> asyncpg.Pool:
    """An asyncpg pool of `size` connections to `dsn` for a `JobRepository`.

    Connections are opened lazily, so the service starts (and reports not ready) while the
    database is down. `command_timeout` (seconds) bounds every statement on the client side.

    Sessions use generic plans for prepared statements (`plan_cache_mode`): every statement
    here is planned once per connection instead of on each of its first executions and
    whenever PostgreSQL prefers a custom plan, which for the claim cost more than running it.
    """
    pool = asyncpg.create_pool(
        dsn,
        # With tracing on, each statement is a span named by its constant (`statements`).
        connection_class=asyncpg.Connection if tracing.tracer is None else TracedConnection,
        min_size=0,
        max_size=size,
        command_timeout=command_timeout,
        server_settings={
            "application_name": "jobq-queue",
            "plan_cache_mode": "force_generic_plan",
            **(server_settings or {}),
        },
        init=_init_connection,
        reset=_keep_session,
    )
    return await pool


def _json_or_null(value: Any) -> str | None:
    return None if value is None else msgspec.json.encode(value).decode()


def _raw_or_none(text: str | None) -> msgspec.Raw | None:
    return None if text is None else msgspec.Raw(text.encode())


def _claimed(rows: list[asyncpg.Record], visibility_timeout: int) -> list[Claimed]:
    """Claimed jobs from claim rows, in claim order (their `rank`)."""
    rows.sort(key=lambda r: r["rank"])
    return [
        Claimed(
            id=row["id"],
            task_type=row["task_type"],
            queue=row["queue"],
            tenant=row["tenant"],
            payload=msgspec.Raw(row["payload_json"].encode()),
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            timeout_seconds=row["timeout_seconds"],
            receipt_handle=row["lease_id"],
            visibility_timeout=visibility_timeout,
            visible_at=row["visible_at"],
            idempotency_key=row["idempotency_key"],
            trace_context=_raw_or_none(row["trace_json"]),
        )
        for row in rows
    ]


def _completed(rows: list[asyncpg.Record]) -> list[Settled]:
    """Settled (COMPLETED) jobs from ack rows."""
    return [
        Settled(
            r["id"],
            r["queue"],
            r["task_type"],
            JobStatus.COMPLETED,
            attempts=r["attempts"],
            end_to_end_seconds=r["end_to_end"],
            trace_json=r["trace_json"],
        )
        for r in rows
    ]


@dataclass(frozen=True, slots=True)
class LimitedClaim:
    """What `JobRepository.claim_limited` handed out (`jobs`, in claim order) and, when a
    bound of the pair kept jobs of it waiting, which (`held_by`: `concurrency`, `rate`,
    or `tenant`), with the seconds until
    a token bucket that held them back has its next token (`wait_seconds`, else None)."""

    jobs: list[Claimed]
    held_by: str | None
    wait_seconds: float | None


_CURSORS_KEPT = 10_000
"""Queues whose fair-claim cursor a replica keeps; past it they all start again."""

SHARING_HOLD = 1.0
"""Seconds a replica walks a queue its fair claim found one flow left to claim in before the
walk's probe may share it again: a tenant whose ready jobs all wait for a limit (or are
locked by other claimers) is seen by the probe but not claimable, and would otherwise flip
the queue between the two statements at every claim."""


class JobRepository:
    """PostgreSQL access for jobs, over an asyncpg pool (see `create_pool`).

    `acquire_timeout` (seconds) bounds the wait for a free pooled connection; a wait that runs
    out is ServiceUnavailable, like an unreachable database. `metrics`, if given, counts the
    pool's use.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        acquire_timeout: float = 10.0,
        metrics: PoolMetrics | None = None,
    ) -> None:
        self._pool = pool
        self._acquire_timeout = acquire_timeout
        self._metrics = metrics
        self._refusals = RepeatedEvents()
        self._deadline: float | None = None
        self._scopes: set[asyncio.Timeout] = set()
        self._cursors: dict[str, str] = {}
        # Queues this replica saw several tenants with ready jobs in: their claims are shared.
        self._shared: set[str] = set()
        # Queues a fair claim unshared, until when (time.monotonic()) the probe is not heeded.
        self._walk_until: dict[str, float] = {}
        self._claimed_by_tenant: dict[tuple[str, str], int] = {}

    def _cursors_of(self, queues: Sequence[str]) -> list[str | None]:
        """The fair claim's cursor per queue of `queues`: the tenant this replica served last
        in the queue's window (its claims start after it), None before the first claim."""
        return [self._cursors.get(queue) for queue in queues]

    def _fair(self, queues: Sequence[str]) -> bool:
        """Whether a claim of `queues` shares its batch (the fair statement): when this
        replica last saw several tenants with ready jobs in one of them."""
        return not self._shared.isdisjoint(queues)

    def _claimed_rows(
        self, rows: Sequence[asyncpg.Record], queues: Sequence[str], fair: bool
    ) -> list[asyncpg.Record]:
        """The claimed jobs' rows of a claim of `queues` (the fair statement's when `fair`),
        after counting them by (queue, tenant) and learning which queues to share from the
        rows without an id (`queue`, `shared`, `tenant`): a queue the walk's probe found
        another tenant in is shared from the next claim on (unless a fair claim unshared it
        less than SHARING_HOLD seconds ago); a queue whose fair claim's window was not full
        and whose walks found jobs of one flow or none is walked again. Each shared queue's
        cursor moves to the tenant of the last flow (in window order) the fair claim served,
        or, when a full window had fewer than two flows with jobs to claim, to the window's
        last tenant (the row's `tenant`), so the next window starts after it."""
        claimed = [row for row in rows if row["id"] is not None]
        counts = self._claimed_by_tenant
        last: dict[str, tuple[int, str]] = {}
        for row in claimed:
            key = (row["queue"], row["tenant"])
            counts[key] = counts.get(key, 0) + 1
            flow = row["flow"]
            if flow is not None and flow >= last.get(row["queue"], (0, ""))[0]:
                last[row["queue"]] = (flow, row["tenant"])
        spread = set()
        for row in rows:
            if row["id"] is None and row["shared"]:
                spread.add(row["queue"])
                if row["tenant"] is not None:  # a full window without two claimable flows
                    last[row["queue"]] = (0, row["tenant"])
        self._learn_sharing(spread, queues, fair)
        if fair:
            if len(self._cursors) + len(last) > _CURSORS_KEPT:
                self._cursors.clear()  # bounded: asked-for queue names come from workers
            for queue, (_, tenant) in last.items():
                self._cursors[queue] = tenant
        return claimed

    def _learn_sharing(self, spread: set[str], queues: Sequence[str], fair: bool) -> None:
        """After a claim of `queues` (the fair statement when `fair`) that found claimable
        jobs of several tenants in the queues `spread`: share those, and after a fair claim,
        walk the other shared ones of `queues` again, not heeding the probe for them for
        SHARING_HOLD seconds."""
        now = time.monotonic()
        if len(self._shared) + len(spread) > _CURSORS_KEPT:
            self._shared.clear()  # bounded: asked-for queue names come from workers
        if not fair:
            for queue in spread:
                if self._walk_until.get(queue, 0.0) <= now:
                    self._walk_until.pop(queue, None)
                    self._shared.add(queue)
            return
        for queue in queues:
            if queue in spread:
                self._shared.add(queue)
            elif queue in self._shared:
                self._shared.discard(queue)
                if len(self._walk_until) >= _CURSORS_KEPT:
                    self._walk_until.clear()
                self._walk_until[queue] = now + SHARING_HOLD

    def take_claimed_by_tenant(self) -> dict[tuple[str, str], int]:
        """The jobs this replica handed out since the last call, by (queue, tenant)."""
        taken, self._claimed_by_tenant = self._claimed_by_tenant, {}
        return taken

    def stop_waiting_at(self, when: float) -> None:
        """Shutdown: every database operation, in flight or to come, ends by event-loop time
        `when` (`loop.time()`), answered ServiceUnavailable when it cannot finish by then; an
        earlier `when` than a previous call's wins.

        A database that vanished (in compose: its container stopped, taking its address)
        leaves connects and statements hanging until their own timeouts (10 s, 30 s), past
        the service's shutdown grace; with this, requests draining at shutdown answer 503 in
        time and the background loops stop (issue 25 item 4). A healthy database is not
        affected: its statements end long before.
        """
        if self._deadline is not None and self._deadline <= when:
            return
        self._deadline = when
        for scope in list(self._scopes):
            with contextlib.suppress(RuntimeError):  # expiring or left already
                scope.reschedule(when)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        async with _translated(self._refusals), asyncio.timeout_at(self._deadline) as scope:
            self._scopes.add(scope)
            try:
                try:
                    # asyncio.timeout rather than acquire(timeout=…), which starts a task per
                    # call.
                    async with asyncio.timeout(self._acquire_timeout):
                        if self._metrics is None:
                            conn = await self._pool.acquire()
                        else:
                            conn = await self._metrics.acquired(self._pool.acquire)
                except asyncpg.PostgresError as exc:
                    # Refused while connecting, whatever the reason (connections not allowed,
                    # authentication, database missing): this replica cannot serve right now.
                    raise _database_unavailable(
                        self._refusals, "database refused a connection", exc
                    ) from exc
                try:
                    yield conn
                except (*_BROKEN_CONNECTION, asyncio.CancelledError):
                    # Never hand a connection in an unknown state to the next statement (nor
                    # one cancelled mid-statement, which asyncpg would try to cancel on the
                    # server over a new connection).
                    conn.terminate()
                    raise
                finally:
                    await self._pool.release(conn)
                    if self._metrics is not None:
                        self._metrics.released()
            finally:
                self._scopes.discard(scope)

    def connection(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        """A pooled connection with this repository's error translation (ServiceUnavailable
        for an unreachable database) and shutdown deadline, for the queue service's other
        stores (`services.queue.sqs_store`)."""
        return self._connection()

    async def _fetch(self, statement: str, *args: Any) -> list[asyncpg.Record]:
        """Run one statement (its own transaction); all its rows."""
        rows: list[asyncpg.Record] = await self._on_connection(
            lambda conn: conn.fetch(statement, *args)
        )
        return rows

    async def _fetchrow(self, statement: str, *args: Any) -> asyncpg.Record | None:
        """Run one statement (its own transaction); its first row, if any."""
        row: asyncpg.Record | None = await self._on_connection(
            lambda conn: conn.fetchrow(statement, *args)
        )
        return row

    async def fetch(self, statement: str, *args: Any) -> list[asyncpg.Record]:
        """Run one statement of another module of the queue service (`activity`, `bulk`) in
        its own transaction, with this repository's pool, deadlines and error translation;
        all its rows."""
        return await self._fetch(statement, *args)

    async def execute(self, statement: str, *args: Any) -> None:
        """Like `fetch`, for a statement whose rows nobody reads."""
        await self._on_connection(lambda conn: conn.execute(statement, *args))

    async def _on_connection(self, statement: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """`statement(conn)` (one statement) on a pooled connection; when the driver refused to
        start it on a connection stuck in an earlier operation (`_never_sent`), once more on
        a fresh connection (the stuck one is closed)."""
        for attempt in range(2):
            async with self._connection() as conn:
                try:
                    return await statement(conn)
                except asyncpg.exceptions._base.InternalClientError as exc:
                    if attempt or not _never_sent(exc):
                        raise
                    conn.terminate()
                    logger.warning(
                        "discarded a stuck database connection: %s",
                        exc,
                        extra={"event": "database_connection_stuck"},
                    )
        raise AssertionError("unreachable")

    async def insert_many(self, rows: Sequence[JobRow]) -> list[Inserted]:
        """Insert `rows` in one statement (`common.enqueue`, which also wakes claimers of
        queues that got ready jobs). Returns the jobs created; a row whose id or idempotency
        key exists is skipped. With `find_existing`, this is the `common.enqueue.Executor` the
        service's `insert_jobs` runs on: each statement on its own pooled connection."""
        if not rows:
            return []
        for attempt in range(_CONTENTION_RETRIES):
            try:
                return await self._on_connection(
                    lambda conn: AsyncpgExecutor(conn).insert_many(rows)
                )
            except asyncpg.PostgresError as exc:
                # The statement orders its rows, so a deadlock needs an outside party; the
                # loser is rolled back whole and simply tries again.
                if exc.sqlstate not in _CONTENTION or attempt == _CONTENTION_RETRIES - 1:
                    raise
                await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        raise AssertionError("unreachable")

    async def insert(self, row: JobRow) -> Inserted | None:
        """Insert one job; None when its id or idempotency key exists."""
        inserted = await self.insert_many([row])
        return inserted[0] if inserted else None

    async def find_existing(self, row: JobRow) -> Existing | None:
        """The job holding `row.id`, or `row.tenant`'s job holding its idempotency key (the
        id first), or None."""
        return await self._on_connection(lambda conn: AsyncpgExecutor(conn).find_existing(row))

    async def release_key(self, row: JobRow) -> bool:
        """Delete `row.tenant`'s idempotency key `row.idempotency_key` if the job holding it
        is gone (deleted, or dropped by retention); whether it did."""
        return await self._on_connection(lambda conn: AsyncpgExecutor(conn).release_key(row))

    async def get(
        self, job_id: uuid.UUID, tenant: str | None = None
    ) -> tuple[JobView, uuid.UUID | None] | None:
        """The job and its current receipt handle (lease id), or None; with a `tenant`, None
        also for another tenant's job."""
        row = await self._fetchrow(_GET, job_id, tenant)
        return None if row is None else (_to_view(row), row["lease_id"])

    async def get_many(self, ids: Sequence[uuid.UUID]) -> list[JobView]:
        """The views of the jobs of `ids` that exist, in no particular order (any tenant)."""
        rows = await self._fetch(_GET_MANY, list(ids))
        return [_to_view(row) for row in rows]

    async def mark_awaited(self, job_id: uuid.UUID, tenant: str | None = None) -> JobView | None:
        """Flag a live job (PENDING, SCHEDULED, PROCESSING) as awaited, so its settle notifies
        `jobq_settled`; its view as flagged, or None when it is finished, missing, or (with a
        `tenant`) another tenant's."""
        row = await self._fetchrow(_MARK_AWAITED, job_id, tenant)
        return None if row is None else _to_view(row)

    async def claim(
        self, queues: Sequence[str], worker: str, max_jobs: int, visibility_timeout: int
    ) -> list[Claimed]:
        """Claim up to `max_jobs` PENDING jobs from `queues` in one statement: the walk of each
        queue in claim order, or, for queues this replica saw several tenants with ready jobs
        in, the fair claim, shared between the flows (queue, tenant) in proportion to their
        weights (`queue_control.weights`, 1 for a tenant not named) and topped up in claim
        order when a flow has fewer than its share (docs/architecture.md#fair-shares).

        Each claimed job becomes PROCESSING with `attempts + 1`, a new receipt handle and a
        lease ending `visibility_timeout` seconds from now (database time). Returns them in
        claim order: priority descending, then the time each became ready, then id; for a
        fair claim the fair picks first (in that order within a flow), then the top-ups.
        """
        names = list(dict.fromkeys(queues))
        fair = self._fair(names)
        if fair:
            rows = await self._fetch(
                _CLAIM_FAIR, names, max_jobs, worker, visibility_timeout, self._cursors_of(names)
            )
        else:
            rows = await self._fetch(_CLAIM, names, max_jobs, worker, visibility_timeout)
        return _claimed(self._claimed_rows(rows, names, fair), visibility_timeout)

    async def claim_limited(
        self,
        queue: str,
        task_type: str,
        worker: str,
        max_jobs: int,
        visibility_timeout: int,
    ) -> LimitedClaim:
        """Claim up to `max_jobs` PENDING jobs of `task_type` in `queue`, within the pair's
        limits (`queue_control.limits`): no more than the room its `concurrency` leaves beside
        the PROCESSING jobs of the pair on every replica, nor more of one tenant than its
        `tenantConcurrency` leaves, nor more than the tokens its `rate` and each tenant's
        `tenantRate` buckets hold (spent by this claim). Nothing when the queue is paused or
        the pair has no limit (the unlimited claim, `claim`, takes its jobs then).

        One transaction: an advisory lock on the pair, then the claim in a statement whose
        snapshot follows the lock, so concurrent claimers of the pair never both take its last
        slot or token; a claimer waits while another holds the lock (for its few
        milliseconds). Other pairs and queues are not affected. Returns the jobs
        in claim order, like `claim`, with the bound that held jobs of the pair back, if any,
        and when a token bucket did, the seconds until its next token.
        """
        async with self._connection() as conn, conn.transaction():
            await conn.execute(_LOCK_LIMIT, queue, task_type)
            rows = await conn.fetch(
                _CLAIM_LIMITED, queue, task_type, max_jobs, worker, visibility_timeout
            )
        held = [row for row in rows if row["id"] is None]
        claimed = [row for row in rows if row["id"] is not None]
        jobs = _claimed(self._claimed_rows(claimed, (), fair=False), visibility_timeout)
        if not held:  # no row in `control`: the pair is no longer limited, or paused
            return LimitedClaim(jobs, None, None)
        return LimitedClaim(jobs, held[0]["held_by"], held[0]["wait_seconds"])

    async def ack_and_claim(
        self,
        entries: Sequence[tuple[uuid.UUID, uuid.UUID, Any]],
        queues: Sequence[str],
        worker: str,
        max_jobs: int,
        visibility_timeout: int,
    ) -> tuple[list[Claimed], list[Settled]]:
        """`ack_many(entries)` and `claim(...)` in one statement (one round trip, one commit).

        Returns the jobs claimed, in claim order, and the jobs this call completed.
        """
        names = list(dict.fromkeys(queues))
        fair = self._fair(names)
        args = [
            names,
            max_jobs,
            worker,
            visibility_timeout,
            [entry[0] for entry in entries],
            [entry[1] for entry in entries],
            [_json_or_null(entry[2]) for entry in entries],
        ]
        if fair:
            rows = await self._fetch(_ACK_AND_CLAIM_FAIR, *args, self._cursors_of(names))
        else:
            rows = await self._fetch(_ACK_AND_CLAIM, *args)
        claimed = self._claimed_rows([row for row in rows if row["is_claim"]], names, fair)
        acked = [row for row in rows if not row["is_claim"]]
        return _claimed(claimed, visibility_timeout), _completed(acked)

    async def ack_many(self, entries: Sequence[tuple[uuid.UUID, uuid.UUID, Any]]) -> list[Settled]:
        """Complete every `(id, receipt handle, result)` whose handle is current, in one
        statement; returns the jobs this call completed (with seconds from submit)."""
        rows = await self._fetch(
            _ACK,
            [entry[0] for entry in entries],
            [entry[1] for entry in entries],
            [_json_or_null(entry[2]) for entry in entries],
        )
        return _completed(rows)

    async def leases(
        self, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[uuid.UUID | None, JobStatus]]:
        """{id: (current receipt handle, status)} for the jobs among `ids` that exist."""
        rows = await self._fetch(_LEASES, list(ids))
        return {row["id"]: (row["lease_id"], JobStatus(row["status"])) for row in rows}

    async def fail_many(self, entries: Sequence[FailEntry], backoff: Backoff) -> list[Settled]:
        """Record failed attempts whose receipt handle is current, in one statement: each job
        becomes SCHEDULED after its jittered backoff (seconds), or DEAD_LETTER when not
        retryable or out of attempts, or CANCELLED when a cancel was requested. Returns the
        jobs this call changed."""
        rows = await self._fetch(
            _FAIL,
            [e.id for e in entries],
            [e.receipt_handle for e in entries],
            [e.error for e in entries],
            [e.retryable for e in entries],
            [e.retry_after for e in entries],
            [e.jitter for e in entries],
            backoff.max_delay,
            backoff.base_delay,
            backoff.multiplier,
        )
        return [
            Settled(
                r["id"],
                r["queue"],
                r["task_type"],
                JobStatus(r["status"]),
                attempts=r["attempts"],
                last_error=r["last_error"],
                trace_json=r["trace_json"],
            )
            for r in rows
        ]

    async def heartbeat_many(
        self,
        entries: Sequence[tuple[uuid.UUID, uuid.UUID, int, str]],
        progress: Mapping[uuid.UUID, ProgressReport] | None = None,
    ) -> list[Extended]:
        """For each `(id, receipt handle, visibility timeout, reason)` whose handle is current:
        extend the lease to that many seconds from now (capped at 12 h after the claim), or
        release the job when it is 0, recording `released: <reason>` in its errors; and store
        the job's `progress` report, if it has one (`JobProgress`, with the attempt and the
        time). One statement; returns the jobs it changed."""
        reports = [progress.get(entry[0]) if progress else None for entry in entries]
        rows = await self._fetch(
            _HEARTBEAT,
            [entry[0] for entry in entries],
            [entry[1] for entry in entries],
            [entry[2] for entry in entries],
            [entry[3] for entry in entries],
            [None if report is None else report.fraction for report in reports],
            [None if report is None else report.message for report in reports],
        )
        return [
            Extended(
                r["id"],
                r["queue"],
                r["task_type"],
                JobStatus(r["status"]),
                r["visible_at"],
                r["cancel_requested"],
                r["released"],
            )
            for r in rows
        ]

    async def reap_expired(self, batch: int = 500) -> list[Settled]:
        """Return up to `batch` expired leases to PENDING, or DEAD_LETTER when out of attempts
        (CANCELLED when a cancel was requested)."""
        rows = await self._fetch(_REAP, batch)
        return [Settled(r["id"], r["queue"], r["task_type"], JobStatus(r["status"])) for r in rows]

    async def promote_due(self, batch: int = 500) -> dict[str, int]:
        """Promote up to `batch` due SCHEDULED jobs to PENDING and wake their claimers, in one
        statement. Returns how many were promoted per queue."""
        rows = await self._fetch(_PROMOTE, batch)
        return {row["queue"]: row["promoted"] for row in rows}

    async def cancel(self, job_id: uuid.UUID, tenant: str | None = None) -> JobView | None:
        """Cancel a waiting job, or ask a running one to stop; None when the job is finished,
        unknown or (with a `tenant`) another tenant's."""
        row = await self._fetchrow(_CANCEL, job_id, tenant)
        return None if row is None else _to_view(row)

    async def confirm_cancelled(self, job_id: uuid.UUID, lease_id: uuid.UUID) -> Settled | None:
        """A worker stopped the job after a cancel request; None when `lease_id` is stale."""
        row = await self._fetchrow(_CONFIRM_CANCELLED, job_id, lease_id)
        if row is None:
            return None
        return Settled(
            row["id"], row["queue"], row["task_type"], JobStatus.CANCELLED, row["attempts"]
        )

    async def retry(self, job_id: uuid.UUID, tenant: str | None = None) -> JobView | None:
        """Make a DEAD_LETTER or CANCELLED job PENDING again with attempts and releases reset;
        None when the job is in any other state, unknown or (with a `tenant`) another
        tenant's."""
        row = await self._fetchrow(_RETRY, job_id, tenant)
        return None if row is None else _to_view(row)

    async def redrive(
        self, queue: str | None, task_type: str | None, batch: int, tenant: str | None = None
    ) -> int:
        """Move up to `batch` dead-lettered jobs (optionally of one queue / task type / tenant)
        back to PENDING in one statement; returns how many moved."""
        row = await self._fetchrow(_REDRIVE, queue, task_type, batch, tenant)
        return int(row["moved"]) if row is not None else 0

    async def list_jobs(
        self,
        *,
        status: JobStatus | None,
        queue: str | None,
        task_type: str | None,
        before: uuid.UUID | None,
        limit: int,
        tenant: str | None = None,
        full: bool = False,
        max_bytes: int,
        idempotency_key: str | None = None,
    ) -> tuple[list[ListedJob], bool]:
        """Jobs matching the filters with id < `before` (keyset), newest first, at most `limit`
        and at most `max_bytes` of JSON (at least one job); with a `tenant`, that tenant's
        only; with `full`, with their payload, errors and result; with an `idempotency_key`,
        the job submitted with it (found by the per-tenant unique index when a `tenant` is
        given). Returns them and whether the byte bound left out jobs within `limit`.

        Only the given filters enter the statement (`listing_statement`), so each combination
        gets its own plan. The cut is made in the statement, so no more than one page's bytes
        leave PostgreSQL however large the jobs are.
        """
        conditions: list[str] = []
        args: list[Any] = []
        filters = (
            ("tenant", tenant),
            ("status", status),
            ("queue", queue),
            ("task_type", task_type),
            ("idempotency_key", idempotency_key),
            ("id <", before),
        )
        for column, value in filters:
            if value is not None:
                args.append(value)
                operator = "" if column.endswith("<") else " ="
                conditions.append(f"{column}{operator} ${len(args)}")
        args += [limit, max_bytes]
        statement = listing_statement(conditions, full, len(args) - 1, len(args), status)
        rows = await self._fetch(statements.named("list_jobs", statement), *args)
        cut = bool(rows) and rows[0]["total"] > len(rows)
        return [_to_listed(row, full) for row in rows], cut

    async def depth(self) -> list[DepthRow]:
        """Counts of live and dead-lettered jobs per (queue, status)."""
        rows = await self._fetch(_DEPTH)
        return [
            DepthRow(r["queue"], JobStatus(r["status"]), r["count"], r["oldest_age"]) for r in rows
        ]

    async def set_paused(self, queue: str, paused: bool, actor: str) -> QueueState | None:
        """Pause (`paused`) or resume `queue`, recording `actor` as who did it, and on resume
        wake the queue's long polls on every replica (NOTIFY, delivered at commit). Returns
        the queue's state after the change; None, changing nothing, for a queue that has no
        job and was never paused (a typo must not look like a pause)."""
        async with self._connection() as conn, conn.transaction():
            row = await conn.fetchrow(_SET_PAUSED, queue, paused, actor)
            if row is not None and not paused:
                await conn.execute(_WAKE_ALL, queue)
        return None if row is None else _to_state(row)

    async def set_limits(
        self, queue: str, limits: Sequence[ConcurrencyLimit], actor: str
    ) -> QueueState | None:
        """Replace `queue`'s limits with `limits` (one per task type; empty: none), recording
        `actor` as who did it, drop the token buckets of rate bounds that are gone (the
        others keep their tokens, capped by a lower burst when next read; the pairs' locks
        are taken first, so no claim under way spends into a dropped bucket), and wake the
        queue's long polls on every replica (a raised or removed limit may let jobs run at
        once). Stored as one jsonb object keyed by task type, which the claim probes (`?`).
        Returns the queue's state after the change; None, changing nothing, for a queue that
        has no job and no state."""
        stored = {
            limit.task_type: {
                "concurrency": limit.concurrency,
                "tenantConcurrency": limit.tenant_concurrency,
                "rate": limit.rate,
                "burst": limit.burst,
                "tenantRate": limit.tenant_rate,
                "tenantBurst": limit.tenant_burst,
            }
            for limit in limits
        }
        async with self._connection() as conn, conn.transaction():
            await conn.execute(_LOCK_PAIRS, queue, stored)
            row = await conn.fetchrow(_SET_LIMITS, queue, stored, actor)
            if row is not None:
                await conn.execute(_DROP_BUCKETS, queue, stored)
                await conn.execute(_WAKE_ALL, queue)
        return None if row is None else _to_state(row)

    async def set_weights(
        self, queue: str, weights: Sequence[TenantWeight], actor: str
    ) -> QueueState | None:
        """Replace `queue`'s tenant weights with `weights` (empty: every tenant weighs 1),
        recording `actor` as who did it. Stored as one jsonb object keyed by tenant, which the
        claim reads (`->>`) for each tenant it serves. Returns the queue's state after the
        change; None, changing nothing, for a queue that has no job and no state."""
        stored = {entry.tenant: entry.weight for entry in weights}
        row = await self._fetchrow(_SET_WEIGHTS, queue, stored, actor)
        return None if row is None else _to_state(row)

    async def queue_states(self) -> list[QueueState]:
        """The state of every queue that was ever paused, limited or weighed, by name."""
        return [_to_state(row) for row in await self._fetch(_CONTROLS)]

    async def limit_readings(self) -> list[LimitReading]:
        """Every limited (queue, task type): its concurrency limit, its jobs running now, its
        jobs waiting (PENDING, at most `WAITING_COUNTED` counted) and its rate bucket's
        tokens."""
        return [
            LimitReading(
                r["queue"],
                r["task_type"],
                r["concurrency"],
                r["running"],
                r["waiting"],
                r["tokens"],
            )
            for r in await self._fetch(_LIMIT_READINGS, WAITING_COUNTED)
        ]

    async def now(self) -> datetime:
        """The database's clock (`statement_timestamp()`), which decides every visibility."""
        row = await self._fetchrow(_NOW)
        assert row is not None
        value: datetime = row["now"]
        return value

    async def fire_schedule(
        self, name: str, cron: str, bucket: datetime, period: timedelta, row: JobRow
    ) -> ScheduleFiring:
        """Fire recurring schedule `name` for the cron bucket starting at `bucket` (`period`:
        from it to the next cron time): move its `last_bucket` forward and insert `row`, in
        one transaction. Nothing is fired when the bucket was not after the schedule's last
        one (another replica or an earlier run fired it; a lagging clock never fires an older
        bucket), unless the last one is more than `period` ahead of the database's clock: the
        clock was stepped back, and `last_bucket` is rewound to `bucket` (once, whatever the
        number of replicas: the row lock decides). No job is created either when the row's
        idempotency key already had one."""
        async with self._connection() as conn, conn.transaction():
            advanced = await conn.fetchrow(_ADVANCE_SCHEDULE, name, cron, bucket, row.id, period)
            if advanced is None:
                return ScheduleFiring(None, None)
            previous: datetime | None = advanced["previous"]
            rewound_from = previous if previous is not None and previous > bucket else None
            created = await AsyncpgExecutor(conn).insert_many([row])
            if not created:
                await conn.execute(_FORGET_SCHEDULE_JOB, name)
                return ScheduleFiring(None, rewound_from)
        return ScheduleFiring(created[0], rewound_from)

    async def health(self) -> DatabaseHealth:
        """The oldest open transaction's age, the `job` table's live and dead tuples and the
        time since its last vacuum, in one cheap statement over PostgreSQL's statistics views."""
        row = await self._fetchrow(_HEALTH)
        assert row is not None
        return DatabaseHealth(
            row["oldest_transaction_age"],
            row["live_tuples"],
            row["dead_tuples"],
            row["last_vacuum_age"],
        )

    async def schema_revision(self) -> str | None:
        """The alembic revision the database is at (None before the first migration)."""
        row = await self._fetchrow(_SCHEMA_REVISION)
        return None if row is None else str(row["version_num"])


_NOW = "SELECT statement_timestamp() AS now"

statements.register(globals())
