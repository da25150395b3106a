"""The listing indexes leave leased jobs out, so a claim adds no entry to them

Revision ID: b8d2e6f1a3c7
Revises: c5e2b7d91f04
Create Date: 2026-12-06 18:00:00

`GET /jobs` walks `(status, id DESC)`, `(queue, id DESC)` and `(tenant, id DESC)` of `job`. A
claim's UPDATE (PENDING → PROCESSING) cannot be HOT (the status is in the claim indexes'
predicates), so it inserted a new entry into each of the three for every job claimed: three of
the five index insertions a claim made, for rows that stay PROCESSING for the length of one
run. They are replaced by the same indexes without PROCESSING rows (`WHERE status <>
'PROCESSING'`); listings read PROCESSING rows, at most one per worker slot, through
`ix_job_reaper` (`repository.listing_statement`). A 2 x 32 burn-down writes a fifth less WAL
per job (benchmark/README.md, "Where the time goes: a claim's index entries").

Expand/contract: the new indexes are built without blocking writes (CREATE INDEX CONCURRENTLY)
before the old ones are dropped (DROP INDEX CONCURRENTLY). The previous release's listings
read the view `job_all`, which is unchanged; during the rollout they find no full listing
index and read `job` whole (slower, still right). Downgrade builds the full indexes again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b8d2e6f1a3c7"
down_revision: str | None = "c5e2b7d91f04"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNLEASED = sa.text("status <> 'PROCESSING'")
_COLUMNS = ("status", "queue", "tenant")


def _swap(build: str, where: sa.TextClause | None, drop: str) -> None:
    """Build `<build><column>_id` for each listing column (partial when `where`), then drop
    `<drop><column>_id`, neither blocking writes."""
    with op.get_context().autocommit_block():
        for column in _COLUMNS:
            op.create_index(
                f"{build}{column}_id",
                "job",
                [column, sa.literal_column("id DESC")],
                postgresql_where=where,
                postgresql_concurrently=True,
            )
        for column in _COLUMNS:
            op.drop_index(f"{drop}{column}_id", table_name="job", postgresql_concurrently=True)


def upgrade() -> None:
    _swap("ix_job_unleased_", _UNLEASED, "ix_job_")


def downgrade() -> None:
    _swap("ix_job_", None, "ix_job_unleased_")
