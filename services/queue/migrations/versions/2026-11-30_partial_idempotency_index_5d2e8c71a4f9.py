"""job: the idempotency key's unique index holds only jobs that have a key

Revision ID: 5d2e8c71a4f9
Revises: b7c41e9a3d20
Create Date: 2026-11-30 17:30:00

Most jobs carry no idempotency key, yet every insert and every state change (a non-HOT update)
added their NULL key to the unique index. A partial unique index enforces the same rule
(keys are unique) without that work. The new index is built without blocking writes before the
constraint it replaces is dropped, so keys stay unique throughout; the previous release works
unchanged on this schema (its inserts use ON CONFLICT DO NOTHING without a target).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5d2e8c71a4f9"
down_revision: str | None = "b7c41e9a3d20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HAS_KEY = sa.text("idempotency_key IS NOT NULL")


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "uq_job_idempotency_key_partial",
            "job",
            ["idempotency_key"],
            unique=True,
            postgresql_where=_HAS_KEY,
            postgresql_concurrently=True,
        )
    op.drop_constraint("uq_job_idempotency_key", "job", type_="unique")
    op.execute("ALTER INDEX uq_job_idempotency_key_partial RENAME TO uq_job_idempotency_key")


def downgrade() -> None:
    op.execute("ALTER INDEX uq_job_idempotency_key RENAME TO uq_job_idempotency_key_partial")
    op.create_unique_constraint("uq_job_idempotency_key", "job", ["idempotency_key"])
    op.drop_index("uq_job_idempotency_key_partial", table_name="job", postgresql_where=_HAS_KEY)
