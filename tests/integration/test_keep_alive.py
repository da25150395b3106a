"""Idle keep-alive connections never race the server's close (issue: a request sent just as
the server closed an idle connection failed with "server disconnected").

jobq's clients give up idle connections before any jobq server may close them
(`common.contracts.CLIENT_IDLE_SECONDS` < `SERVER_KEEP_ALIVE_MIN_SECONDS`), and a request whose
connection was closed before any response byte is sent again on a fresh connection when that is
safe. A scripted HTTP server makes the race deterministic: it answers the first request of each
connection and closes the connection, unanswered, when a second request arrives on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import msgspec
import pytest

from common.contracts import (
    CLIENT_IDLE_SECONDS,
    SERVER_KEEP_ALIVE_MIN_SECONDS,
    JobList,
    JobStatus,
    SubmitJobResponse,
)
from common.errors import ServiceUnavailable
from common.ids import new_job_id
from common.web import http
from common.web.http import ServiceClient
from common.web.settings import HttpServiceSettings
from infra.stack import free_port
from jobq import AsyncClient, Client

LIST_REPLY = msgspec.json.encode(JobList(items=[], next_cursor=None))


class ClosingServer:
    """An HTTP/1.1 server on a loopback port, in a thread of its own: each connection gets an
    answer (200, `reply`, keep-alive) to its first request, and is closed unanswered when a
    second request arrives on it; or, with `close_when_idle`, closed after being idle that many
    seconds (like a real server's keep-alive timeout). `connections` and `requests` count."""

    def __init__(self, reply: bytes = LIST_REPLY, close_when_idle: float | None = None) -> None:
        self.reply = reply
        self.close_when_idle = close_when_idle
        self.connections = 0
        self.requests = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ClosingServer:
        self._thread.start()
        assert self._started.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _close(self) -> None:
        self._server.close()
        serving = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                try:
                    head = await asyncio.wait_for(
                        reader.readuntil(b"\r\n\r\n"), timeout=self.close_when_idle
                    )
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                self.requests += 1
                if served and self.close_when_idle is None:
                    return  # closed as the request arrived: no response byte
                served += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(self.reply), self.reply)
                )
                await writer.drain()
        finally:
            writer.close()


@pytest.fixture
def closing_server() -> Iterator[ClosingServer]:
    with ClosingServer() as server:
        yield server


def test_clients_give_up_idle_connections_before_any_server_may_close_them() -> None:
    assert CLIENT_IDLE_SECONDS < SERVER_KEEP_ALIVE_MIN_SECONDS
    with pytest.raises(ValueError, match="at least 4s"):
        HttpServiceSettings(http_keep_alive_timeout=CLIENT_IDLE_SECONDS)
    assert HttpServiceSettings().http_keep_alive_timeout >= SERVER_KEEP_ALIVE_MIN_SECONDS


def test_the_client_library_reads_again_on_a_fresh_connection(
    closing_server: ClosingServer,
) -> None:
    with Client(closing_server.url) as client:
        client.list()
        client.list()  # the server closes the reused connection instead of answering
    assert closing_server.requests == 3 and closing_server.connections == 2


def test_the_client_library_resends_a_keyed_submit_but_not_a_cancel() -> None:
    reply = msgspec.json.encode(SubmitJobResponse(job_id=new_job_id(), status=JobStatus.PENDING))
    with ClosingServer(reply) as server, Client(server.url) as client:
        client.submit("noop", {}, idempotency_key="first")
        client.submit("noop", {})  # keyed too: the client mints one
        assert server.requests == 3 and server.connections == 2
        with pytest.raises(ServiceUnavailable):
            client.cancel(new_job_id())  # not replayable: the caller decides
        assert server.requests == 4 and server.connections == 2


async def test_the_async_client_reads_again_and_resends_only_keyed_submits(
    closing_server: ClosingServer,
) -> None:
    async with AsyncClient(closing_server.url) as client:
        await client.list()
        await client.list()  # the server closes the reused connection instead of answering
    assert closing_server.requests == 3 and closing_server.connections == 2
    reply = msgspec.json.encode(SubmitJobResponse(job_id=new_job_id(), status=JobStatus.PENDING))
    with ClosingServer(reply) as server:
        async with AsyncClient(server.url) as client:
            await client.submit("noop", {}, idempotency_key="first")
            await client.submit("noop", {})  # keyed too: the client mints one
            assert server.requests == 3 and server.connections == 2
            with pytest.raises(ServiceUnavailable):
                await client.cancel(new_job_id())  # not replayable: the caller decides
            assert server.requests == 4 and server.connections == 2


def test_the_client_library_does_not_reuse_a_connection_idle_past_its_expiry() -> None:
    # A connection idle past the client's expiry is one the server may be closing right now.
    with (
        ClosingServer(close_when_idle=SERVER_KEEP_ALIVE_MIN_SECONDS) as server,
        Client(server.url) as c,
    ):
        c.list()
        time.sleep(CLIENT_IDLE_SECONDS + 0.3)
        c.list()
    assert server.connections == 2 and server.requests == 2


async def test_the_service_pool_sends_again_on_a_fresh_connection(
    closing_server: ClosingServer,
) -> None:
    async with ServiceClient(closing_server.url, connect_retries=1) as client:
        await client.call("GET", "/jobs")
        await client.call("GET", "/jobs")
    assert closing_server.requests == 3 and closing_server.connections == 2


async def test_the_service_pool_does_not_reuse_a_connection_idle_past_its_expiry() -> None:
    with ClosingServer(close_when_idle=SERVER_KEEP_ALIVE_MIN_SECONDS) as server:
        async with ServiceClient(server.url) as client:
            await client.call("GET", "/jobs")
            await asyncio.sleep(CLIENT_IDLE_SECONDS + 0.5)
            await client.call("GET", "/jobs")
        assert server.connections == 2 and server.requests == 2


async def test_a_service_that_is_down_is_one_warning_not_one_per_call(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="common.web.http")
    async with ServiceClient(f"http://127.0.0.1:{free_port()}", connect_retries=0) as client:
        # A peer that was never reached may still be starting: one quiet line, not a warning.
        for _ in range(10):
            with pytest.raises(ServiceUnavailable):
                await client.call("GET", "/jobs", deadline=2)
        starting = [r for r in caplog.records if getattr(r, "event", "") == "upstream_unavailable"]
        assert [r.levelno for r in starting] == [logging.INFO]
        # Past the start-up grace it is an outage: one warning, then folded.
        monkeypatch.setattr(http, "STARTUP_GRACE_SECONDS", 0.0)
        for _ in range(10):
            with pytest.raises(ServiceUnavailable):
                await client.call("GET", "/jobs", deadline=2)
    failed = [r for r in caplog.records if getattr(r, "event", "") == "upstream_unavailable"]
    assert [r.levelno for r in failed] == [logging.INFO, logging.WARNING]


async def test_a_service_that_answered_before_is_a_warning_at_once(
    caplog: pytest.LogCaptureFixture, closing_server: ClosingServer
) -> None:
    caplog.set_level(logging.INFO, logger="common.web.http")
    async with ServiceClient(closing_server.url, connect_retries=0) as client:
        await client.call("GET", "/jobs")
        client.base_url = f"http://127.0.0.1:{free_port()}"  # the peer is gone
        with pytest.raises(ServiceUnavailable):
            await client.call("GET", "/jobs", deadline=2)
    failed = [r for r in caplog.records if getattr(r, "event", "") == "upstream_unavailable"]
    assert [r.levelno for r in failed] == [logging.WARNING]
