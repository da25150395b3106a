"""A database that refuses the queue service's connections, for whatever reason it gives, makes
the repository raise ServiceUnavailable (HTTP 503 with Retry-After), never a 500: connections
not allowed (55000), the database missing (3D000)."""

from __future__ import annotations

import logging

import pytest

from common.errors import ServiceUnavailable
from services.queue.repository import JobRepository, create_pool
from tests.conftest import _admin
from tests.helpers import new_job


async def test_a_database_not_allowing_connections_is_unavailable(
    postgres_base: str, fresh_database_name: str
) -> None:
    name = fresh_database_name
    await _admin(postgres_base, f'CREATE DATABASE "{name}"')
    await _admin(postgres_base, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    pool = await create_pool(f"{postgres_base}/{name}", size=2)
    try:
        with pytest.raises(ServiceUnavailable):
            await JobRepository(pool).insert_many([new_job()])
    finally:
        await pool.close()
        await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}"')


async def test_a_missing_database_is_unavailable(
    postgres_base: str, fresh_database_name: str
) -> None:
    pool = await create_pool(f"{postgres_base}/{fresh_database_name}_missing", size=2)
    try:
        with pytest.raises(ServiceUnavailable):
            await JobRepository(pool).claim(["default"], "w", 1, 30)
    finally:
        await pool.close()


async def test_refusals_during_an_outage_are_one_warning_not_one_per_request(
    postgres_base: str, fresh_database_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    pool = await create_pool(f"{postgres_base}/{fresh_database_name}_gone", size=2)
    caplog.set_level(logging.WARNING, logger="services.queue.repository")
    repository = JobRepository(pool)
    try:
        for _ in range(25):
            with pytest.raises(ServiceUnavailable):
                await repository.claim(["default"], "w", 1, 30)
    finally:
        await pool.close()
    warnings = [r for r in caplog.records if getattr(r, "event", "") == "database_unavailable"]
    assert len(warnings) == 1 and "does not exist" in warnings[0].getMessage()
