"""Long-poll wake-ups: in-process waiters, fed by PostgreSQL LISTEN/NOTIFY across replicas.

A waiting claim holds no database connection; it sleeps on a future here until a notification
says its queue has ready jobs, or until its re-check interval passes. One notification per
enqueue *statement* (never a per-row trigger, whose NOTIFY lock serialises commits) carries
`<queue>:<count>`, and wakes at most `count` waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterable
from typing import Any

import asyncpg

from common.enqueue import WAKEUP_CHANNEL

logger = logging.getLogger(__name__)


class WakeupHub:
    """Waiters per queue, woken first-come first-served."""

    def __init__(self) -> None:
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}

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
        """Wake every waiter (shutdown: waiters answer 204 at once)."""
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def handle_notification(self, payload: str) -> None:
        """Apply one `<queue>:<count>` notification payload; malformed payloads are ignored."""
        queue, _, count = payload.rpartition(":")
        if queue and count.isdigit():
            self.wake(queue, int(count))


async def listen_forever(dsn: str, hub: WakeupHub, shutdown: asyncio.Event) -> None:
    """Hold one LISTEN connection and feed `hub` until `shutdown` is set.

    Reconnects after a lost connection; in the meantime waiters still re-check on their own
    interval, so a missing notification delays a claim, never loses it.
    """

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        hub.handle_notification(payload)

    while not shutdown.is_set():
        connection: asyncpg.Connection | None = None
        try:
            connection = await asyncpg.connect(dsn, timeout=5)
            await connection.add_listener(WAKEUP_CHANNEL, on_notify)
            lost = asyncio.Event()
            connection.add_termination_listener(lambda _c, lost=lost: lost.set())
            done = asyncio.ensure_future(shutdown.wait())
            lost_task = asyncio.ensure_future(lost.wait())
            await asyncio.wait({done, lost_task}, return_when=asyncio.FIRST_COMPLETED)
            done.cancel()
            lost_task.cancel()
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            logger.warning("LISTEN connection failed: %s", exc, extra={"event": "listen_failed"})
        finally:
            if connection is not None and not connection.is_closed():
                with contextlib.suppress(Exception):
                    await connection.close(timeout=2)
        if not shutdown.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shutdown.wait(), timeout=1.0)
