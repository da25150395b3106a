"""Migrations equal the models, and run down and up again cleanly."""

from __future__ import annotations

import asyncpg

from services.queue.app import head_revision
from tests.conftest import _admin, migrate


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
            "ix_job_status_id",
            "ix_job_queue_id",
            "uq_job_idempotency_key",
            "pk_job",
        } <= indexes
    finally:
        await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
