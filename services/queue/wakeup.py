"""Long-poll wake-ups: in-process waiters, fed by PostgreSQL LISTEN/NOTIFY across replicas.

A waiting claim holds no database connection; it sleeps on a future here until a notification
says its queue has ready jobs, or until its re-check interval passes. One notification per
enqueue *statement* (never a per-row trigger, whose NOTIFY lock serialises commits) carries
`<queue>:<count>`, and wakes at most `count` waiters.

A caller waiting for a job's outcome (`GET /jobs/{id}?waitSeconds=N`) watches the job's id
here; the `jobq_settled` notification, sent only for jobs somebody flagged as awaited
(docs/adr/008-waiting-for-outcomes.md), wakes every watcher of that id on every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import asyncpg

from common.enqueue import SETTLED_CHANNEL, WAKEUP_CHANNEL
from common.logging import FailureRun

logger = logging.getLogger(__name__)


_HEARD_KEPT = 10_000
"""Queues whose notifications a hub counts (`WakeupHub.heard`); past it, it starts again."""


class WakeupHub:
    """Waiters per queue, woken first-come first-served; and watchers of jobs' outcomes, each
    an `asyncio.Event` set when the job may have settled."""

    def __init__(self) -> None:
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self._watchers: dict[uuid.UUID, set[asyncio.Event]] = {}
        self._heard: dict[str, int] = {}
        self._epoch = 0

    def heard(self, queue: str) -> tuple[int, int]:
        """A mark that changes whenever `queue` may have got ready jobs since it was read: a
        notification for the queue arrived, or notifications may have been missed (the
        listener reconnected). Equal marks: no such notification in between."""
        return self._epoch, self._heard.get(queue, 0)

    async def wait(self, queues: Iterable[str], within: float, *also: asyncio.Future[Any]) -> None:
        """Sleep until one of `queues` is woken, `within` seconds pass, or any of `also` ends."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        names = list(queues)
        for queue in names:
            self._waiters.setdefault(queue, deque()).append(future)
        try:
            await asyncio.wait({future, *also}, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            future.cancel()
            for queue in names:
                waiters = self._waiters.get(queue)
                if waiters is not None:
                    with contextlib.suppress(ValueError):
                        waiters.remove(future)
                    if not waiters:
                        del self._waiters[queue]

    def wake(self, queue: str, count: int) -> int:
        """Wake up to `count` waiters of `queue`; returns how many were woken."""
        waiters = self._waiters.get(queue)
        woken = 0
        while waiters and woken < count:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                woken += 1
        return woken

    def wake_all(self) -> None:
        """Wake every waiter (shutdown: waiters answer 204 at once) and every watcher, and
        change every queue's `heard` mark (after a reconnect, notifications may have been
        missed)."""
        self._epoch += 1
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)
        for events in self._watchers.values():
            for event in events:
                event.set()

    @contextlib.contextmanager
    def watch(self, job_id: uuid.UUID) -> Iterator[asyncio.Event]:
        """Within the block, the returned event is set whenever job `job_id` may have settled
        (a `jobq_settled` notification for it, or `wake_all`); the watcher clears it before
        each read of the job. Register before flagging the job, so no notification is missed."""
        event = asyncio.Event()
        self._watchers.setdefault(job_id, set()).add(event)
        try:
            yield event
        finally:
            events = self._watchers.get(job_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._watchers[job_id]

    @property
    def watching(self) -> int:
        """How many jobs this replica's waiters watch."""
        return len(self._watchers)

    def handle_settled(self, payload: str) -> None:
        """Apply one `jobq_settled` payload (a job id): wake that job's watchers here, if any.
        A malformed payload is ignored."""
        try:
            job_id = uuid.UUID(payload)
        except ValueError:
            return
        for event in self._watchers.get(job_id, ()):
            event.set()

    def handle_notification(self, payload: str) -> None:
        """Apply one `<queue>:<count>` notification payload; malformed payloads are ignored."""
        queue, _, count = payload.rpartition(":")
        if queue and count.isdigit():
            if queue not in self._heard and len(self._heard) >= _HEARD_KEPT:
                self._heard.clear()  # bounded; the new epoch changes every mark
                self._epoch += 1
            self._heard[queue] = self._heard.get(queue, 0) + 1
            self.wake(queue, int(count))


KEEPALIVES = {
    "tcp_keepalives_idle": "30",
    "tcp_keepalives_interval": "10",
    "tcp_keepalives_count": "3",
}
"""Server-side TCP keepalives (seconds, seconds, probes) on the LISTEN connection: the traffic
keeps a NAT or firewall from dropping the idle flow, and PostgreSQL ends the backend of a client
that vanished. They are not how the replica notices a dead connection; the probe is."""


async def listen_forever(
    dsn: str,
    hub: WakeupHub,
    shutdown: asyncio.Event,
    *,
    probe_interval: float = 5.0,
    probe_timeout: float = 2.0,
    reconnected: Callable[[str], None] = lambda _reason: None,
) -> None:
    """Hold one LISTEN connection (`jobq_ready` and `jobq_settled`) and feed `hub` until
    `shutdown` is set.

    The connection is replaced when the driver reports it closed, and also when it goes
    silent: after `probe_interval` seconds without any notification the replica notifies
    itself on a channel of its own and expects to hear it back within `probe_timeout` seconds
    (a NAT or firewall that drops an idle flow leaves both sockets open, so nothing else would
    tell). A dead connection is therefore noticed within interval + timeout seconds.
    `reconnected(reason)` is called for each replacement, with reason `silent`, `closed` or
    `error` (the connection or LISTEN failed; retried every second). A run of failures is
    logged as `common.logging.FailureRun` logs it (`listen_failed` at the first, then every
    30 s with the count; `listen_recovered` with how long LISTEN was down). In the meantime
    waiters still re-check on their own interval, and every new connection wakes them all
    once, so a lost notification delays a claim, never loses it.
    """
    run = FailureRun(logger, "listen")
    while not shutdown.is_set():
        reason = await _listen_once(dsn, hub, shutdown, probe_interval, probe_timeout, run)
        if shutdown.is_set():
            return
        reconnected(reason)
        if reason == "error":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shutdown.wait(), timeout=1.0)


