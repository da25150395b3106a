"""The submit's trace context: the `trace_context` column

Revision ID: 6c2b8f4d9e13
Revises: 4a9d3e7c1f28
Create Date: 2026-12-04 19:00:00

Expand/contract: additive, a nullable column (no rewrite). With tracing on, the producer (or the
client library's `enqueue`) stores the submitting span's W3C context, `{"traceparent",
"tracestate"}`, and each attempt's span links to it; NULL otherwise. The previous release
neither writes nor reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "6c2b8f4d9e13"
down_revision: str | None = "4a9d3e7c1f28"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job", sa.Column("trace_context", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("job", "trace_context")
