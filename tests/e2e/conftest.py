"""A real stack for end-to-end tests: queue, producer, worker and SMTP sink processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from infra.stack import LocalStack
from tests.e2e.sqs_helpers import KEYS, SqsStack

E2E_SETTINGS = {
    "QUEUE_RETRY_BASE_DELAY": "50ms",
    "QUEUE_RETRY_MAX_DELAY": "200ms",
    "QUEUE_REAPER_INTERVAL": "200ms",
    "WORKER_WAIT_SECONDS": "2",
}


@pytest.fixture(scope="module")
async def stack(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalStack]:
    """Queue service, producer, one worker and the SMTP sink, as real processes."""
    stack = LocalStack(
        database_url, redis_url, tmp_path_factory.mktemp("stack"), environment=E2E_SETTINGS
    )
    await stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
async def sqs(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SqsStack]:
    """Queue service, producer and SQS endpoint as real processes (no worker: SQS clients
    are the consumers), with acme's and beta's keys. Test modules import it by name."""
    stack = LocalStack(
        database_url,
        redis_url,
        tmp_path_factory.mktemp("sqs-stack"),
        workers=0,
        smtp_enabled=False,
        sqs_enabled=True,
        environment={**E2E_SETTINGS, "JOBQ_API_KEYS": KEYS},
    )
    await stack.start()
    try:
        yield SqsStack(stack)
    finally:
        stack.stop()


async def wait_for_status(
    client: httpx.AsyncClient,
    job_id: str,
    statuses: set[str],
    within: float = 30,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Poll `GET /jobs/{id}` (with `headers`) until the job is in one of `statuses`; returns
    its view."""
    deadline = time.monotonic() + within
    while True:
        view: dict[str, Any] = (await client.get(f"/jobs/{job_id}", headers=headers)).json()
        if view.get("status") in statuses:
            return view
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not in {statuses} within {within}s: {view}")
        await asyncio.sleep(0.05)
