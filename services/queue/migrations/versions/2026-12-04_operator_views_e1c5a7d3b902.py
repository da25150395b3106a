"""worker and queue_minute: what the operator views read (docs/architecture.md#operator-views)

Revision ID: e1c5a7d3b902
Revises: d4e1a7c3f2b8
Create Date: 2026-12-04 18:00:00

`worker`: one row per worker name, upserted in batches (every QUEUE_ACTIVITY_INTERVAL, one
statement for every worker a replica saw claim meanwhile), with a sliding-window claim count
(the current and the previous clock minute). `queue_minute`: completed and failed counts per
queue and clock minute, added to in the same batches, kept QUEUE_THROUGHPUT_RETENTION.

Expand/contract: additive. The previous release never reads or writes these tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e1c5a7d3b902"
down_revision: str | None = "d4e1a7c3f2b8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "worker",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=True),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("previous_claimed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_worker")),
    )
    op.create_table(
        "queue_minute",
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("failed", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("queue", "minute", name=op.f("pk_queue_minute")),
    )
    op.create_index("ix_queue_minute_minute", "queue_minute", ["minute"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_queue_minute_minute", table_name="queue_minute")
    op.drop_table("queue_minute")
    op.drop_table("worker")
