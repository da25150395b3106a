"""The limited claim's index: each (queue, task type)'s PENDING jobs in claim order

Revision ID: 5b7d2f4a9c16
Revises: c3e8f1a2b5d9
Create Date: 2026-12-03 12:45:00

Expand/contract: additive, built without blocking writes. The claim of a limited task type
walked `ix_job_claim` filtered on the task type, so a limited type with few or no ready jobs
read the queue's whole backlog of other types at every claim (`make bench-compare
--limit-other`: the other types' burn-down at 0.54x); with this index the walk, and the look
for jobs it left waiting, are one descent each. The previous release does not need it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5b7d2f4a9c16"
down_revision: str | None = "c3e8f1a2b5d9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING = sa.text("status = 'PENDING'")


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_job_claim_type",
            "job",
            ["queue", "task_type", sa.text("priority DESC"), "ready_at", "id"],
            postgresql_where=_PENDING,
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    op.drop_index("ix_job_claim_type", table_name="job", postgresql_where=_PENDING)
