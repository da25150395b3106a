"""The SQS endpoint's typed client for the queue service: its SQS queue registry
(`/sqs/...`), submits, claims, acks, lease changes and depth, over a pooled `ServiceClient`.

Queues are looked up on almost every SQS request, so a looked-up queue is reused for
`cache_ttl` seconds (SQS itself says attribute changes take up to 60 s to apply); this
endpoint's own changes replace the cached entry at once.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import msgspec

from common.contracts import (
    AckEntry,
    AckResult,
    BatchAckRequest,
    BatchAckResponse,
    BatchHeartbeatRequest,
    BatchHeartbeatResponse,
    BatchSubmitRequest,
    BatchSubmitResponse,
    ClaimRequest,
    ClaimResponse,
    EnqueueRequest,
    HeartbeatEntry,
    HeartbeatResult,
    QueuesResponse,
)
from common.errors import JobqError
from common.sqs_registry import (
    SQS_LIST_MAX,
    SqsAttributesRequest,
    SqsCountReply,
    SqsMoveRequest,
    SqsQueue,
    SqsQueueList,
    SqsQueueReply,
    SqsQueueRequest,
)
from common.web.http import ServiceClient, decode

_READ_MARGIN = 10.0
"""Seconds a claim's deadline exceeds its long-poll wait, so the server ends the poll."""


