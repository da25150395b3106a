"""The depth freshness gauges the dashboard and the staleness alerts read."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from services.queue.app import create_app
from services.queue.settings import QueueSettings
from tests.conftest import serving


@pytest.fixture
async def client(clean_database: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = QueueSettings(
        database_url=clean_database, redis_url=redis_url, queue_depth_interval=0.2
    )
    async with serving(create_app(settings)) as client:
        yield client


async def _sample(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    match = re.search(rf"^{name} (\S+)$", text, flags=re.MULTILINE)
    assert match, f"{name} not exported"
    return float(match.group(1))


async def test_depth_freshness_gauges_follow_the_refresh_loop(client: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 10
    while True:
        refreshed = await _sample(client, "jobq_depth_refresh_timestamp_seconds")
        written = await _sample(client, "jobq_depth_cache_write_timestamp_seconds")
        if refreshed > 0 and written > 0:
            break
        assert time.monotonic() < deadline, "the depth loop never ran"
        await asyncio.sleep(0.1)
    assert abs(time.time() - refreshed) < 60 and abs(time.time() - written) < 60


def test_without_redis_the_cache_gauge_is_not_exported() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from services.queue.metrics import QueueMetrics

    registry = CollectorRegistry()
    QueueMetrics(registry, depth_cache=False)
    text = generate_latest(registry).decode()
    assert "jobq_depth_refresh_timestamp_seconds" in text
    assert "jobq_depth_cache_write_timestamp_seconds" not in text