async def _listen_once(
    dsn: str,
    hub: WakeupHub,
    shutdown: asyncio.Event,
    probe_interval: float,
    probe_timeout: float,
    run: FailureRun,
) -> str:
    """Listen on one connection until shutdown (returns "shutdown") or until it is lost
    ("closed", "silent" or "error"); a failure to connect or LISTEN counts in `run`."""
    loop = asyncio.get_running_loop()
    probe_channel = f"jobq_probe_{secrets.token_hex(8)}"
    echoed = asyncio.Event()
    lost = asyncio.Event()
    last_heard = loop.time()

    def on_notify(_conn: object, _pid: int, channel: str, payload: str) -> None:
        nonlocal last_heard
        last_heard = loop.time()
        if channel == probe_channel:
            echoed.set()
        elif channel == SETTLED_CHANNEL:
            hub.handle_settled(payload)
        else:
            hub.handle_notification(payload)

    connection: asyncpg.Connection | None = None
    try:
        connection = await asyncpg.connect(
            dsn,
            timeout=5,
            server_settings={"application_name": "jobq-queue-listener", **KEEPALIVES},
        )
        await connection.add_listener(WAKEUP_CHANNEL, on_notify)
        await connection.add_listener(SETTLED_CHANNEL, on_notify)
        await connection.add_listener(probe_channel, on_notify)
        connection.add_termination_listener(lambda _c: lost.set())
        run.succeeded()
        # Notifications sent while no connection listened are gone: let every waiter re-check.
        hub.wake_all()
        while True:
            quiet_for = loop.time() - last_heard
            if quiet_for < probe_interval:
                await _first_of(shutdown, lost, within=probe_interval - quiet_for)
            if shutdown.is_set():
                return "shutdown"
            if lost.is_set():
                logger.warning(
                    "LISTEN connection closed; reconnecting", extra={"event": "listen_lost"}
                )
                return "closed"
            if loop.time() - last_heard < probe_interval:
                continue
            echoed.clear()
            try:
                async with asyncio.timeout(probe_timeout):
                    await connection.execute("SELECT pg_notify($1, '')", probe_channel)
                    await echoed.wait()
            except TimeoutError:
                logger.warning(
                    "LISTEN connection silent for %.1fs: its probe did not come back within "
                    "%.1fs; replacing it",
                    loop.time() - last_heard,
                    probe_timeout,
                    extra={"event": "listen_silent"},
                )
                return "silent"
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
        run.failed("LISTEN connection failed: %s", exc)
        return "error"
    finally:
        if connection is not None and not connection.is_closed():
            # Never wait on a connection that may be dead: close the socket at once.
            connection.terminate()


async def _first_of(*events: asyncio.Event, within: float) -> None:
    """Wait until any of `events` is set, or `within` seconds pass."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
