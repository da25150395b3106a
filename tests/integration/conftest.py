"""Fixtures shared by the flow-control tests (pause, limits): queue-service replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.queue.app import create_app
from services.queue.settings import QueueSettings
from tests.conftest import serving


def replica_settings(database_url: str, redis_url: str) -> QueueSettings:
    """A queue service's settings with the depth cache refreshed every 0.2 s."""
    return QueueSettings(database_url=database_url, redis_url=redis_url, queue_depth_interval=0.2)


@pytest.fixture
async def replicas(
    clean_database: str, redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Two queue-service replicas on one database."""
    async with (
        serving(create_app(replica_settings(clean_database, redis_url))) as first,
        serving(create_app(replica_settings(clean_database, redis_url))) as second,
    ):
        yield first, second
