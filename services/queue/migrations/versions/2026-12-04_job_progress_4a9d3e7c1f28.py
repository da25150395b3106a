"""A running job's progress: the `progress` column

Revision ID: 4a9d3e7c1f28
Revises: 8e1f4c2a7b35
Create Date: 2026-12-04 18:40:00

Expand/contract: additive, a nullable column (no rewrite). Workers report progress with their
heartbeats; the previous release sends none and never reads the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "4a9d3e7c1f28"
down_revision: str | None = "8e1f4c2a7b35"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job", sa.Column("progress", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("job", "progress")
