"""Per-tenant rate limits of the producer (docs/architecture.md#rate-limits).

Requests are limited by Litestar's rate-limit middleware (a fixed window per tenant, answered
`429` with `Retry-After` and the IETF draft's `RateLimit-*` headers); the jobs submitted (one
per submit, one per batch entry) and email submits by fixed windows per tenant of their own
(`TenantWindow`). Both count in one store: Redis, shared
by every producer replica, falling back to this process's memory while Redis cannot be reached
(`FallbackStore`), so an outage loosens the limits to per replica instead of failing requests.
Counting is read-then-write, as Litestar's own limiter does: replicas racing on one tenant may
let a few requests more through than the limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import TooManyRequestsException
from litestar.middleware.base import DefineMiddleware
from litestar.middleware.rate_limit import (
    DURATION_VALUES,
    RateLimitConfig,
    RateLimitMiddleware,
)
from litestar.stores.base import Store
from litestar.stores.memory import MemoryStore
from litestar.types import Receive, Scope, Send
from redis.exceptions import RedisError

from common.web.access import ALL_TENANTS, ApiKeys, bearer_token
from common.web.settings import RateUnit
from services.producer.metrics import ProducerMetrics

logger = logging.getLogger(__name__)

STORE_NAME = "rate_limit"
"""The name of the store in the app's store registry."""
_UNREACHABLE = (RedisError, OSError, TimeoutError)


class FallbackStore(Store):
    """`primary` (Redis) while it answers, else `fallback` (memory) for `retry_after` seconds
    before Redis is tried again. A WARNING is logged when an outage begins, INFO when it ends.
    """

    def __init__(self, primary: Store | None, fallback: Store, retry_after: float = 5.0) -> None:
        self._primary = primary
        self._fallback = fallback
        self._retry_after = retry_after
        self._down_until = 0.0

    def _live(self) -> Store | None:
        if self._primary is None or time.monotonic() < self._down_until:
            return None
        return self._primary

    def _failed(self, exc: BaseException) -> None:
        if self._down_until == 0.0:
            logger.warning(
                "rate-limit store unreachable (%s); counting in memory, per replica",
                type(exc).__name__,
                extra={"event": "rate_limit_store_unavailable"},
            )
        self._down_until = time.monotonic() + self._retry_after

    def _recovered(self) -> None:
        if self._down_until != 0.0:
            logger.info(
                "rate-limit store reachable again", extra={"event": "rate_limit_store_recovered"}
            )
            self._down_until = 0.0

    async def set(
        self, key: str, value: str | bytes, expires_in: int | timedelta | None = None
    ) -> None:
        """Store `value` under `key` for `expires_in` seconds."""
        primary = self._live()
        if primary is not None:
            try:
                await primary.set(key, value, expires_in)
                self._recovered()
                return
            except _UNREACHABLE as exc:
                self._failed(exc)
        await self._fallback.set(key, value, expires_in)

    async def get(self, key: str, renew_for: int | timedelta | None = None) -> bytes | None:
        """The value under `key`, or None."""
        primary = self._live()
        if primary is not None:
            try:
                value = await primary.get(key, renew_for)
                self._recovered()
                return value
            except _UNREACHABLE as exc:
                self._failed(exc)
        return await self._fallback.get(key, renew_for)

    async def delete(self, key: str) -> None:
        """Forget `key` in both stores."""
        await self._fallback.delete(key)
        primary = self._live()
        if primary is not None:
            try:
                await primary.delete(key)
            except _UNREACHABLE as exc:
                self._failed(exc)

    async def delete_all(self) -> None:
        """Forget every key of this process's memory (Redis keys expire by themselves)."""
        await self._fallback.delete_all()

    async def exists(self, key: str) -> bool:
        """Whether `key` is stored."""
        return await self.get(key) is not None

    async def expires_in(self, key: str) -> int | None:
        """Seconds until `key` expires, from the store in use."""
        primary = self._live()
        if primary is not None:
            try:
                return await primary.expires_in(key)
            except _UNREACHABLE as exc:
                self._failed(exc)
        return await self._fallback.expires_in(key)


