"""The `job` table of live work (docs/architecture.md#storage) with its named partial indexes,
the `job_history` table of finished jobs (partitioned: by list of status, then by range of
`finished_at`; its partitions are made and dropped by `services/queue/history.py`), the
`schedule` table that remembers which cron bucket each recurring schedule last fired, and the
`queue_control` table of queues operators paused.

This module is the schema's source of truth; every change ships as an alembic revision, and a
test runs `alembic check` to prove the migrations and this module agree.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from common.contracts import JobStatus

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "pk": "pk_%(table_name)s",
}

STATUSES = tuple(status.value for status in JobStatus)

UNLEASED = text("status <> 'PROCESSING'")
"""The predicate of the listing indexes of `job`: every row but the leased ones."""

# A hot queue table churns: vacuum it after a few percent of rows change rather than 20 %, and
# leave room on each page for HOT updates (pgqueuer and Oban give the same advice).
AUTOVACUUM_SETTINGS = {
    "postgresql_with": {
        "fillfactor": "80",
        "autovacuum_vacuum_scale_factor": "0.02",
        "autovacuum_analyze_scale_factor": "0.02",
        "autovacuum_vacuum_cost_delay": "0",
    }
}


class Base(DeclarativeBase):
    """Declarative base carrying the constraint naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    """One live job. `visible_at` means: due time (SCHEDULED), ready since (PENDING), lease
    expiry (PROCESSING); the finished states (in `job_history`) keep the last value.
    `ready_at` is when the job last became claimable (enqueue, promotion, retry, redrive,
    release, expiry): the claim order within a priority.

    The statement that finishes a job moves it to `job_history`, which has the same columns:
    a column added here must be added there, to `repository.ALL_COLUMNS` and to the view
    `job_all` (`job UNION ALL job_history`, made by migration a7f3c91e5d42), in one
    migration."""

    __tablename__ = "job"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    # The tenant that owns the job (docs/architecture.md#tenants).
    tenant: Mapped[str] = mapped_column(String(64), server_default=text("'default'"))
    queue: Mapped[str] = mapped_column(String(64))
    task_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    releases: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_attempts: Mapped[int] = mapped_column(Integer)
    timeout_seconds: Mapped[int | None] = mapped_column(Integer)
    visible_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ready_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    locked_by: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # Someone waits for this job's outcome (`GET /jobs/{id}?waitSeconds=N`): the trigger
    # `job_settled_awaited` (migration 8e1f4c2a7b35) notifies `jobq_settled` when it settles.
    awaited: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    last_error: Mapped[str | None] = mapped_column(Text)
    errors: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    result: Mapped[Any | None] = mapped_column(JSONB)
    # The latest progress its processor reported (common.contracts.JobProgress), or NULL.
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # The submitting span's W3C trace context (common.contracts.TraceContext), or NULL.
    trace_context: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    idempotency_key: Mapped[str | None] = mapped_column(Text)
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        CheckConstraint(f"status IN {STATUSES!r}", name="status_known"),
        CheckConstraint("attempts >= 0 AND releases >= 0", name="counters_non_negative"),
        # The claim reads ready rows only: best priority first, then in the order jobs became
        # ready (a retried or released job queues behind work already waiting), then by id.
        Index(
            "ix_job_claim",
            "queue",
            text("priority DESC"),
            "ready_at",
            "id",
            postgresql_where=text("status = 'PENDING'"),
        ),
        # The fair claim walks each tenant's ready jobs in claim order, and finds the tenants
        # with ready work by skipping from one to the next (docs/architecture.md#fair-shares).
        Index(
            "ix_job_claim_tenant",
            "queue",
            "tenant",
            text("priority DESC"),
            "ready_at",
            "id",
            postgresql_where=text("status = 'PENDING'"),
        ),
        # The claim of a limited task type walks the pair's ready jobs in claim order
        # (docs/architecture.md#flow-control).
        Index(
            "ix_job_claim_type",
            "queue",
            "task_type",
            text("priority DESC"),
            "ready_at",
            "id",
            postgresql_where=text("status = 'PENDING'"),
        ),
        Index("ix_job_scheduler", "visible_at", postgresql_where=text("status = 'SCHEDULED'")),
        Index("ix_job_reaper", "visible_at", postgresql_where=text("status = 'PROCESSING'")),
        Index(
            "ix_job_retention",
            "finished_at",
            postgresql_where=text("status IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER')"),
        ),
        # The listings' indexes leave leased jobs out: a claim's UPDATE is not HOT, and would
        # otherwise add an entry to each for every job claimed. Listings read PROCESSING rows
        # (at most one per worker slot) by ix_job_reaper (repository.listing_statement).
        Index("ix_job_unleased_status_id", "status", text("id DESC"), postgresql_where=UNLEASED),
        Index("ix_job_unleased_queue_id", "queue", text("id DESC"), postgresql_where=UNLEASED),
        # Idempotency keys are unique per tenant; jobs without one (most) stay out of the
        # index, so their inserts and state changes do not maintain it.
        Index(
            "uq_job_tenant_idempotency_key",
            "tenant",
            "idempotency_key",
            unique=True,
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
        # A tenant's listing walks its own jobs, newest first.
        Index("ix_job_unleased_tenant_id", "tenant", text("id DESC"), postgresql_where=UNLEASED),
        AUTOVACUUM_SETTINGS,
    )


