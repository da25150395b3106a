"""A queue service whose database vanishes at shutdown still stops within its grace, cleanly
(issue 25 item 4). In compose a stopped PostgreSQL container takes its address with it: open
connections end, and a new connection attempt hangs (nothing answers the SYN) instead of being
refused. A TCP relay between the service and a private cluster plays that part here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from infra.servers import ensure_database
from infra.stack import LocalStack, free_port
from tests.conftest import migrate


class VanishingRelay:
    """Relays TCP connections from a loopback port to `target` until `vanish()`: then every
    relayed connection is cut and new ones are accepted but never answered (a host gone from
    the network), so a client's connect and login hang until its own timeout."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.port = free_port()
        self._target = (target_host, target_port)
        self._gone = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self._gone:
            return  # held open, never answered
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers.add(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def vanish(self) -> None:
        self._gone = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.transport.abort()


async def test_the_queue_service_stops_within_its_grace_when_the_database_vanished(
    postgres_base: str, redis_url: str, tmp_path: Path
) -> None:
    name = "jobq_vanish"
    url = ensure_database(postgres_base, name)
    migrate(url)
    direct = urlsplit(url)
    relay = VanishingRelay(direct.hostname or "127.0.0.1", direct.port or 5432)
    await relay.start()
    via_relay = urlunsplit(direct._replace(netloc=f"{direct.username}@127.0.0.1:{relay.port}"))
    grace = 5.0
    # The harness waits far longer than the grace, so an overrun shows as a duration.
    stack = LocalStack(
        via_relay,
        redis_url,
        tmp_path,
        workers=2,
        grace=60,
        environment={"QUEUE_SHUTDOWN_GRACE": f"{grace:g}s", "QUEUE_REAPER_INTERVAL": "200ms"},
    )
    await stack.start()
    try:
        async with httpx.AsyncClient(base_url=stack.producer, timeout=30) as client:
            for _ in range(4):
                reply = await client.post(
                    "/jobs", json={"taskType": "sleep", "payload": {"ms": 30000}}
                )
                assert reply.status_code == 202, reply.text
        relay.vanish()
        # Workers still long-poll and heartbeat; the service's loops retry the database.
        await asyncio.sleep(1)
        started = time.monotonic()
        code = stack.stop_process("queue")
        took = time.monotonic() - started
    finally:
        stack.stop()
        relay.close()
    log = (tmp_path / "queue.log").read_text(errors="replace")
    # uvicorn ends by re-raising the signal it handled: -15 is its clean exit.
    assert code in (0, -15), f"exit {code}\n{log[-4000:]}"
    # The drain may use the whole grace; the lifespan shutdown after it must not hang on
    # connections that will never answer.
    assert took < grace + 5, f"took {took:.1f} s with a {grace:g} s grace\n{log[-4000:]}"
    messages = [json.loads(line).get("message", "") for line in log.splitlines() if line[:1] == "{"]
    assert not [m for m in messages if "never retrieved" in m], messages[-20:]
    assert "Traceback" not in log, log[-4000:]