class QueueServiceClient:
    """Calls the queue service; errors are the `common.errors` classes it answered with
    (QueueNotFound, QueueExists, ServiceUnavailable, ...). Claims go over `polls`, a pool of
    their own, so many long polls never hold up other calls (`http`). `timeout` is one call's
    deadline (seconds), `cache_ttl` how long a looked-up queue is reused."""

    def __init__(
        self, http: ServiceClient, polls: ServiceClient, timeout: float, cache_ttl: float
    ) -> None:
        self._http = http
        self._polls = polls
        self._timeout = timeout
        self._ttl = cache_ttl
        self._cache: dict[tuple[str, str], tuple[float, SqsQueue]] = {}
        self._tenants: dict[str, tuple[float, list[SqsQueue]]] = {}

    async def readiness(self) -> bool:
        """Whether the queue service answers (and takes our token)."""
        try:
            await self._http.call("GET", "/sqs/queues", params={"limit": 1}, deadline=2.0)
        except JobqError:
            return False
        return True

    def _remember(self, queue: SqsQueue) -> SqsQueue:
        self._tenants.pop(queue.tenant, None)
        self._cache[(queue.tenant, queue.name)] = (time.monotonic() + self._ttl, queue)
        return queue

    async def declare(
        self, tenant: str, name: str, queue: str, attributes: dict[str, str]
    ) -> tuple[SqsQueue, bool]:
        """Declare (or replay the declaration of) a queue; the queue and whether it is new."""
        body = SqsQueueRequest(tenant=tenant, name=name, queue=queue, attributes=attributes)
        reply = decode(await self._http.call("POST", "/sqs/queues", body), SqsQueueReply)
        return self._remember(reply.queue), reply.created

    async def get(self, tenant: str, name: str, *, fresh: bool = False) -> SqsQueue:
        """The queue (from the cache unless `fresh` or expired); raises QueueNotFound."""
        cached = self._cache.get((tenant, name))
        if cached is not None and not fresh and cached[0] > time.monotonic():
            return cached[1]
        try:
            reply = await self._http.call("GET", _path(tenant, name), deadline=self._timeout)
        except JobqError:
            self._cache.pop((tenant, name), None)
            raise
        return self._remember(decode(reply, SqsQueue))

    async def list_queues(
        self, tenant: str | None, prefix: str, after: str | None, limit: int
    ) -> SqsQueueList:
        """One page of queues by name (`tenant` None: every tenant's)."""
        params: dict[str, str | int] = {"prefix": prefix, "limit": limit}
        if tenant is not None:
            params["tenant"] = tenant
        if after is not None:
            params["after"] = after
        reply = await self._http.call("GET", "/sqs/queues", params=params, deadline=self._timeout)
        return decode(reply, SqsQueueList)

    async def all_queues(self, tenant: str) -> list[SqsQueue]:
        """Every queue of `tenant` (reused for the cache's lifetime; a dead-letter queue's
        sources are found among them)."""
        cached = self._tenants.get(tenant)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        found: list[SqsQueue] = []
        after: str | None = None
        while True:
            page = await self.list_queues(tenant, "", after, SQS_LIST_MAX)
            found.extend(page.items)
            if page.next_name is None:
                break
            after = page.next_name
        self._tenants[tenant] = (time.monotonic() + self._ttl, found)
        return found

    async def set_attributes(self, tenant: str, name: str, attributes: dict[str, str]) -> SqsQueue:
        """Set attributes (an empty value removes one); the queue after."""
        body = SqsAttributesRequest(attributes=attributes)
        reply = await self._http.call("PATCH", _path(tenant, name), body, deadline=self._timeout)
        return self._remember(decode(reply, SqsQueue))

    async def delete(self, tenant: str, name: str) -> int:
        """Forget the queue and delete its unfinished jobs; how many jobs went."""
        self._cache.pop((tenant, name), None)
        self._tenants.pop(tenant, None)
        reply = await self._http.call("DELETE", _path(tenant, name), deadline=self._timeout)
        return decode(reply, SqsCountReply).count

    async def purge(self, tenant: str, name: str) -> int:
        """Delete the queue's unfinished jobs; how many."""
        reply = await self._http.call("POST", _path(tenant, name) + "/purge", deadline=60.0)
        return decode(reply, SqsCountReply).count

    async def move(self, request: SqsMoveRequest) -> int:
        """Move jobs between queues (`SqsMoveRequest`); how many moved."""
        reply = await self._http.call("POST", "/sqs/move", request, deadline=60.0)
        return decode(reply, SqsCountReply).count

    async def submit_batch(self, requests: list[EnqueueRequest]) -> BatchSubmitResponse:
        """Create jobs in one call; results by position in `requests`."""
        body = BatchSubmitRequest(jobs=[msgspec.Raw(msgspec.json.encode(r)) for r in requests])
        reply = await self._http.call(
            "POST", "/jobs/batch", body, deadline=self._timeout, carry_deadline=True
        )
        return decode(reply, BatchSubmitResponse)

    async def claim(self, request: ClaimRequest) -> ClaimResponse:
        """Long-poll for jobs; none when none arrived within the wait."""
        reply = await self._polls.call(
            "POST", "/jobs/next", request, deadline=request.wait_seconds + _READ_MARGIN
        )
        if reply.status == 204:
            return ClaimResponse(jobs=[])
        return decode(reply, ClaimResponse)

    async def ack_many(self, entries: list[AckEntry]) -> list[AckResult]:
        """Complete jobs; one result per entry (200, 404, 409), in order."""
        body = BatchAckRequest(entries=entries)
        reply = await self._http.call("POST", "/jobs/ack", body, deadline=self._timeout)
        return decode(reply, BatchAckResponse).results

    async def heartbeat_many(self, entries: list[HeartbeatEntry]) -> list[HeartbeatResult]:
        """Extend (0: release) leases; one result per entry, in order."""
        body = BatchHeartbeatRequest(entries=entries)
        reply = await self._http.call("POST", "/jobs/heartbeat", body, deadline=self._timeout)
        return decode(reply, BatchHeartbeatResponse).results

    async def depth(self) -> QueuesResponse:
        """Per-queue counts (`GET /queues`)."""
        reply = await self._http.call("GET", "/queues", deadline=self._timeout)
        return decode(reply, QueuesResponse)


def _path(tenant: str, name: str) -> str:
    return f"/sqs/queues/{quote(tenant, safe='')}/{quote(name, safe='')}"
