"""A 503 must not hide a created job (issue 16 item 9, issue 25 item 6), with the real producer,
queue service and PostgreSQL, and a TCP relay between them that holds requests or replies:

- a forward whose reply never comes is answered 504 `outcome-unknown` with the job's id, and
  the job is found by that id;
- a forward that reaches the queue service after its deadline (`X-Jobq-Deadline`) is refused
  before the insert, and no job exists;
- the client library's submits carry an idempotency key, reused on its own retries, so a
  submit whose reply was lost is retried as a replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from jobq import AsyncClient, Client
from services.producer.app import create_app as create_producer
from services.producer.settings import ProducerSettings
from services.queue.app import create_app as create_queue
from services.queue.repository import JobRepository
from services.queue.settings import QueueSettings
from tests.conftest import serving
from tests.helpers import eventually

JOB = {"taskType": "noop", "payload": {"n": 1}}


class Relay:
    """A TCP relay to `127.0.0.1:upstream`: it passes requests while `requests` is set and
    replies while `replies` is set (holding them otherwise), and cuts the connection instead of
    passing the next `drop_replies` replies. `sent` and `received` keep every byte relayed
    each way."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.requests = asyncio.Event()
        self.replies = asyncio.Event()
        self.requests.set()
        self.replies.set()
        self.drop_replies = 0
        self.sent = b""
        self.received = b""
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        """Serve on a free loopback port; yields its base URL."""
        server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{self.port}"
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.read(65536)
        if not first:
            writer.close()
            return
        self.sent += first
        await self.requests.wait()
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        up_writer.write(first)

        async def up() -> None:
            while data := await reader.read(65536):
                self.sent += data
                await self.requests.wait()
                up_writer.write(data)
                await up_writer.drain()
            # The caller left (its deadline passed): the request already relayed is still
            # answered upstream, as by a replica that read it late, and that answer recorded.

        async def down() -> None:
            while data := await up_reader.read(65536):
                self.received += data
                if self.drop_replies:
                    self.drop_replies -= 1
                    writer.close()
                    return
                await self.replies.wait()
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(up(), down())
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            up_writer.close()


@pytest.fixture
async def queue_port(clean_database: str) -> AsyncIterator[int]:
    async with serving(create_queue(QueueSettings(database_url=clean_database))) as queue:
        yield queue.base_url.port or 0


async def _count(repository: JobRepository) -> int:
    return sum(row.count for row in await repository.depth())


async def test_a_forward_whose_reply_never_comes_is_outcome_unknown_with_the_job_id(
    queue_port: int, repository: JobRepository
) -> None:
    relay = Relay(queue_port)
    relay.replies.clear()
    async with relay.running() as url:
        settings = ProducerSettings(queue_service_url=url, producer_forward_timeout=1.0)
        async with serving(create_producer(settings)) as producer:
            reply = await producer.post("/jobs", json={**JOB, "idempotencyKey": "order-7"})

            assert reply.status_code == 504
            problem = reply.json()
            assert problem["type"] == "urn:jobq:problem:outcome-unknown"
            assert problem["idempotencyKey"] == "order-7"
            job_id = uuid.UUID(problem["jobId"])
            assert reply.headers["content-type"].startswith("application/problem+json")
            unanswered_read = await producer.get(f"/jobs/{job_id}")
            assert unanswered_read.status_code == 503, "a read has no outcome to be unsure of"

            relay.replies.set()
            found = await producer.get(f"/jobs/{job_id}")

    assert found.status_code == 200, "the id given is the job's, so the client can look it up"
    assert found.json()["idempotencyKey"] == "order-7"
    assert await _count(repository) == 1


async def test_a_batch_whose_reply_never_comes_lists_the_ids_of_what_it_forwarded(
    queue_port: int, repository: JobRepository
) -> None:
    relay = Relay(queue_port)
    relay.replies.clear()
    entries = [{**JOB, "idempotencyKey": "b-0"}, {"taskType": "noop", "payload": [1]}, JOB]
    async with relay.running() as url:
        settings = ProducerSettings(queue_service_url=url, producer_forward_timeout=0.5)
        async with serving(create_producer(settings)) as producer:
            reply = await producer.post("/jobs/batch", json={"jobs": entries})
            relay.replies.set()

            assert reply.status_code == 504
            problem = reply.json()
            assert problem["type"] == "urn:jobq:problem:outcome-unknown"
            listed = problem["jobs"]
            assert [job["index"] for job in listed] == [0, 2], "the invalid entry was not sent"
            assert listed[0]["idempotencyKey"] == "b-0" and "idempotencyKey" not in listed[1]
            for job in listed:
                assert (await producer.get(f"/jobs/{job['jobId']}")).status_code == 200

    assert await _count(repository) == 2


