"""Typed HTTP calls between jobq services, mapping problem details back to `JobqError`s.

The producer and the workers talk to the queue service through `ServiceClient`, a pooled
aiohttp session: its cost per request stays flat however many connections the pool holds (an
httpx pool re-checks every pooled connection on each request, which made a worker with 64
slots slower than one with 16; see docs/architecture.md#performance).

Every call has one total deadline, covering the wait for a pooled connection, connecting,
sending and reading; a call that cannot finish in time is ServiceUnavailable. Every jobq call
is safe to repeat (submits carry their job id, settles are fenced and idempotent), so a call
whose pooled connection turns out to be dead, or whose connection attempt is refused, is sent
again within that deadline. Idle pooled connections are given up after
`common.contracts.CLIENT_IDLE_SECONDS`, well before a jobq server closes them, so a request is
not sent on a connection that is being closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import msgspec

from common.contracts import CLIENT_IDLE_SECONDS
from common.errors import JobqError, ServiceUnavailable, from_problem
from common.web.pools import PoolMetrics

T = TypeVar("T")
logger = logging.getLogger(__name__)

_JSON = {"Content-Type": "application/json"}
QUEUE_SERVICE_CONNECTIONS = 100
"""Connections a producer or a worker opens to the queue service at most."""
_CONNECT_TIMEOUT = 3.0
"""Seconds one TCP connection attempt may take."""
_RETRY_PAUSE = 0.1
"""Seconds before sending again after a refused connection (doubling per attempt)."""


@dataclass(frozen=True, slots=True)
class Reply:
    """A successful (2xx) reply: status code and body bytes."""

    status: int
    content: bytes
    url: str


class ServiceClient:
    """A pooled client for one jobq service at `base_url` (e.g. `http://127.0.0.1:8081`).

    `token` is sent as `Authorization: Bearer <token>`; `timeout` (seconds) is the default
    total deadline of one call; `connect_retries` is how many times a refused or reset
    connection is tried again within it; `max_connections` bounds the pool. Use it as an async
    context manager, or call `aclose()`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        connect_retries: int = 2,
        max_connections: int = QUEUE_SERVICE_CONNECTIONS,
        metrics: PoolMetrics | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._metrics = metrics
        # Calls take a slot before a connection, so waiting for the pool is visible (metrics)
        # and counted in the call's deadline.
        self._slots = asyncio.Semaphore(max_connections)
        self._timeout = timeout
        self._connect_retries = connect_retries
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections,
                    use_dns_cache=True,
                    # Give up idle connections well before the server closes them
                    # (common.contracts.SERVER_KEEP_ALIVE_MIN_SECONDS).
                    keepalive_timeout=CLIENT_IDLE_SECONDS,
                ),
                headers=self._headers,
                # Calls between services never use cookies or proxies from the environment.
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT),
            )
        return self._session

    async def __aenter__(self) -> ServiceClient:
        self._open()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pooled connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        deadline: float | None = None,
        params: dict[str, str | int] | None = None,
    ) -> Reply:
        """Send one request (body encoded with msgspec) and return its 2xx reply.

        `deadline` (seconds, default the client's timeout) bounds the whole call, retries
        included.
        Raises the `JobqError` a problem-details reply describes, and ServiceUnavailable when
        the service cannot be reached or does not answer in time.
        """
        session = self._open()
        content = None if body is None else msgspec.json.encode(body)
        url = self.base_url + path
        attempt = 0
        try:
            async with (
                asyncio.timeout(self._timeout if deadline is None else deadline),
                self._slot(),
            ):
                while True:
                    try:
                        async with session.request(
                            method,
                            url,
                            data=content,
                            headers=_JSON if content is not None else None,
                            params=params,
                        ) as response:
                            data = await response.read()
                            status = response.status
                        break
                    except (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionError):
                        # A pooled connection the peer had closed, or a refused connection: the
                        # call is safe to send again on a fresh one.
                        if attempt >= self._connect_retries:
                            raise
                        attempt += 1
                        await asyncio.sleep(_RETRY_PAUSE * attempt)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The address stays in the log: a public caller of the producer must not learn it.
            logger.warning(
                "%s %s failed: %s",
                method,
                url,
                type(exc).__name__,
                extra={"event": "upstream_unavailable"},
            )
            raise ServiceUnavailable("a jobq service is unreachable; retry shortly") from exc
        if 200 <= status < 300:
            return Reply(status, data, url)
        try:
            problem = msgspec.json.decode(data) if data else None
        except msgspec.DecodeError:
            problem = None
        raise from_problem(problem, status)

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        if self._metrics is None:
            async with self._slots:
                yield
            return
        async with self._metrics.holding(self._slots.acquire):
            try:
                yield
            finally:
                self._slots.release()

    async def live(self, deadline: float = 2.0) -> bool:
        """True when the service answers `GET /health/live` within `deadline` seconds."""
        try:
            await self.call("GET", "/health/live", deadline=deadline)
        except JobqError:
            return False
        return True


def decode(reply: Reply, type_: type[T]) -> T:
    """Decode a JSON reply into `type_`; a reply of the wrong shape is a JobqError."""
    try:
        return msgspec.json.decode(reply.content, type=type_)
    except msgspec.DecodeError as exc:
        raise JobqError(f"unexpected reply from {reply.url}: {exc}") from exc
