"""job.ready_at: claim order by the time a job last became ready

Revision ID: b7c41e9a3d20
Revises: 635b611113d9
Create Date: 2026-11-30 16:40:00

Expand/contract: the previous release keeps working on this schema. Its inserts get `ready_at`
from the column default (the insert's transaction time), so its jobs queue normally; only its
retries and releases keep an older `ready_at` until this release replaces it.

The claim index is rebuilt under a temporary name without blocking writes (CREATE INDEX
CONCURRENTLY), then swapped in, so claims never run without an index.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b7c41e9a3d20"
down_revision: str | None = "635b611113d9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING = sa.text("status = 'PENDING'")


def upgrade() -> None:
    # now() is stable, so PostgreSQL stores one default for existing rows without a rewrite.
    op.add_column(
        "job",
        sa.Column(
            "ready_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
    )
    # For waiting jobs, visible_at already says when they became (or become) ready.
    op.execute("UPDATE job SET ready_at = visible_at WHERE status IN ('PENDING', 'SCHEDULED')")
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_job_claim_next",
            "job",
            ["queue", sa.literal_column("priority DESC"), "ready_at", "id"],
            postgresql_where=_PENDING,
            postgresql_concurrently=True,
        )
        op.drop_index(
            "ix_job_claim",
            table_name="job",
            postgresql_where=_PENDING,
            postgresql_concurrently=True,
        )
    op.execute("ALTER INDEX ix_job_claim_next RENAME TO ix_job_claim")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_job_claim_previous",
            "job",
            ["queue", sa.literal_column("priority DESC"), "id"],
            postgresql_where=_PENDING,
            postgresql_concurrently=True,
        )
        op.drop_index(
            "ix_job_claim",
            table_name="job",
            postgresql_where=_PENDING,
            postgresql_concurrently=True,
        )
    op.execute("ALTER INDEX ix_job_claim_previous RENAME TO ix_job_claim")
    op.drop_column("job", "ready_at")
