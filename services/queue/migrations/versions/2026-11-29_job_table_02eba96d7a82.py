"""job table: every column and index of docs/architecture.md#storage

Revision ID: 02eba96d7a82
Revises: (none)
Create Date: 2026-11-29 23:03:17.034850

Expand/contract: this revision must keep the previous release of every service working;
destructive clean-up ships one release later.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "02eba96d7a82"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("task_type", sa.String(length=64), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("releases", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), nullable=True),
        sa.Column("visible_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_id", sa.UUID(), nullable=True),
        sa.Column("locked_by", sa.Text(), nullable=True),
        sa.Column(
            "cancel_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "errors",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('SCHEDULED', 'PENDING', 'PROCESSING', 'COMPLETED', 'DEAD_LETTER', 'CANCELLED')",
            name=op.f("ck_job_status_known"),
        ),
        sa.CheckConstraint(
            "attempts >= 0 AND releases >= 0", name=op.f("ck_job_counters_non_negative")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_job_idempotency_key")),
        postgresql_with={
            "fillfactor": "80",
            "autovacuum_vacuum_scale_factor": "0.02",
            "autovacuum_analyze_scale_factor": "0.02",
            "autovacuum_vacuum_cost_delay": "0",
        },
    )
    op.create_index(
        "ix_job_claim",
        "job",
        ["queue", sa.literal_column("priority DESC"), "id"],
        unique=False,
        postgresql_where=sa.text("status = 'PENDING'"),
    )
    op.create_index("ix_job_queue_id", "job", ["queue", sa.literal_column("id DESC")], unique=False)
    op.create_index(
        "ix_job_reaper",
        "job",
        ["visible_at"],
        unique=False,
        postgresql_where=sa.text("status = 'PROCESSING'"),
    )
    op.create_index(
        "ix_job_retention",
        "job",
        ["finished_at"],
        unique=False,
        postgresql_where=sa.text("status IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER')"),
    )
    op.create_index(
        "ix_job_scheduler",
        "job",
        ["visible_at"],
        unique=False,
        postgresql_where=sa.text("status = 'SCHEDULED'"),
    )
    op.create_index(
        "ix_job_status_id", "job", ["status", sa.literal_column("id DESC")], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_job_status_id", table_name="job")
    op.drop_index(
        "ix_job_scheduler", table_name="job", postgresql_where=sa.text("status = 'SCHEDULED'")
    )
    op.drop_index(
        "ix_job_retention",
        table_name="job",
        postgresql_where=sa.text("status IN ('COMPLETED', 'CANCELLED', 'DEAD_LETTER')"),
    )
    op.drop_index(
        "ix_job_reaper", table_name="job", postgresql_where=sa.text("status = 'PROCESSING'")
    )
    op.drop_index("ix_job_queue_id", table_name="job")
    op.drop_index("ix_job_claim", table_name="job", postgresql_where=sa.text("status = 'PENDING'"))
    op.drop_table("job")
