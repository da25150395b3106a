"""job.tenant: every job belongs to a tenant; idempotency keys are unique per tenant

Revision ID: e7a175e0028d
Revises: 5d2e8c71a4f9
Create Date: 2026-12-01 09:00:00

Expand/contract, so the previous release keeps working while replicas roll:

- `tenant` is added with the constant default `'default'` (no table rewrite: PostgreSQL stores
  the default once for existing rows), so existing jobs belong to `default`, and the previous
  release's inserts, which do not name a tenant, land there too.
- The per-tenant unique index `(tenant, idempotency_key)` (partial, like the index it
  replaces: only rows with a key) and the listing index `(tenant, id DESC)` are built without
  blocking writes (CREATE INDEX CONCURRENTLY) before the global unique index on
  `idempotency_key` is dropped, so keys stay unique throughout. The previous release puts
  every job in `default`, where per-tenant uniqueness is the global uniqueness it expects; its
  `ON CONFLICT DO NOTHING` has no conflict target and works with either index.

Beyond the schema: the previous release's submits, claims and settles keep working against
this release's queue service (their shapes are unchanged; its submits land in `default`), but
its producers, workers and `jobq.Client` refuse the job view this release returns, which has a
new `tenant` field (wire structs reject unknown fields): upgrade the queue service and the
producers together, or expect reads, cancels and retries through an old producer to fail until
it is replaced.

Downgrade restores the global unique index; it fails, changing nothing, while two tenants hold
the same idempotency key (delete or rename one of them first).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e7a175e0028d"
down_revision: str | None = "5d2e8c71a4f9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WITH_KEY = sa.text("idempotency_key IS NOT NULL")


def upgrade() -> None:
    op.add_column(
        "job",
        sa.Column(
            "tenant", sa.String(length=64), server_default=sa.text("'default'"), nullable=False
        ),
    )
    with op.get_context().autocommit_block():
        op.create_index(
            "uq_job_tenant_idempotency_key",
            "job",
            ["tenant", "idempotency_key"],
            unique=True,
            postgresql_where=_WITH_KEY,
            postgresql_concurrently=True,
        )
        op.create_index(
            "ix_job_tenant_id",
            "job",
            ["tenant", sa.literal_column("id DESC")],
            postgresql_concurrently=True,
        )
        op.drop_index(
            "uq_job_idempotency_key",
            table_name="job",
            postgresql_where=_WITH_KEY,
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    # Not concurrently: when two tenants share a key this fails inside the migration's
    # transaction and leaves nothing behind (a failed concurrent build leaves an invalid index).
    op.create_index(
        "uq_job_idempotency_key",
        "job",
        ["idempotency_key"],
        unique=True,
        postgresql_where=_WITH_KEY,
    )
    with op.get_context().autocommit_block():
        op.drop_index("ix_job_tenant_id", table_name="job", postgresql_concurrently=True)
        op.drop_index(
            "uq_job_tenant_idempotency_key",
            table_name="job",
            postgresql_where=_WITH_KEY,
            postgresql_concurrently=True,
        )
    op.drop_column("job", "tenant")