FINISHED = ("COMPLETED", "CANCELLED", "DEAD_LETTER")
"""The statuses of `job_history`; `job` holds the others (and, during a rollout from a release
before the history, finished rows the sweep has not moved yet)."""

HISTORY_PARTITION_PREFIX = "job_history_"
"""Every partition of `job_history` is named with this prefix (`services/queue/history.py`);
the migrations' `alembic check` leaves them out, since they come and go at run time."""


class JobHistory(Base):
    """A finished job (COMPLETED, CANCELLED, DEAD_LETTER), moved out of `job` by the statement
    that finished it, with the same columns (docs/architecture.md#storage).

    Partitioned by LIST (status): `job_history_done` (COMPLETED, CANCELLED) and
    `job_history_dead` (DEAD_LETTER), each partitioned by RANGE (finished_at) in slots of
    `QUEUE_HISTORY_PARTITION` seconds plus a DEFAULT partition, so retention (different for
    the two) drops whole partitions. The primary key must hold the partition keys; with `id`
    first it is also the index of reads by id. No unique id across `job` and `job_history`
    can be declared: the moves keep one row per id (DELETE … RETURNING feeding the INSERT)."""

    __tablename__ = "job_history"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    queue: Mapped[str] = mapped_column(String(64))
    task_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    priority: Mapped[int] = mapped_column(Integer)
    attempts: Mapped[int] = mapped_column(Integer)
    releases: Mapped[int] = mapped_column(Integer)
    max_attempts: Mapped[int] = mapped_column(Integer)
    timeout_seconds: Mapped[int | None] = mapped_column(Integer)
    visible_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ready_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    locked_by: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean)
    awaited: Mapped[bool] = mapped_column(Boolean)
    last_error: Mapped[str | None] = mapped_column(Text)
    errors: Mapped[list[Any]] = mapped_column(JSONB)
    result: Mapped[Any | None] = mapped_column(JSONB)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    trace_context: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    idempotency_key: Mapped[str | None] = mapped_column(Text)
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)

    __table_args__ = (
        CheckConstraint(f"status IN {FINISHED!r}", name="status_finished"),
        # Listings walk newest first per queue or tenant (by status: the primary key's id).
        Index("ix_job_history_queue_id", "queue", text("id DESC")),
        Index("ix_job_history_tenant_id", "tenant", text("id DESC")),
        # A submit's key may collide with a finished job's (docs/architecture.md#idempotency).
        Index(
            "ix_job_history_tenant_idempotency_key",
            "tenant",
            "idempotency_key",
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
        {"postgresql_partition_by": "LIST (status)"},
    )


class IdempotencyKey(Base):
    """A tenant's idempotency key, held for its window (docs/architecture.md#idempotency):
    `job_id` is the job submitted under it, `request_hash` the request's hash, and the key
    blocks a different request, and replays the same one, until `expires_at`. A submit takes
    a key by inserting its row, or by taking over a row whose window is over; expired rows
    are deleted in batches by the retention loop. Its own table, so a key's life does not
    depend on where its job lives (`job` or `job_history`) or on the job's retention."""

    __tablename__ = "idempotency_key"

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        # The retention loop walks expired keys oldest first.
        Index("ix_idempotency_key_expires_at", "expires_at"),
        # Every key is inserted once and deleted once: vacuum early so the space is reused
        # and the table stays the size of one window's keys.
        {
            "postgresql_with": {
                "autovacuum_vacuum_scale_factor": "0.02",
                "autovacuum_analyze_scale_factor": "0.02",
                "autovacuum_vacuum_cost_delay": "0",
            }
        },
    )


