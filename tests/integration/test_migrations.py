"""Migrations equal the models, and run down and up again cleanly."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from infra.servers import ensure_database, ensure_postgres
from infra.stack import ROOT
from services.queue.app import head_revision
from tests.conftest import _admin, migrate, pg_ctlcluster, schema_revision


async def test_upgrade_check_downgrade_upgrade(
    postgres_base: str, fresh_database_name: str
) -> None:
    name = fresh_database_name
    url = f"{postgres_base}/{name}"
    await _admin(
        postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'
    )
    try:
        migrate(url, "upgrade", "head")
        check = migrate(url, "check")
        assert "No new upgrade operations detected" in check.stdout + check.stderr

        migrate(url, "downgrade", "base")
        connection = await asyncpg.connect(url)
        try:
            assert await connection.fetchval("SELECT to_regclass('job')") is None
            assert await connection.fetchval("SELECT to_regclass('schedule')") is None
        finally:
            await connection.close()

        migrate(url, "upgrade", "head")
        connection = await asyncpg.connect(url)
        try:
            assert (
                await connection.fetchval("SELECT version_num FROM alembic_version")
                == head_revision()
            )
            assert await connection.fetchval("SELECT to_regclass('schedule')") == "schedule"
            indexes = {
                row["indexname"]
                for row in await connection.fetch(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'job'"
                )
            }
        finally:
            await connection.close()
        assert {
            "ix_job_claim",
            "ix_job_scheduler",
            "ix_job_reaper",
            "ix_job_retention",
            "ix_job_unleased_status_id",
            "ix_job_unleased_queue_id",
            "ix_job_unleased_tenant_id",
            "uq_job_tenant_idempotency_key",
            "pk_job",
        } <= indexes
        assert "uq_job_idempotency_key" not in indexes, "keys are unique per tenant now"
        full = {"ix_job_status_id", "ix_job_queue_id", "ix_job_tenant_id"}
        assert not full & indexes, "the listing indexes leave leased jobs out now"
    finally:
        await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_OLD_INSERT = """
INSERT INTO job (id, queue, task_type, payload, status, max_attempts, visible_at,
                 idempotency_key)
