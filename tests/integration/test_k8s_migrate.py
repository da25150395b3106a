"""The Kubernetes migration Job and the queue service's schema gate, on a real database: the
Job's `alembic upgrade head` never runs backwards, and the init container's `alembic check`
holds a queue service back until the schema is at its head (infra/k8s/base/migrate.yaml,
queue.yaml)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator

import asyncpg
import pytest

from infra.kubernetes import render
from services.queue.app import head_revision
from tests.conftest import migrate, own_database, schema_revision

UNKNOWN_REVISION = "ffffffffffff"
"""A revision from a release newer than this checkout."""


def _alembic(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The alembic CLI as the manifests' containers run it; its exit code is left to the test."""
    return migrate(url, *args, check=False)


@pytest.fixture
async def migrated(postgres_base: str, template_database: str) -> AsyncIterator[str]:
    """A database of its own at head, dropped afterwards."""
    name = f"jobq_k8s_migrate_{os.getpid()}"
    async with own_database(postgres_base, template_database, name) as url:
        yield url


def test_the_manifests_run_these_commands() -> None:
    objects = render("production")
    commands = {
        c["name"]: c["command"]
        for item in objects
        if item["kind"] in ("Job", "Deployment")
        for c in item["spec"]["template"]["spec"]["containers"]
        + item["spec"]["template"]["spec"].get("initContainers", [])
    }
    assert commands["migrate"] == ["alembic", "upgrade", "head"]
    assert commands["wait-for-schema"] == ["alembic", "check"]


async def test_upgrade_head_refuses_a_schema_newer_than_the_image(migrated: str) -> None:
    """An older image's Job against a newer release's schema fails and changes nothing."""
    connection = await asyncpg.connect(migrated)
    try:
        await connection.execute("UPDATE alembic_version SET version_num = $1", UNKNOWN_REVISION)
    finally:
        await connection.close()
    upgrade = _alembic(migrated, "upgrade", "head")
    assert upgrade.returncode != 0
    assert "Can't locate revision" in upgrade.stderr, upgrade.stderr[-2000:]
    assert await schema_revision(migrated) == UNKNOWN_REVISION
    gate = _alembic(migrated, "check")
    assert gate.returncode != 0, "an older queue service does not start on a newer schema"


async def test_the_schema_gate_opens_once_the_job_has_run(migrated: str) -> None:
    migrate(migrated, "downgrade", "-1")
    behind = await schema_revision(migrated)
    assert behind != head_revision()
    gate = _alembic(migrated, "check")
    assert gate.returncode != 0
    assert "not up to date" in gate.stderr, gate.stderr[-2000:]

    job = _alembic(migrated, "upgrade", "head")
    assert job.returncode == 0, job.stderr[-2000:]
    assert await schema_revision(migrated) == head_revision()
    # At head the gate opens: `alembic check` passes (test_migrations.py checks that).