class ScheduleState(Base):
    """One recurring schedule's state: the latest cron bucket it fired.

    A replica fires a bucket only by moving `last_bucket` forward in the same transaction as
    the job's insert, so replicas and restarts agree whatever retention has deleted. Rows of
    schedules no longer configured are kept (they are a few bytes) so a schedule that comes
    back does not fire a bucket it already fired.
    """

    __tablename__ = "schedule"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    cron: Mapped[str] = mapped_column(Text)
    last_bucket: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    fired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class QueueControl(Base):
    """A queue's run-time state, set by operators (`POST /queues/{queue}/pause|resume`,
    `PUT /queues/{queue}/limits`): paused since `paused_at` (NULL: running), its concurrency
    limits by task type (`limits`: `{"<task type>": {"concurrency": n, "tenantConcurrency":
    m}}`, either key optional), its tenants' weights in the fair share (`weights`: `{"<tenant>":
    w}`, 1 for a tenant not named), and its last change (when, by whom, what). No row means a
    queue that was never changed. The claim reads it (docs/architecture.md#flow-control).
    """

    __tablename__ = "queue_control"

    queue: Mapped[str] = mapped_column(String(64), primary_key=True)
    paused_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    limits: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    weights: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    changed_by: Mapped[str] = mapped_column(Text)
    change: Mapped[str] = mapped_column(Text)


class RateBucket(Base):
    """The token bucket of a dispatch rate limit (`rate` of `PUT /queues/{queue}/limits`):
    `tokens` left at `updated_at`, refilled at the limit's rate up to its burst when read.
    `tenant` is `''` for the bucket of the whole (queue, task type), else the tenant's own
    bucket (`tenantRate`). No row means a full bucket: the claim deletes a tenant's bucket it
    finds full, and setting a queue's limits deletes the buckets of the `rate` and
    `tenantRate` bounds it removes. Read and spent only by the claim of the pair, under the
    pair's advisory lock (docs/architecture.md#flow-control)."""

    __tablename__ = "rate_bucket"

    queue: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SqsQueueRecord(Base):
    """An SQS queue declared through the SQS endpoint (services.sqs): tenant `tenant` (the
    SQS account) named it `name`, its messages are the jobs of jobq queue `queue` (one SQS
    queue per jobq queue), and `attributes` holds its SQS attributes as SQS states them
    (`{"VisibilityTimeout": "30", ...}`). Only the SQS endpoint reads or writes them
    (docs/architecture.md#sqs-compatibility)."""

    __tablename__ = "sqs_queue"

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(80), primary_key=True)
    queue: Mapped[str] = mapped_column(String(64), unique=True)
    attributes: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Worker(Base):
    """A worker as its claims describe it, upserted in batches by the queue service (one
    statement per `QUEUE_ACTIVITY_INTERVAL`); `claimed` and `previous_claimed` count its
    claims in the clock minute `minute` and the one before (docs/architecture.md#operator-views).
    """

    __tablename__ = "worker"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    queues: Mapped[list[str]] = mapped_column(ARRAY(Text))
    slots: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    minute: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    claimed: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    previous_claimed: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class QueueMinute(Base):
    """Completed and failed attempts of a queue in one clock minute, added to in batches and
    kept `QUEUE_THROUGHPUT_RETENTION` (docs/architecture.md#operator-views)."""

    __tablename__ = "queue_minute"
    __table_args__ = (Index("ix_queue_minute_minute", "minute"),)

    queue: Mapped[str] = mapped_column(String(64), primary_key=True)
    minute: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    completed: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    failed: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
