"""schedule table: the last cron bucket each recurring schedule fired

Revision ID: 635b611113d9
Revises: 02eba96d7a82
Create Date: 2026-11-30 16:01:48.486321

Expand/contract: this revision must keep the previous release of every service working;
destructive clean-up ships one release later. (Additive: the previous release ignores the
table. The first start of the new release fires each schedule's latest bucket unless that
bucket's job, keyed `<name>:<bucket start>`, still exists, exactly as a first start does.)
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "635b611113d9"
down_revision: str | None = "02eba96d7a82"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "schedule",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("cron", sa.Text(), nullable=False),
        sa.Column("last_bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_job_id", sa.UUID(), nullable=True),
        sa.Column(
            "fired_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_schedule")),
    )


def downgrade() -> None:
    op.drop_table("schedule")
