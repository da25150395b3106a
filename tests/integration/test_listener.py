"""The LISTEN connection heals itself: a silently dead connection (a NAT or firewall that drops
an idle flow while both sockets stay open) is noticed in bounded time and replaced.

A real TCP proxy, written here with asyncio, stands between the listener and PostgreSQL; it can
stop forwarding the connections it holds without closing either socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from benchmark.database import admin_execute
from common.enqueue import WAKEUP_CHANNEL
from services.queue.metrics import QueueMetrics
from services.queue.wakeup import WakeupHub, listen_forever
from tests.helpers import eventually

PROBE_INTERVAL = 0.5
PROBE_TIMEOUT = 0.5
BOUND = PROBE_INTERVAL + PROBE_TIMEOUT + 5.0
"""Silence is noticed after at most interval + timeout; 5 s more for a new connection."""


class FreezingProxy:
    """Forwards TCP connections from a loopback port to `host:port`. `freeze()` stops moving
    bytes on every connection open at that moment, in both directions, while keeping both of
    its sockets open; connections made later are forwarded normally."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._gates: list[asyncio.Event] = []
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        for gate in self._gates:
            gate.clear()

    @property
    def connections(self) -> int:
        return len(self._gates)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for writer in self._writers:
            writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        gate = asyncio.Event()
        gate.set()
        self._gates.append(gate)
        self._writers += [writer, upstream_writer]
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            pump = asyncio.create_task(self._pump(source, sink, gate))
            self._pumps.add(pump)

    @staticmethod
    async def _pump(
        source: asyncio.StreamReader, sink: asyncio.StreamWriter, gate: asyncio.Event
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                # Frozen: the bytes are held here for good, and neither socket is closed.
                await gate.wait()
                sink.write(data)
                await sink.drain()
        sink.close()


class RecordingHub(WakeupHub):
    """A real hub that also remembers every payload the listener handed it."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads: list[str] = []

    def handle_notification(self, payload: str) -> None:
        self.payloads.append(payload)
        super().handle_notification(payload)


@pytest.fixture
async def proxy(postgres_base: str) -> AsyncIterator[FreezingProxy]:
    address = urlsplit(postgres_base)
    assert address.hostname is not None and address.port is not None
    proxy = FreezingProxy(address.hostname, address.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_a_silently_dead_listen_connection_is_replaced_within_the_bound(
    database_url: str, proxy: FreezingProxy, caplog: pytest.LogCaptureFixture
) -> None:
    address = urlsplit(database_url)
    netloc = f"{address.username}@127.0.0.1:{proxy.port}"
    through_proxy = urlunsplit(address._replace(netloc=netloc))
    hub, metrics, shutdown = RecordingHub(), QueueMetrics(CollectorRegistry()), asyncio.Event()
    numbers = itertools.count()
    sender = await asyncpg.connect(database_url)

    async def wake_up_arrives() -> bool:
        """Notify a fresh queue name from another session; True once the listener heard it."""
        name = f"check-{next(numbers)}"
        await sender.execute("SELECT pg_notify($1, $2)", WAKEUP_CHANNEL, f"{name}:1")

        async def heard() -> bool:
            return f"{name}:1" in hub.payloads

        with contextlib.suppress(AssertionError):
            await eventually(heard, bool, within=0.3)
            return True
        return False

    caplog.set_level(logging.WARNING, logger="services.queue.wakeup")
    listener = asyncio.create_task(
        listen_forever(
            through_proxy,
            hub,
            shutdown,
            probe_interval=PROBE_INTERVAL,
            probe_timeout=PROBE_TIMEOUT,
            reconnected=lambda reason: metrics.listener_reconnects.labels(reason).inc(),
        )
    )
    try:
        await eventually(wake_up_arrives, bool, within=15, what="first wake-up")
        assert proxy.connections == 1

        proxy.freeze()
        await eventually(
            wake_up_arrives, bool, within=BOUND, what="a wake-up after the connection went silent"
        )

        assert proxy.connections >= 2, "the listener was not replaced"
        reconnects = metrics.registry.get_sample_value(
            "jobq_listener_reconnects_total", {"reason": "silent"}
        )
        assert reconnects is not None and reconnects >= 1
        assert any(
            getattr(record, "event", None) == "listen_silent" and record.levelno == logging.WARNING
            for record in caplog.records
        )
    finally:
        shutdown.set()
        await asyncio.wait_for(listener, timeout=10)
        await sender.close()


async def test_a_listen_outage_while_every_slot_is_held_is_a_few_lines_and_one_recovery(
    database_url: str, postgres_base: str, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL refuses the listener's connections while every slot it may use is held
    (its role may open one connection, and another session holds it; superusers are exempt
    from connection limits, so the listener connects as an ordinary role): the refusals, one a
    second, are logged once, and the end of the outage once, with its length and count."""
    role = f"jobq_listen_{os.getpid()}"
    await admin_execute(
        postgres_base,
        f'DROP ROLE IF EXISTS "{role}"',
        f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 1',
    )
    address = urlsplit(database_url)
    as_role = urlunsplit(address._replace(netloc=f"{role}@{address.hostname}:{address.port}"))
    hub, shutdown, reasons = RecordingHub(), asyncio.Event(), list[str]()
    holder = await asyncpg.connect(as_role)
    caplog.set_level(logging.INFO, logger="services.queue.wakeup")
    listener = asyncio.create_task(
        listen_forever(as_role, hub, shutdown, reconnected=reasons.append)
    )
    sender = await asyncpg.connect(database_url)
    try:

        async def refusals() -> int:
            return reasons.count("error")

        await eventually(refusals, lambda n: n >= 4, within=30, what="four refused connections")
        await holder.close()

        async def heard() -> bool:
            await sender.execute("SELECT pg_notify($1, 'after-outage:1')", WAKEUP_CHANNEL)
            await asyncio.sleep(0.05)
            return "after-outage:1" in hub.payloads

        await eventually(heard, bool, within=15, what="a wake-up after the outage")
    finally:
        shutdown.set()
        await asyncio.wait_for(listener, timeout=10)
        await sender.close()
        if not holder.is_closed():
            await holder.close()
        await admin_execute(postgres_base, f'DROP ROLE IF EXISTS "{role}"')

    failed = [r for r in caplog.records if getattr(r, "event", "") == "listen_failed"]
    recovered = [r for r in caplog.records if getattr(r, "event", "") == "listen_recovered"]
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert "too many connections" in failed[0].getMessage()
    assert len(recovered) == 1 and recovered[0].levelno == logging.INFO
    assert recovered[0].failures == reasons.count("error") >= 4
    assert recovered[0].down_seconds >= 3.0
