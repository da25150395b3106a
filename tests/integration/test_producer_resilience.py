"""The producer answers in bounded time when the queue service is down (503 with Retry-After)
or hangs (504 outcome-unknown with the job's id: the forward was sent); it never leaves a
caller waiting."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest

from infra.stack import free_port
from services.producer.app import create_app
from services.producer.settings import ProducerSettings
from tests.conftest import serving

JOB = {"taskType": "noop", "payload": {}}


async def test_queue_service_down_is_503_with_retry_after() -> None:
    settings = ProducerSettings(queue_service_url=f"http://127.0.0.1:{free_port()}")
    async with serving(create_app(settings)) as producer:
        started = time.monotonic()
        reply = await producer.post("/jobs", json=JOB)
        elapsed = time.monotonic() - started

    assert reply.status_code == 503
    assert reply.headers["retry-after"] == "1"
    assert reply.json()["type"] == "urn:jobq:problem:service-unavailable"
    assert "127.0.0.1" not in reply.text, "internal addresses stay internal"
    assert elapsed < 10


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    """A port that accepts connections and never answers (a hung queue service)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []

    async def accept() -> None:
        loop = asyncio.get_running_loop()
        server.setblocking(False)
        while True:
            connection, _ = await loop.sock_accept(server)
            held.append(connection)

    task = asyncio.create_task(accept())
    yield server.getsockname()[1]
    task.cancel()
    for connection in held:
        connection.close()
    server.close()


async def test_hung_queue_service_is_outcome_unknown_after_the_forward_timeout(
    silent_port: int,
) -> None:
    settings = ProducerSettings(
        queue_service_url=f"http://127.0.0.1:{silent_port}", producer_forward_timeout=1.0
    )
    async with serving(create_app(settings)) as producer:
        started = time.monotonic()
        reply = await producer.post("/jobs", json=JOB)
        elapsed = time.monotonic() - started

    assert reply.status_code == 504
    assert reply.json()["type"] == "urn:jobq:problem:outcome-unknown"
    assert reply.json()["jobId"], "the caller can look the job up"
    assert elapsed < 5, "the caller was kept waiting past the forward timeout"
