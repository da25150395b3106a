"""Metrics of a connection pool: how many connections are in use, how many callers wait for
one, and how long they wait (docs/architecture.md#metrics).

Used by the queue service's database pool (`pool="database"`) and by the producer's and the
workers' HTTP pools towards the queue service (`pool="queue-service"`). A pool that runs dry
shows as waiting callers and growing wait times long before its callers time out.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Gauge, Histogram

T = TypeVar("T")

_WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)


class PoolMetrics:
    """`jobq_pool_connections_in_use`, `jobq_pool_connections_max`, `jobq_pool_waiting` and
    `jobq_pool_wait_seconds`, labelled with the pool's name, on `registry`."""

    def __init__(self, registry: CollectorRegistry, pool: str, size: int) -> None:
        self.in_use = Gauge(
            "jobq_pool_connections_in_use",
            "Connections of the pool held by a caller now.",
            ["pool"],
            registry=registry,
        ).labels(pool)
        Gauge(
            "jobq_pool_connections_max",
            "Connections the pool may open.",
            ["pool"],
            registry=registry,
        ).labels(pool).set(size)
        self.waiting = Gauge(
            "jobq_pool_waiting",
            "Callers waiting for a free connection now.",
            ["pool"],
            registry=registry,
        ).labels(pool)
        self.wait = Histogram(
            "jobq_pool_wait_seconds",
            "Time a caller waited for a connection, seconds.",
            ["pool"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        ).labels(pool)

    async def acquired(self, acquire: Callable[[], Awaitable[T]]) -> T:
        """Run `acquire()` (which returns a connection, or a slot), counting the wait."""
        started = time.perf_counter()
        self.waiting.inc()
        try:
            value = await acquire()
        finally:
            self.waiting.dec()
            self.wait.observe(time.perf_counter() - started)
        self.in_use.inc()
        return value

    def released(self) -> None:
        """A connection `acquired` counted is back in the pool."""
        self.in_use.dec()

    @contextlib.asynccontextmanager
    async def holding(self, acquire: Callable[[], Awaitable[T]]) -> AsyncIterator[T]:
        """`acquired`, then `released` on exit."""
        value = await self.acquired(acquire)
        try:
            yield value
        finally:
            self.released()
