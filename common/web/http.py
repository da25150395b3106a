"""Typed HTTP calls between jobq services, mapping problem details back to `JobqError`s.

The producer and the workers talk to the queue service through `ServiceClient`, a pooled
aiohttp session: its cost per request stays flat however many connections the pool holds (an
httpx pool re-checks every pooled connection on each request, which made a worker with 64
slots slower than one with 16; see docs/architecture.md#performance).

Every call has one total deadline, covering the wait for a pooled connection, connecting,
sending and reading; a call that cannot finish in time is ServiceUnavailable, or OutcomeUnknown
once its request was sent (the service may have applied it). A call may carry its deadline to
the service (`X-Jobq-Deadline`), which then refuses to begin work its caller gave up on. Every
jobq call is safe to repeat (submits carry their job id, settles are fenced and idempotent),
so a call whose pooled connection turns out to be dead, or whose connection attempt is
refused, is sent again within that deadline. Idle pooled connections are given up after
`common.contracts.CLIENT_IDLE_SECONDS`, well before a jobq server closes them, so a request is
not sent on a connection that is being closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import msgspec

from common.contracts import CLIENT_IDLE_SECONDS
from common.errors import (
    InvalidInput,
    JobqError,
    OutcomeUnknown,
    ServiceUnavailable,
    from_problem,
)
from common.logging import RepeatedEvents
from common.web.pools import PoolMetrics

Params = dict[str, str | int] | list[tuple[str, str | int]]
"""A query string: a mapping, or pairs for a repeated parameter (`queue=a&queue=b`)."""

T = TypeVar("T")
logger = logging.getLogger(__name__)

_JSON = {"Content-Type": "application/json"}
QUEUE_SERVICE_CONNECTIONS = 100
"""Connections a producer or a worker opens to the queue service at most."""
_CONNECT_TIMEOUT = 3.0
"""Seconds one TCP connection attempt may take."""
_RETRY_PAUSE = 0.1
"""Seconds before sending again after a refused connection (doubling per attempt)."""
STARTUP_GRACE_SECONDS = 30.0
"""How long a client that has never had an answer logs its failures at INFO: services start
in any order (`make run`, compose), so a peer not listening yet is not worth a warning."""
DEADLINE_HEADER = "X-Jobq-Deadline"
"""The caller's deadline, in seconds since the Unix epoch (a decimal number): an absolute time,
so a request that sat in a stopped server's socket still reads as late when it is finally
read (a relative budget would start afresh). Services' clocks must agree (NTP)."""


def parse_deadline(value: str | None) -> float | None:
    """The `X-Jobq-Deadline` header's epoch time (None when absent). Raises InvalidInput
    (pointer `header:X-Jobq-Deadline`) unless it is a plain positive decimal number."""
    if value is None:
        return None
    text = value.strip()
    try:
        deadline = float(text)
    except ValueError:
        deadline = math.nan
    if not text.replace(".", "", 1).isdigit() or not (0 < deadline < math.inf):
        raise InvalidInput(
            f"{DEADLINE_HEADER} must be a positive number of seconds since the Unix epoch",
            errors=[{"pointer": f"header:{DEADLINE_HEADER}", "detail": "not an epoch time"}],
        )
    return deadline


class _Delivery:
    """Whether any attempt of one call sent its request (set by aiohttp's tracing)."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


async def _headers_sent(_: Any, context: Any, __: Any) -> None:
    delivery = context.trace_request_ctx
    if isinstance(delivery, _Delivery):
        delivery.sent = True


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
    connection is tried again within it; `max_connections` bounds the pool. With
    `track_delivery`, a call that fails after its request was sent is OutcomeUnknown rather
    than ServiceUnavailable (aiohttp's request tracing tells; it costs every call a few
    callbacks, so only callers that answer differently, the producer, turn it on). Use it as an
    async context manager, or call `aclose()`.

    Failures are logged (`upstream_unavailable`) once per kind and then folded: at INFO while
    the client has never had an answer and is younger than `STARTUP_GRACE_SECONDS` (its peer
    may still be starting), at WARNING after that.
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
        track_delivery: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._track_delivery = track_delivery
        self._metrics = metrics
        # Calls take a slot before a connection, so waiting for the pool is visible (metrics)
        # and counted in the call's deadline.
        self._slots = asyncio.Semaphore(max_connections)
        self._timeout = timeout
        self._connect_retries = connect_retries
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._failures = RepeatedEvents()
        self._created = time.monotonic()
        self._answered = False

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            tracing = aiohttp.TraceConfig()
            tracing.on_request_headers_sent.append(_headers_sent)
            self._session = aiohttp.ClientSession(
                trace_configs=[tracing] if self._track_delivery else None,
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
        params: Params | None = None,
        carry_deadline: bool = False,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """Send one request (body encoded with msgspec) and return its 2xx reply.

        `deadline` (seconds, default the client's timeout) bounds the whole call, retries
        included; with `carry_deadline` it is sent along as `X-Jobq-Deadline` (an epoch time).
        `headers` are sent with this call only.
        Raises the `JobqError` a problem-details reply describes; ServiceUnavailable when
        the service cannot be reached or does not answer in time before the request was sent;
        OutcomeUnknown when it was sent and no answer came (timed out, or the connection
        closed before the reply), since the service may have applied it.
        """
        session = self._open()
        content = None if body is None else msgspec.json.encode(body)
        url = self.base_url + path
        attempt = 0
        budget = self._timeout if deadline is None else deadline
        sent = dict(_JSON) if content is not None else {}
        if headers:
            sent.update(headers)
        if carry_deadline:
            sent[DEADLINE_HEADER] = f"{time.time() + budget:.3f}"
        delivery = _Delivery()
        try:
            async with asyncio.timeout(budget), self._slot():
                while True:
                    try:
                        async with session.request(
                            method,
                            url,
                            data=content,
                            headers=sent or None,
                            params=params,
                            trace_request_ctx=delivery,
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
            # Folded per kind: while a service is down every call fails the same way. Until
            # the first answer, and for STARTUP_GRACE_SECONDS, the peer may still be starting.
            starting = not self._answered and (
                time.monotonic() - self._created < STARTUP_GRACE_SECONDS
            )
            self._failures.log(
                logger,
                logging.INFO if starting else logging.WARNING,
                f"starting:{type(exc).__name__}" if starting else type(exc).__name__,
                "%s %s failed: %s",
                method,
                url,
                type(exc).__name__,
                extra={"event": "upstream_unavailable"},
            )
            if delivery.sent:
                raise OutcomeUnknown(
                    "a jobq service did not answer a request it received; it may have been applied"
                ) from exc
            raise ServiceUnavailable("a jobq service is unreachable; retry shortly") from exc
        self._answered = True
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
