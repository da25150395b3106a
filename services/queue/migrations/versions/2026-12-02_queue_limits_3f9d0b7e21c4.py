"""queue_control.limits: concurrency limits by task type, enforced by the claim

Revision ID: 3f9d0b7e21c4
Revises: 7273123aa562
Create Date: 2026-12-02 17:40:00

Expand/contract: additive, with a default, so existing rows read as "no limits". The previous
release ignores the column: a limit set while its replicas still run is not enforced by them;
roll every queue-service replica before relying on a limit.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "3f9d0b7e21c4"
down_revision: str | None = "7273123aa562"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "queue_control",
        sa.Column(
            "limits",
            postgresql.JSONB(),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("queue_control", "limits")