async def test_a_forward_arriving_after_its_deadline_creates_no_job(
    queue_port: int, repository: JobRepository
) -> None:
    relay = Relay(queue_port)
    relay.requests.clear()  # a stopped queue-service replica: the request waits in its socket
    async with relay.running() as url:
        settings = ProducerSettings(queue_service_url=url, producer_forward_timeout=1.0)
        async with serving(create_producer(settings)) as producer:
            reply = await producer.post("/jobs", json=JOB)
            assert reply.status_code == 504
            job_id = uuid.UUID(reply.json()["jobId"])

            relay.requests.set()  # the replica resumes and reads the request
            await eventually(
                lambda: asyncio.sleep(0, relay.received),
                lambda received: b"deadline-exceeded" in received,
                what="the queue service's refusal of the late forward",
            )

    assert b"HTTP/1.1 503" in relay.received
    assert await repository.get(job_id) is None
    assert await _count(repository) == 0


async def test_the_queue_service_checks_the_deadline_header_at_the_boundary(
    queue_port: int, repository: JobRepository
) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{queue_port}") as queue:
        late = {"X-Jobq-Deadline": f"{time.time() - 0.5:.3f}"}
        single = await queue.post("/jobs", json=JOB, headers=late)
        batch = await queue.post("/jobs/batch", json={"jobs": [JOB, JOB]}, headers=late)
        assert single.status_code == batch.status_code == 503
        assert single.json()["type"] == batch.json()["type"] == "urn:jobq:problem:deadline-exceeded"
        assert single.headers["retry-after"] == "1"
        assert await _count(repository) == 0

        for bad in ("soon", "nan", "inf", "-1", "0"):
            refused = await queue.post("/jobs", json=JOB, headers={"X-Jobq-Deadline": bad})
            assert refused.status_code == 422, bad
            [error] = refused.json()["errors"]
            assert error["pointer"] == "header:X-Jobq-Deadline", bad
        assert await _count(repository) == 0

        ahead = {"X-Jobq-Deadline": f"{time.time() + 30:.3f}"}
        assert (await queue.post("/jobs", json=JOB, headers=ahead)).status_code == 202
        assert (await queue.post("/jobs/batch", json={"jobs": [JOB]}, headers=ahead)).is_success
    assert await _count(repository) == 2


def _submitted_keys(raw: bytes) -> list[str | None]:
    """The idempotency key of each `POST /jobs` body relayed."""
    keys: list[str | None] = []
    for request in raw.split(b"POST /jobs ")[1:]:
        body: dict[str, Any] = json.loads(request.split(b"\r\n\r\n", 1)[1])
        keys.append(body.get("idempotencyKey"))
    return keys


@pytest.mark.parametrize("kind", ["Client", "AsyncClient"])
async def test_the_client_library_retries_a_lost_submit_with_the_same_key(
    queue_port: int, repository: JobRepository, kind: str
) -> None:
    settings = ProducerSettings(queue_service_url=f"http://127.0.0.1:{queue_port}")
    async with serving(create_producer(settings)) as producer:
        relay = Relay(producer.base_url.port or 0)
        relay.drop_replies = 1  # the first submit is created, and its reply lost
        async with relay.running() as url:

            def submit() -> str:
                with Client(url) as client:
                    return str(client.submit("noop", {"n": 1}).job_id)

            if kind == "Client":
                job_id = await asyncio.to_thread(submit)
            else:
                async with AsyncClient(url) as client:
                    job_id = str((await client.submit("noop", {"n": 1})).job_id)

    keys = _submitted_keys(relay.sent)
    assert len(keys) == 2, "the lost submit was sent again"
    assert keys[0] is not None and keys[0] == keys[1], "the retry reused the submit's key"
    assert b"HTTP/1.1 202" in relay.received and b"HTTP/1.1 200" in relay.received
    assert await _count(repository) == 1, "the retry was a replay, not a second job"
    view = await repository.get(uuid.UUID(job_id))
    assert view is not None and view[0].idempotency_key == keys[0]
