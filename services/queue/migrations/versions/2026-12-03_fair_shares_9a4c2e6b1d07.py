"""Fair shares between tenants: queue_control.weights and the claim's per-tenant index

Revision ID: 9a4c2e6b1d07
Revises: 3f9d0b7e21c4
Create Date: 2026-12-03 09:00:00

Expand/contract: additive. `weights` has a default, so existing rows read as "every tenant
weighs 1". The claim walks each tenant's PENDING jobs through `ix_job_claim_tenant`, built
without blocking writes; the previous release never reads either and claims as before (in
priority order over the whole queue), so replicas of both releases may run side by side, only
the new ones sharing fairly.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "9a4c2e6b1d07"
down_revision: str | None = "3f9d0b7e21c4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING = sa.text("status = 'PENDING'")


def upgrade() -> None:
    op.add_column(
        "queue_control",
        sa.Column(
            "weights",
            postgresql.JSONB(),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_job_claim_tenant",
            "job",
            ["queue", "tenant", sa.text("priority DESC"), "ready_at", "id"],
            postgresql_where=_PENDING,
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    op.drop_index("ix_job_claim_tenant", table_name="job", postgresql_where=_PENDING)
    op.drop_column("queue_control", "weights")
