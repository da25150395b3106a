"""A key the previous release writes into `job` is held in `idempotency_key` too

Revision ID: f2a9c4e7b315
Revises: b8d2e6f1a3c7
Create Date: 2026-12-06 20:30:00

Expand/contract, expand step: additive. c5e2b7d91f04 copied the keys of existing jobs into
`idempotency_key` once. The release before it writes a key into `job` only (its unique index
`uq_job_tenant_idempotency_key` makes it unique) and keeps submitting during the rollout;
once such a job left `job` (settled into the history by the new release, or swept there), the
new release found no key and a later submit with that key created a second job. The row
trigger `job_idempotency_key_held` (BEFORE INSERT ON job, `WHEN (NEW.idempotency_key IS NOT
NULL AND NEW.created_at = NEW.updated_at)`) now writes every such key as the new release's
enqueue statement would: `(tenant, key, job id, request hash, statement_timestamp() + 7
days)`, the default window QUEUE_IDEMPOTENCY_WINDOW (604,800 s; a deployment with another
setting gets 7 days for the previous release's keys, as c5e2b7d91f04 gave them), `ON
CONFLICT DO NOTHING`.

- Keyless inserts (most) never call the function: the WHEN clause reads only the new row.
- The new release's own keyed submits are unchanged: its statement inserts (or takes over)
  the key's row before it inserts the job, so the trigger finds the row and does nothing; a
  key held by another job inserts no job, so the trigger never runs. What the call and its
  primary-key probe cost a keyed job (every client-library submit carries a key): 500 keyed
  jobs per enqueue statement took 32.1 ms without the trigger and 36.5 ms with it, about 9 us
  a job (medians of 40 interleaved rounds, a scratch script against a migrated database,
  2026-12-06, with a soak benchmark running on the same machine: noisy).
- A job brought back from the history (retry, redrive, an SQS move) keeps its `created_at`
  and gets a new `updated_at`, so the WHEN clause leaves it out: the new release holds no key
  again for it, and neither does the trigger.
- BEFORE, not AFTER: both releases then lock the key's row before the job's unique-index
  entry, in the same order, so the same key submitted by both at once waits instead of
  deadlocking. A row the previous release's `ON CONFLICT DO NOTHING` then skips (its key held
  by a live job whose window was over) leaves a key row whose job does not exist, which the
  new release already treats as a key whose job is gone (`_RELEASE_KEY` in common/enqueue.py).

Keys inserted between c5e2b7d91f04's copy and this revision are copied here, from `job`, with
the expiry the trigger would have given them (`created_at + 7 days`, those still in the
future): CREATE TRIGGER holds `job` against writes until this transaction commits, so every
insert is either seen by the copy or fires the trigger (writes to `job` wait for the copy,
which reads only its keyed rows). Keys of jobs that already moved to the history in between
are not copied: there, a key removed because its window was over looks the same. In `job` it
does too: on a database the new release already ran on, a live keyed job whose shorter window
is over and whose key was removed gets its key held again until `created_at` + 7 days (its
key blocked anyway while it is live in `job`, by `uq_job_tenant_idempotency_key`).

The trigger stays at head, and this release ships no contract revision: `alembic upgrade
head` runs before the new release's pods start while the previous release still serves
(docs/architecture.md#idempotency), so a contract in the same release would drop the trigger
before the rollout it is for. A later release drops it, with `uq_job_tenant_idempotency_key`,
once no release before c5e2b7d91f04 can run against the database. Downgrade drops the
trigger and its function; the keys it wrote stay (rows the new release reads alike).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "f2a9c4e7b315"
down_revision: str | None = "b8d2e6f1a3c7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WINDOW = 7 * 86400
"""The default idempotency window in seconds (DEFAULT_IDEMPOTENCY_WINDOW, frozen here)."""


def upgrade() -> None:
    op.execute(
        f"""
CREATE OR REPLACE FUNCTION jobq_hold_idempotency_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO idempotency_key (tenant, key, job_id, request_hash, expires_at)
    VALUES (NEW.tenant, NEW.idempotency_key, NEW.id, NEW.request_hash,
            statement_timestamp() + make_interval(secs => {_WINDOW}))
    ON CONFLICT DO NOTHING;
    RETURN NEW;
END $$"""
    )
    op.execute(
        """
CREATE TRIGGER job_idempotency_key_held BEFORE INSERT ON job
FOR EACH ROW
WHEN (NEW.idempotency_key IS NOT NULL AND NEW.created_at = NEW.updated_at)
EXECUTE FUNCTION jobq_hold_idempotency_key()"""
    )
    op.execute(
        "INSERT INTO idempotency_key (tenant, key, job_id, request_hash, expires_at)"
        f" SELECT tenant, idempotency_key, id, request_hash,"
        f" created_at + make_interval(secs => {_WINDOW})"
        " FROM job WHERE idempotency_key IS NOT NULL"
        f" AND created_at + make_interval(secs => {_WINDOW}) > statement_timestamp()"
        " ORDER BY 1, 2 ON CONFLICT DO NOTHING"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS job_idempotency_key_held ON job")
    op.execute("DROP FUNCTION IF EXISTS jobq_hold_idempotency_key()")