def rate_key(connection: ASGIConnection[Any, Any, Any, Any], keys: ApiKeys) -> tuple[str, str]:
    """(identifier, metric label) a request is counted under: its key's tenant
    (`tenant:acme`), or its client address when it brings no known key (`client:10.0.0.7`,
    label `anonymous`): the connection's peer, or the client a proxy of `HTTP_TRUSTED_PROXIES`
    names (docs/architecture.md#client-addresses)."""
    token = bearer_token(connection)
    caller = keys.resolve(token) if token is not None else None
    if caller is not None:
        label = "all-tenants" if caller.tenant == ALL_TENANTS else caller.tenant
        return f"tenant:{caller.tenant}", label
    host = connection.client.host if connection.client else "unknown"
    return f"client:{host}", "anonymous"


class _TenantRateLimitMiddleware(RateLimitMiddleware):
    """Litestar's limiter, counting its refusals in `jobq_rate_limited_total`."""

    keys: ApiKeys
    metrics: ProducerMetrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except TooManyRequestsException:
            request: Request[Any, Any, Any] = scope["litestar_app"].request_class(scope)
            self.metrics.count_rate_limited(rate_key(request, self.keys)[1], "requests")
            raise


def request_rate_limit(
    rate: tuple[RateUnit, int], keys: ApiKeys, metrics: ProducerMetrics
) -> DefineMiddleware:
    """The middleware limiting each tenant (each anonymous client address) to `rate`
    requests; probes, metrics and the API description are not counted."""
    middleware_class = type(
        "TenantRateLimitMiddleware",
        (_TenantRateLimitMiddleware,),
        {"keys": keys, "metrics": metrics},
    )
    config = RateLimitConfig(
        rate_limit=rate,
        exclude=["^/health/", "^/metrics$", "^/schema"],
        identifier_for_request=lambda request: rate_key(request, keys)[0],
        middleware_class=middleware_class,
        store=STORE_NAME,
    )
    return config.middleware


class TenantWindow:
    """At most `rate` events per tenant in each fixed window (e.g. 100 per minute from the
    top of the minute), counted under `name` in `store`: email jobs (`SMTP_TENANT_RATE`) and
    the jobs of submits and batches (`PRODUCER_RATE_LIMIT`)."""

    def __init__(self, store: Store, rate: tuple[RateUnit, int], name: str) -> None:
        self._store = store
        self._window = DURATION_VALUES[rate[0]]
        self._limit = rate[1]
        self._name = name
        self._lock = asyncio.Lock()

    async def take(self, tenant: str, count: int = 1) -> float | None:
        """Count `count` events for `tenant`, all or none: None when they fit in what is left
        of the window, else the seconds until the window resets (nothing counted). `count`s
        over the whole limit never fit."""
        now = time.time()
        start = int(now // self._window) * self._window
        key = f"{self._name}:{tenant}:{start}"
        async with self._lock:
            used = int(await self._store.get(key) or 0)
            if used + count > self._limit:
                return start + self._window - now
            await self._store.set(key, str(used + count), expires_in=self._window)
        return None


def create_store(redis_url: str) -> tuple[FallbackStore, Any]:
    """The rate-limit store for `redis_url` (empty: memory only) and the Redis client to
    close at shutdown (None without one). Redis calls time out after half a second, so an
    unreachable Redis delays a request by at most that much before the memory takes over."""
    if not redis_url:
        return FallbackStore(None, MemoryStore()), None
    import redis.asyncio as aioredis
    from litestar.stores.redis import RedisStore

    client = aioredis.from_url(redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
    return FallbackStore(RedisStore(client, namespace="jobq-rate"), MemoryStore()), client
