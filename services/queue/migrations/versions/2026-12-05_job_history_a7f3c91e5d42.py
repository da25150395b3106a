"""Finished jobs move to `job_history`, partitioned by status list then by `finished_at` range

Revision ID: a7f3c91e5d42
Revises: 6c2b8f4d9e13
Create Date: 2026-12-05 00:30:00

Expand/contract, expand step: additive. Creates `job_history` (LIST (status): `job_history_done`
for COMPLETED and CANCELLED, `job_history_dead` for DEAD_LETTER, each RANGE (finished_at) with a
DEFAULT partition and the slots of today and the next two days at the default width of one
day), the view `job_all` (live and historic jobs as one relation, for people and tools; the
service's own reads name both tables), and the trigger `job_history_settled_awaited`, the
history's counterpart of `job_settled_awaited`: a settle now inserts the finished job into the
history, so the waiters' notification fires on that insert.

No row is moved here: a migration runs in one transaction, and moving millions of finished rows
in it would hold locks and a snapshot for the whole copy. The new release's background loop
moves finished rows left in `job` in batches of 500, each its own short transaction, while the
services run (`services/queue/history.py`, the sweep); the previous release keeps working on
`job` during the rollout (its settles leave finished rows in `job`, which the sweep moves; it
does not see jobs already moved). The index `ix_job_retention` stays for the sweep: it holds
finished rows only, so it is empty once they are moved and costs the hot path nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "a7f3c91e5d42"
down_revision: str | None = "6c2b8f4d9e13"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    "id, tenant, queue, task_type, payload, status, priority, attempts, releases, max_attempts, "
    "timeout_seconds, visible_at, ready_at, claimed_at, lease_id, locked_by, cancel_requested, "
    "awaited, last_error, errors, result, progress, trace_context, idempotency_key, "
    "request_hash, created_at, updated_at, finished_at"
)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y%m%dt%H%M%S")


def upgrade() -> None:
    op.create_table(
        "job_history",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("task_type", sa.String(length=64), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("releases", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), nullable=True),
        sa.Column("visible_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_id", sa.UUID(), nullable=True),
        sa.Column("locked_by", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("awaited", sa.Boolean(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("errors", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("progress", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("trace_context", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER')",
            name=op.f("ck_job_history_status_finished"),
        ),
        sa.PrimaryKeyConstraint("id", "status", "finished_at", name=op.f("pk_job_history")),
        postgresql_partition_by="LIST (status)",
    )
    op.create_index(
        "ix_job_history_queue_id", "job_history", ["queue", sa.text("id DESC")], unique=False
    )
    op.create_index(
        "ix_job_history_tenant_id", "job_history", ["tenant", sa.text("id DESC")], unique=False
    )
    op.create_index(
        "ix_job_history_tenant_idempotency_key",
        "job_history",
        ["tenant", "idempotency_key"],
        unique=False,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.execute(
        "CREATE TABLE job_history_done PARTITION OF job_history"
        " FOR VALUES IN ('COMPLETED', 'CANCELLED') PARTITION BY RANGE (finished_at)"
    )
    op.execute(
        "CREATE TABLE job_history_dead PARTITION OF job_history"
        " FOR VALUES IN ('DEAD_LETTER') PARTITION BY RANGE (finished_at)"
    )
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    for tree in ("done", "dead"):
        op.execute(
            f"CREATE TABLE job_history_{tree}_default PARTITION OF job_history_{tree} DEFAULT"
        )
        for day in range(3):
            start = today + timedelta(days=day)
            end = start + timedelta(days=1)
            op.execute(
                f"CREATE TABLE job_history_{tree}_{_stamp(start)}_{_stamp(end)}"
                f" PARTITION OF job_history_{tree}"
                f" FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
            )
    op.execute(
        """
CREATE TRIGGER job_history_settled_awaited AFTER INSERT ON job_history
FOR EACH ROW WHEN (NEW.awaited)
EXECUTE FUNCTION jobq_notify_settled()"""
    )
    op.execute(
        f"CREATE VIEW job_all AS SELECT {_COLUMNS} FROM job"
        f" UNION ALL SELECT {_COLUMNS} FROM job_history"
    )


def downgrade() -> None:
    # Finished jobs go back to `job`, where the previous release keeps them.
    op.execute("DROP VIEW job_all")
    op.execute(
        f"INSERT INTO job ({_COLUMNS}) SELECT {_COLUMNS} FROM job_history ON CONFLICT DO NOTHING"
    )
    op.drop_table("job_history")
