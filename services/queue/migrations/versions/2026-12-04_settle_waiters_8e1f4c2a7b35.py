"""Waiting for a job's outcome: the `awaited` flag and the settle notification

Revision ID: 8e1f4c2a7b35
Revises: e1c5a7d3b902
Create Date: 2026-12-04 18:10:00

Expand/contract: additive. `awaited` (false by default: a metadata-only change, no rewrite) is
set by `GET /jobs/{id}?waitSeconds=N` on a live job; a row trigger whose WHEN clause reads only
the new row sends `pg_notify('jobq_settled', '<job id>')` when such a job reaches a final state,
in the settling transaction. A job nobody waits for costs the WHEN test and nothing else
(docs/adr/008-waiting-for-outcomes.md). The previous release never sets the flag, so the
trigger stays silent for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8e1f4c2a7b35"
down_revision: str | None = "e1c5a7d3b902"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "job", sa.Column("awaited", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.execute(
        """
CREATE OR REPLACE FUNCTION jobq_notify_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobq_settled', NEW.id::text);
    RETURN NULL;
END $$"""
    )
    op.execute(
        """
CREATE TRIGGER job_settled_awaited AFTER UPDATE OF status ON job
FOR EACH ROW
WHEN (NEW.awaited AND NEW.status IN ('COMPLETED', 'DEAD_LETTER', 'CANCELLED'))
EXECUTE FUNCTION jobq_notify_settled()"""
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS job_settled_awaited ON job")
    op.execute("DROP FUNCTION IF EXISTS jobq_notify_settled()")
    op.drop_column("job", "awaited")
