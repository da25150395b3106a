"""rate_bucket: the token buckets of dispatch rate limits, one per limited (queue, task type)
and, with a per-tenant rate, one per tenant of it

Revision ID: c3e8f1a2b5d9
Revises: 9a4c2e6b1d07
Create Date: 2026-12-03 09:30:00

Expand/contract: additive. The previous release never reads the table and does not know the
`rate` bounds of a limit, so a rate set while its replicas still run is enforced only by the
replicas of this one; roll every queue-service replica before relying on a rate limit.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c3e8f1a2b5d9"
down_revision: str | None = "9a4c2e6b1d07"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rate_bucket",
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("task_type", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("queue", "task_type", "tenant", name="pk_rate_bucket"),
    )


def downgrade() -> None:
    op.drop_table("rate_bucket")