VALUES (gen_random_uuid(), 'default', 'noop', '{}', 'PENDING', 5, now(), $1)
ON CONFLICT DO NOTHING RETURNING id
"""
"""How the release before tenants inserts: no tenant column, no conflict target."""


async def test_tenants_migration_keeps_old_rows_and_the_previous_release_working(
    postgres_base: str, fresh_database_name: str
) -> None:
    name = fresh_database_name
    url = f"{postgres_base}/{name}"
    await _admin(
        postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'
    )
    try:
        migrate(url, "upgrade", "5d2e8c71a4f9")
        connection = await asyncpg.connect(url)
        try:
            old = await connection.fetchval(_OLD_INSERT, "k")
        finally:
            await connection.close()

        migrate(url, "upgrade", "e7a175e0028d")
        connection = await asyncpg.connect(url)
        try:
            assert await connection.fetchval("SELECT tenant FROM job WHERE id = $1", old) == (
                "default"
            )
            # The previous release still inserts (into `default`) and still sees its keys
            # as unique.
            assert await connection.fetchval(_OLD_INSERT, "k2") is not None
            assert await connection.fetchval(_OLD_INSERT, "k") is None
            await connection.execute(
                "INSERT INTO job (id, tenant, queue, task_type, payload, status, max_attempts,"
                " visible_at, idempotency_key) VALUES (gen_random_uuid(), 'acme', 'default',"
                " 'noop', '{}', 'PENDING', 5, now(), 'k')"
            )
        finally:
            await connection.close()

        # Two tenants share the key "k": going back to global keys must refuse, untouched.
        with pytest.raises(subprocess.CalledProcessError) as refused:
            migrate(url, "downgrade", "5d2e8c71a4f9")
        assert "uq_job_idempotency_key" in refused.value.stderr
        connection = await asyncpg.connect(url)
        try:
            assert await connection.fetchval("SELECT version_num FROM alembic_version") == (
                "e7a175e0028d"
            )
            assert await connection.fetchval("SELECT count(DISTINCT tenant) FROM job") == 2
        finally:
            await connection.close()
    finally:
        await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_waits_for_a_database_that_does_not_accept_connections_yet(
    private_cluster: Path,
) -> None:
    """compose starts `migrate` once PostgreSQL's healthcheck passes; on a first start the
    image's temporary server may still refuse TCP (issue 25 item 1). The migration waits for
    the database within QUEUE_MIGRATE_WAIT instead of failing on the first refusal, and fails
    with the connection error once that runs out."""
    url = ensure_database(ensure_postgres(private_cluster), "jobq")
    pg_ctlcluster(private_cluster, "stop")
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}

    gave_up = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=ROOT, env={**env, "QUEUE_MIGRATE_WAIT": "1s"}, capture_output=True, text=True,
    )  # fmt: skip
    assert gave_up.returncode != 0
    assert "waiting for the database" in gave_up.stderr
    assert "Connect call failed" in gave_up.stderr or "refused" in gave_up.stderr

    process = subprocess.Popen(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=ROOT, env={**env, "QUEUE_MIGRATE_WAIT": "120s"}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        seen = []
        for line in process.stderr:
            seen.append(line)
            if "waiting for the database" in line:
                break
        assert process.poll() is None, "".join(seen)  # still waiting, not failed
        pg_ctlcluster(private_cluster, "start")
        _, rest = process.communicate(timeout=180)
        assert process.returncode == 0, "".join(seen) + rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert asyncio.run(schema_revision(url)) == head_revision()


_TRIGGER = "SELECT count(*) FROM pg_trigger WHERE tgname = 'job_idempotency_key_held'"
_FUNCTION = "SELECT to_regproc('jobq_hold_idempotency_key') IS NOT NULL"


async def test_the_key_trigger_copies_keys_left_out_and_goes_down_and_up_again(
    postgres_base: str, fresh_database_name: str
) -> None:
    """f2a9c4e7b315 copies the keys the previous release wrote into `job` after c5e2b7d91f04's
    copy (held until `created_at` + 7 days), adds the trigger that copies those it writes from
    now on, and its downgrade drops the trigger and function, keeping the keys."""
    name = fresh_database_name
    url = f"{postgres_base}/{name}"
    await _admin(
        postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'
    )
    try:
        migrate(url, "upgrade", "b8d2e6f1a3c7")
        connection = await asyncpg.connect(url)
        try:
            # The previous release's insert after the copy: its key is in `job` only.
            await connection.execute(
                "INSERT INTO job (id, queue, task_type, payload, status, max_attempts,"
                " visible_at, idempotency_key, created_at, updated_at)"
                " VALUES (gen_random_uuid(), 'default', 'noop', '{}', 'PENDING', 5, now(),"
                " 'missed', now() - interval '1 day', now() - interval '1 day'),"
                " (gen_random_uuid(), 'default', 'noop', '{}', 'PENDING', 5, now(),"
                " 'too-old', now() - interval '8 days', now() - interval '8 days')"
            )
            assert await connection.fetchval("SELECT count(*) FROM idempotency_key") == 0

            migrate(url, "upgrade", "head")
            held = await connection.fetchrow(
                "SELECT held.job_id = job.id AS same_job,"
                " held.expires_at = job.created_at + interval '7 days' AS its_window"
                " FROM idempotency_key AS held JOIN job ON job.idempotency_key = held.key"
                " WHERE held.key = 'missed'"
            )
            assert held is not None and held["same_job"] and held["its_window"]
            assert (
                await connection.fetchval(
                    "SELECT count(*) FROM idempotency_key WHERE key = 'too-old'"
                )
                == 0
            ), "a key whose window would be over is not held again"
            assert await connection.fetchval(_TRIGGER) == 1
            assert await connection.fetchval(_FUNCTION)

            migrate(url, "downgrade", "b8d2e6f1a3c7")
            assert await connection.fetchval(_TRIGGER) == 0
            assert not await connection.fetchval(_FUNCTION)
            assert await connection.fetchval("SELECT count(*) FROM idempotency_key") == 1
            # Without the trigger a keyed insert holds nothing.
            await connection.execute(
                "INSERT INTO job (id, queue, task_type, payload, status, max_attempts,"
                " visible_at, idempotency_key) VALUES (gen_random_uuid(), 'default', 'noop',"
                " '{}', 'PENDING', 5, now(), 'unheld')"
            )
            assert (
                await connection.fetchval(
                    "SELECT count(*) FROM idempotency_key WHERE key = 'unheld'"
                )
                == 0
            )

            migrate(url, "upgrade", "head")
            assert await connection.fetchval(_TRIGGER) == 1
            assert (
                await connection.fetchval("SELECT version_num FROM alembic_version")
                == head_revision()
            )
            # The upgrade's copy picked up the key inserted while it was down.
            assert (
                await connection.fetchval(
                    "SELECT count(*) FROM idempotency_key WHERE key = 'unheld'"
                )
                == 1
            )
            # The previous release's insert now holds its key for the default window.
            await connection.execute(
                "INSERT INTO job (id, queue, task_type, payload, status, max_attempts,"
                " visible_at, idempotency_key) VALUES (gen_random_uuid(), 'default', 'noop',"
                " '{}', 'PENDING', 5, now(), 'fresh')"
            )
            window = await connection.fetchval(
                "SELECT EXTRACT(EPOCH FROM expires_at - now())::float8 FROM idempotency_key"
                " WHERE key = 'fresh'"
            )
            assert 7 * 86400 - 10 < window <= 7 * 86400
        finally:
            await connection.close()
    finally:
        await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
