"""Queue depth, cached in Redis (an accelerator, never a dependency).

`GET /queues` answers from the cache while it is fresh; with Redis down or the entry expired it
counts in PostgreSQL instead and says so in `source`. Whether a queue is paused is read from
PostgreSQL on every call (an operator who just paused a queue sees it paused), and from the
cached snapshot only while PostgreSQL does not answer.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from common.contracts import DepthSource, JobStatus, QueueDepth, QueuesResponse, QueueState
from common.errors import ServiceUnavailable
from services.queue.readings import DepthRow
from services.queue.repository import JobRepository

logger = logging.getLogger(__name__)

DEPTH_KEY = "jobq:depth"


class _Snapshot(msgspec.Struct):
    refreshed_at: datetime
    queues: list[QueueDepth]


def summarise(
    rows: list[DepthRow], source: DepthSource, refreshed_at: datetime
) -> list[QueueDepth]:
    """Fold (queue, status) rows into one `QueueDepth` per queue, sorted by queue name."""
    by_queue: dict[str, dict[str, float]] = {}
    for row in rows:
        entry = by_queue.setdefault(row.queue, {})
        entry[row.status.value] = row.count
        if row.status is JobStatus.PENDING:
            entry["age"] = row.oldest_age_seconds
    return [
        QueueDepth(
            queue=queue,
            pending=int(c.get(JobStatus.PENDING.value, 0)),
            scheduled=int(c.get(JobStatus.SCHEDULED.value, 0)),
            processing=int(c.get(JobStatus.PROCESSING.value, 0)),
            dead_letter=int(c.get(JobStatus.DEAD_LETTER.value, 0)),
            oldest_pending_age_seconds=float(c.get("age", 0.0)),
            source=source,
            refreshed_at=refreshed_at,
        )
        for queue, c in sorted(by_queue.items())
    ]


def with_states(
    queues: list[QueueDepth], states: list[QueueState], source: DepthSource, at: datetime
) -> list[QueueDepth]:
    """`queues` with each queue's state from `states` (paused or not, its concurrency limits,
    its tenants' weights); a queue with a state but without jobs gets an entry of its own
    (zero counts, `source` and `at` as the reply's), so it is never hidden. Sorted by queue
    name."""
    by_queue = {state.queue: state for state in states}
    merged: list[QueueDepth] = []
    for depth in queues:
        state = by_queue.pop(depth.queue, None)
        if state is None:
            merged.append(
                msgspec.structs.replace(
                    depth, paused=False, paused_at=None, limits=[], weights=[], last_change=None
                )
            )
        else:
            merged.append(_stated(depth, state))
    for state in by_queue.values():
        empty = QueueDepth(
            queue=state.queue, pending=0, scheduled=0, processing=0, dead_letter=0,
            oldest_pending_age_seconds=0.0, source=source, refreshed_at=at,
        )  # fmt: skip
        merged.append(_stated(empty, state))
    return sorted(merged, key=lambda depth: depth.queue)


def _stated(depth: QueueDepth, state: QueueState) -> QueueDepth:
    return msgspec.structs.replace(
        depth,
        paused=state.paused,
        paused_at=state.paused_at,
        limits=state.limits,
        weights=state.weights,
        last_change=state.last_change,
    )


class DepthCache:
    """Depth snapshots in Redis under `jobq:depth`, expiring after `ttl` seconds."""

    def __init__(self, client: aioredis.Redis | None, ttl: float) -> None:
        self._client = client
        self._ttl_ms = max(1, int(ttl * 1000))

    async def store(self, rows: list[DepthRow], states: list[QueueState]) -> bool:
        """Cache a snapshot of the depth `rows` with the queues' pause `states`; True when
        Redis took it. A Redis failure is logged and otherwise ignored (False), as is a cache
        that is switched off."""
        if self._client is None:
            return False
        now = datetime.now(UTC)
        snapshot = _Snapshot(now, with_states(summarise(rows, "redis", now), states, "redis", now))
        try:
            await self._client.set(DEPTH_KEY, msgspec.json.encode(snapshot), px=self._ttl_ms)
        except (RedisError, OSError) as exc:
            logger.warning("redis unavailable: %s", exc, extra={"event": "redis_unavailable"})
            return False
        return True

    async def load(self) -> QueuesResponse | None:
        """The cached snapshot, or None when absent, expired, unreadable or Redis is down."""
        if self._client is None:
            return None
        try:
            raw = await self._client.get(DEPTH_KEY)
        except (RedisError, OSError) as exc:
            logger.warning("redis unavailable: %s", exc, extra={"event": "redis_unavailable"})
            return None
        if raw is None:
            return None
        try:
            snapshot = msgspec.json.decode(raw, type=_Snapshot)
        except msgspec.DecodeError:
            return None
        return QueuesResponse(
            queues=snapshot.queues, source="redis", refreshed_at=snapshot.refreshed_at
        )

    async def ping(self) -> bool:
        """True when Redis answers PING (reported by readiness, never required by it)."""
        if self._client is None:
            return False
        try:
            return bool(await self._client.ping())
        except (RedisError, OSError):
            return False


async def current_depth(repository: JobRepository, cache: DepthCache) -> QueuesResponse:
    """Depth per queue: from the Redis cache when fresh, else counted in PostgreSQL (at the
    database's time); the reply says which, even when there are no queues. Pause states come
    from PostgreSQL (`with_states`), or from the cached snapshot while it does not answer."""
    cached = await cache.load()
    if cached is not None:
        try:
            states = await repository.queue_states()
        except ServiceUnavailable:
            return cached  # with the pause states of its own refresh
        queues = with_states(cached.queues, states, "redis", cached.refreshed_at)
        return QueuesResponse(queues=queues, source="redis", refreshed_at=cached.refreshed_at)
    rows = await repository.depth()
    now = await repository.now()
    queues = with_states(
        summarise(rows, "postgres", now), await repository.queue_states(), "postgres", now
    )
    return QueuesResponse(queues=queues, source="postgres", refreshed_at=now)
