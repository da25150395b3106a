"""sqs_queue table: the queues the SQS endpoint declared, their owner and SQS attributes

Revision ID: d4e1a7c3f2b8
Revises: 5b7d2f4a9c16
Create Date: 2026-12-04 18:10:00

Expand/contract: additive. The previous release ignores the table; only the SQS endpoint
(services.sqs) reads or writes it, through the queue service's `/sqs/...` routes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d4e1a7c3f2b8"
down_revision: str | None = "5b7d2f4a9c16"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sqs_queue",
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=80), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column(
            "attributes",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
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
        sa.PrimaryKeyConstraint("tenant", "name", name=op.f("pk_sqs_queue")),
        sa.UniqueConstraint("queue", name=op.f("uq_sqs_queue_queue")),
    )


def downgrade() -> None:
    op.drop_table("sqs_queue")
