"""Idempotency keys in their own table, each held for its window

Revision ID: c5e2b7d91f04
Revises: a7f3c91e5d42
Create Date: 2026-12-05 01:00:00

Expand/contract, expand step: additive. `idempotency_key (tenant, key)` holds each key until
its `expires_at` (the submit's idempotencyWindowSeconds, else QUEUE_IDEMPOTENCY_WINDOW, 7 d).
The keys of existing jobs are copied with a window of 7 days from now (one statement: keyed
jobs are a minority). The unique index `uq_job_tenant_idempotency_key` stays for the previous
release, whose submits rely on it during the rollout; a later release may drop it (contract).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c5e2b7d91f04"
down_revision: str | None = "a7f3c91e5d42"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_key",
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "key", name=op.f("pk_idempotency_key")),
        postgresql_with={
            "autovacuum_vacuum_scale_factor": "0.02",
            "autovacuum_analyze_scale_factor": "0.02",
            "autovacuum_vacuum_cost_delay": "0",
        },
    )
    op.create_index(
        "ix_idempotency_key_expires_at", "idempotency_key", ["expires_at"], unique=False
    )
    op.execute(
        "INSERT INTO idempotency_key (tenant, key, job_id, request_hash, expires_at)"
        " SELECT tenant, idempotency_key, id, request_hash,"
        " statement_timestamp() + interval '7 days'"
        " FROM job_all WHERE idempotency_key IS NOT NULL ON CONFLICT DO NOTHING"
    )


def downgrade() -> None:
    op.drop_table("idempotency_key")
