"""queue_control table: a queue's run-time state (paused or not), and its last change

Revision ID: 7273123aa562
Revises: e7a175e0028d
Create Date: 2026-12-02 13:20:00

Expand/contract: additive. The previous release ignores the table, so a queue paused while
replicas of the previous release still run is paused only on the replicas of this one; roll
every queue-service replica before relying on a pause. No row means "running": a queue gets a
row the first time it is paused.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7273123aa562"
down_revision: str | None = "e7a175e0028d"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "queue_control",
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "changed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("changed_by", sa.Text(), nullable=False),
        sa.Column("change", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("queue", name=op.f("pk_queue_control")),
    )


def downgrade() -> None:
    op.drop_table("queue_control")
