"""Shared fixtures: real PostgreSQL and Redis, found or started by `infra.servers`.

The schema is migrated once (by alembic, as in production) into a template database; the
session's test database is a copy of it, and each test that uses it starts from an empty
`job` table. A missing server is a test *failure* with the install hint, never a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from benchmark.database import admin_execute as _admin
from common.web.serving import ServerLimits, server_config
from infra import servers
from infra.servers import ServerUnavailable, ensure_postgres, ensure_redis
from infra.stack import ROOT, free_port
from infra.tools import ToolUnavailable, ensure_pg_partman
from services.queue.repository import JobRepository, create_pool
from services.queue.settings import async_database_url


def migrate(database_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the alembic CLI against `database_url` (default: upgrade head); raises on failure
    unless `check` is false (then the exit code is the caller's to read)."""
    command = list(args) or ["upgrade", "head"]
    return subprocess.run(
        [sys.executable, "-m", "alembic", *command],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        check=check,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="session")
def postgres_base() -> str:
    """`postgresql://user@host:port` of a server the tests may create databases on."""
    try:
        return ensure_postgres()
    except ServerUnavailable as exc:
        pytest.fail(f"integration tests need PostgreSQL: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """`redis://host:port/15`: a Redis database the tests own."""
    try:
        return ensure_redis().rstrip("/") + "/15"
    except ServerUnavailable as exc:
        pytest.fail(f"integration tests need Redis: {exc}", pytrace=False)


@pytest.fixture(scope="session")
async def template_database(postgres_base: str) -> AsyncIterator[str]:
    """A database migrated to head once per session, used only as a template."""
    name = f"jobq_template_{os.getpid()}"
    await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"')
    try:
        migrate(f"{postgres_base}/{name}")
        yield name
    finally:
        await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
async def database_url(postgres_base: str, template_database: str) -> AsyncIterator[str]:
    """URL of this session's test database, a copy of the migrated template."""
    name = f"jobq_test_{os.getpid()}"
    url = await template_copy(postgres_base, template_database, name)
    try:
        yield url
    finally:
        await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_partman(postgres_base: str) -> str:
    """The version of the pg_partman extension the test server offers (e.g. "4.7.2"), made
    available by `infra.tools.ensure_pg_partman` (Debian's postgresql-<major>-partman, as
    root) when it is not. A test *failure* saying what to install when it cannot be, never a
    skip. Creating the extension in a database is the test's own business."""
    try:
        return ensure_pg_partman(f"{postgres_base}/postgres")
    except (ToolUnavailable, OSError, asyncpg.PostgresError) as exc:
        pytest.fail(f"the pg_partman tests need the extension: {exc}", pytrace=False)


@pytest.fixture
async def clean_database(database_url: str) -> str:
    """The test database with empty job, schedule, queue_control and rate_bucket tables."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "TRUNCATE job, job_history, idempotency_key, schedule, queue_control, rate_bucket"
        )
    finally:
        await connection.close()
    return database_url


@pytest.fixture
async def engine(clean_database: str) -> AsyncIterator[AsyncEngine]:
    """An async engine on the clean test database, with room for 20 concurrent connections."""
    engine = create_async_engine(async_database_url(clean_database), pool_size=20, max_overflow=0)
    yield engine
    await engine.dispose()


@pytest.fixture
async def repository(clean_database: str) -> AsyncIterator[JobRepository]:
    """The queue service's repository on the clean test database (20 pooled connections)."""
    pool = await create_pool(clean_database, size=20)
    try:
        yield JobRepository(pool)
    finally:
        await pool.close()


@pytest.fixture
def fresh_database_name(postgres_base: str) -> Iterator[str]:
    """A name for an empty database a test creates and drops itself."""
    yield f"jobq_scratch_{os.getpid()}"


@pytest.fixture
def private_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state directory for `infra.servers` throwaway servers, with a cluster name and port of
    this test's own (`ensure_postgres(private_cluster)` creates it); dropped afterwards. For
    tests that stop or restart PostgreSQL, which must never touch the machine's server."""
    monkeypatch.setattr(servers, "DEFAULT_PG_PORT", free_port())
    monkeypatch.setattr(servers, "CLUSTER_NAME", f"jobq-test-{os.getpid()}")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    state = Path(tempfile.mkdtemp(prefix="jobq-servers-test-", dir="/var/tmp"))
    yield state
    if state.exists():  # unless the test discarded it
        env = {**os.environ, "PG_CLUSTER_CONF_ROOT": str(state / "clusters")}
        listed = subprocess.run(
            ["pg_lsclusters", "--json"], env=env, capture_output=True, text=True, check=True
        )
        for cluster in json.loads(listed.stdout or "[]"):
            subprocess.run(
                ["pg_dropcluster", "--stop", str(cluster["version"]), cluster["cluster"]],
                env=env, check=True, capture_output=True,
            )  # fmt: skip
        shutil.rmtree(state)


def pg_ctlcluster(state: Path, *args: str, wait: bool = True) -> subprocess.Popen[bytes]:
    """Run `pg_ctlcluster <version> <private cluster> <args…>` on the cluster of
    `private_cluster`'s state directory; waits for it unless `wait` is false."""
    env = {**os.environ, "PG_CLUSTER_CONF_ROOT": str(state / "clusters")}
    listed = subprocess.run(
        ["pg_lsclusters", "--json"], env=env, capture_output=True, text=True, check=True
    )
    [cluster] = json.loads(listed.stdout)
    process = subprocess.Popen(
        ["pg_ctlcluster", str(cluster["version"]), cluster["cluster"], *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if wait:
        process.wait(60)
    return process


@contextlib.asynccontextmanager
async def serving(app: Any, limits: ServerLimits | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """Serve `app` with a real uvicorn server on a free loopback port, in this event loop,
    within `limits` (the services' own HTTP protocol and defaults), and yield an httpx client
    for it; the server (and the app's lifespan) stops on exit."""
    import uvicorn

    port = free_port()
    config = server_config(app, "127.0.0.1", port, limits or ServerLimits(), lifespan="on")
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        deadline = time.monotonic() + 15
        while not server.started:
            if task.done() or time.monotonic() > deadline:
                task.result()
                raise AssertionError("the test server did not start")
            await asyncio.sleep(0.02)
        try:
            yield client
        finally:
            server.should_exit = True
            await task


INTERNAL_TOKEN = "internal-token-0123456789"
"""The queue service's token in `guarded_services`."""


@contextlib.asynccontextmanager
async def guarded_services(
    database_url: str,
    redis_url: str,
    keys: str,
    *,
    producer_token: str = INTERNAL_TOKEN,
    limits: ServerLimits | None = None,
    store_url: str | None = None,
    **producer_settings: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """A queue service requiring `INTERNAL_TOKEN` and a producer with the API `keys` in front
    of it (sending `producer_token`, within `limits` (default: its settings' own), counting
    rate limits in `store_url`
    (default `redis_url`), with `producer_settings`), both served over real HTTP; yields
    (producer, queue) clients."""
    from pydantic import SecretStr

    from services.producer.app import create_app as create_producer
    from services.producer.settings import ProducerSettings
    from services.queue.app import create_app as create_queue
    from services.queue.settings import QueueSettings

    queue_settings = QueueSettings(
        database_url=database_url,
        redis_url=redis_url,
        queue_internal_token=SecretStr(INTERNAL_TOKEN),
    )
    async with serving(create_queue(queue_settings)) as queue:
        settings = ProducerSettings(
            queue_service_url=str(queue.base_url),
            queue_internal_token=SecretStr(producer_token),
            jobq_api_keys=SecretStr(keys),
            redis_url=redis_url if store_url is None else store_url,
            **producer_settings,
        )
        producer_limits = limits or settings.server_limits()
        async with serving(create_producer(settings), producer_limits) as producer:
            yield producer, queue


@pytest.fixture(params=["producer", "queue"])
async def door(
    request: pytest.FixtureRequest, clean_database: str, redis_url: str
) -> AsyncIterator[httpx.AsyncClient]:
    """A client for the producer or the queue service (both on the clean test database,
    served over real HTTP): for tests that hold both doors to the same rule."""
    from pydantic import SecretStr

    from services.producer.app import create_app as create_producer
    from services.producer.settings import ProducerSettings
    from services.queue.app import create_app as create_queue
    from services.queue.settings import QueueSettings

    token = SecretStr("door-token-0123456789")
    queue_settings = QueueSettings(
        database_url=clean_database, redis_url=redis_url, queue_internal_token=token
    )
    async with serving(create_queue(queue_settings)) as queue:
        if request.param == "queue":
            queue.headers["Authorization"] = f"Bearer {token.get_secret_value()}"
            yield queue
            return
        producer_settings = ProducerSettings(
            queue_service_url=str(queue.base_url), queue_internal_token=token
        )
        async with serving(create_producer(producer_settings)) as producer:
            yield producer


async def template_copy(postgres_base: str, template: str, name: str) -> str:
    """Create database `name` afresh as a copy of the migrated `template`; its URL."""
    await _admin(
        postgres_base,
        f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
        f'CREATE DATABASE "{name}" TEMPLATE "{template}"',
    )
    return f"{postgres_base}/{name}"


@contextlib.asynccontextmanager
async def own_database(postgres_base: str, template: str, name: str) -> AsyncIterator[str]:
    """A database `name` of its own, copied from the migrated `template`, dropped on exit."""
    url = await template_copy(postgres_base, template, name)
    try:
        yield url
    finally:
        await _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def schema_revision(url: str) -> str:
    """The alembic revision the database at `url` is at."""
    connection = await asyncpg.connect(url)
    try:
        revision: str = await connection.fetchval("SELECT version_num FROM alembic_version")
        return revision
    finally:
        await connection.close()
