"""The worker's typed client for the queue service's worker endpoints.

Settles travel in batches (`POST /jobs/ack`, `/jobs/fail`, `/jobs/heartbeat`): `Settler`
coalesces the reports of concurrently finishing jobs into one request per kind, and answers
each job only after the request that carried its report returned (docs/architecture.md#batching).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from common.coalesce import Coalescer
from common.contracts import (
    CLAIM_MAX,
    AckEntry,
    AckResult,
    BatchAckRequest,
    BatchAckResponse,
    BatchFailRequest,
    BatchFailResponse,
    BatchHeartbeatRequest,
    BatchHeartbeatResponse,
    CancelledRequest,
    ClaimRequest,
    ClaimResponse,
    FailEntry,
    FailResult,
    HeartbeatEntry,
    HeartbeatResult,
    JobView,
)
from common.errors import JobNotFound, JobqError, StaleReceiptHandle
from common.web.http import ServiceClient, decode

_READ_MARGIN = 10.0
"""Seconds a claim's deadline exceeds its long-poll wait, so the server ends the poll."""


class QueueClient:
    """Claims and settles jobs over HTTP. Errors are `common.errors` classes
    (ServiceUnavailable when the queue service is unreachable or answers 5xx)."""

    def __init__(self, http: ServiceClient, worker: str, slots: int | None = None) -> None:
        self._http = http
        self._worker = worker
        self._slots = slots

    async def claim(
        self,
        queues: list[str],
        max_jobs: int,
        wait_seconds: float,
        visibility_timeout: int | None = None,
        acks: list[AckEntry] | None = None,
    ) -> ClaimResponse:
        """Long-poll for up to `max_jobs` jobs, completing `acks` first in the same statement;
        no jobs when none arrived within `wait_seconds` (a claim carrying acks does not wait).

        The call's deadline is set above the wait, so the server, not the client, ends the poll.
        """
        request = ClaimRequest(
            worker=self._worker,
            queues=queues,
            max=max_jobs,
            wait_seconds=wait_seconds,
            visibility_timeout=visibility_timeout,
            acks=acks or [],
            slots=self._slots,
            attribute_names=["queue", "tenant"],  # the attempt span's attributes
        )
        reply = await self._http.call(
            "POST", "/jobs/next", request, deadline=wait_seconds + _READ_MARGIN
        )
        if reply.status == 204:
            return ClaimResponse(jobs=[])
        return decode(reply, ClaimResponse)

    async def ack_many(self, entries: list[AckEntry]) -> list[AckResult]:
        """Complete jobs in one request; one result per entry, in order."""
        reply = await self._http.call("POST", "/jobs/ack", BatchAckRequest(entries=entries))
        return decode(reply, BatchAckResponse).results

    async def fail_many(self, entries: list[FailEntry]) -> list[FailResult]:
        """Report failed attempts in one request; one result per entry, in order."""
        reply = await self._http.call("POST", "/jobs/fail", BatchFailRequest(entries=entries))
        return decode(reply, BatchFailResponse).results

    async def heartbeat_many(self, entries: list[HeartbeatEntry]) -> list[HeartbeatResult]:
        """Extend (or, with 0, release) leases in one request; one result per entry."""
        body = BatchHeartbeatRequest(entries=entries)
        reply = await self._http.call("POST", "/jobs/heartbeat", body)
        return decode(reply, BatchHeartbeatResponse).results

    async def cancelled(self, job_id: uuid.UUID, receipt_handle: uuid.UUID) -> JobView:
        """Confirm the job was stopped after a cancel request."""
        body = CancelledRequest(receipt_handle=receipt_handle)
        return decode(await self._http.call("POST", f"/jobs/{job_id}/cancelled", body), JobView)

    async def live(self) -> bool:
        """True when the queue service answers its liveness probe."""
        return await self._http.live()


def check_status(job_id: uuid.UUID, status: int) -> None:
    """Raise for a settle's per-job status: StaleReceiptHandle for 409 (the lease was lost),
    JobNotFound for 404; return for 200."""
    if status == 409:
        raise StaleReceiptHandle(f"the lease on job {job_id} was lost")
    if status == 404:
        raise JobNotFound(f"no job has id {job_id}")


AckAnswer = Callable[[AckResult | BaseException | None], None]
"""Called once with a carried ack's answer: the claim's result for it, the claim's error, or
None when no claim took it (a long poll began, or shutdown) and it must be sent on its own."""

Carried = tuple[AckEntry, AckAnswer]
"""An ack waiting for a claim to carry it, and what to call with its answer."""

HOLD_MAX = 0.25
"""Seconds an ack may wait for a claim to carry it (a claim in flight may be a long poll);
older ones are sent on their own."""


class Settler:
    """One worker's settle reports, coalesced: concurrent acks share one `POST /jobs/ack`
    (likewise fails and heartbeats), at most `CLAIM_MAX` entries each.

    While `carry_acks` is on, acks wait instead, and the worker takes them (`take_acks`) into
    its next claim, which completes them in the same statement: one round trip per cycle
    instead of two. Acks that waited `HOLD_MAX` seconds (the claim in flight turned out to be a
    long poll) are sent on their own (`send_stale`). `carry` holds an ack with a callback for
    its answer, so the job's task need not wait for it; `ack` sends one in a batch of acks and
    waits for its answer.

    Every method answers for its own job once the request that carried it returned: raises
    StaleReceiptHandle when the lease was lost (409), JobNotFound (404), or the error of the
    whole request (ServiceUnavailable when the queue service is unreachable).
    """

    def __init__(self, client: QueueClient) -> None:
        self._client = client
        self._acks: Coalescer[AckEntry, AckResult] = Coalescer(
            client.ack_many, max_batch=CLAIM_MAX, max_in_flight=2
        )
        self._fails: Coalescer[FailEntry, FailResult] = Coalescer(
            client.fail_many, max_batch=CLAIM_MAX
        )
        self._heartbeats: Coalescer[HeartbeatEntry, HeartbeatResult] = Coalescer(
            client.heartbeat_many, max_batch=CLAIM_MAX
        )
        self._carried: list[Carried] = []
        self._held_since = 0.0
        self._carry = False

    @property
    def carry_acks(self) -> bool:
        """Whether new acks wait for the next claim."""
        return self._carry

    @carry_acks.setter
    def carry_acks(self, value: bool) -> None:
        self._carry = value
        if not value:
            self._send_held()

    def _send_held(self) -> None:
        held, self._carried = self._carried, []
        for _, answer in held:
            answer(None)

    def send_stale(self) -> None:
        """Send waiting acks on their own when the oldest waited `HOLD_MAX` seconds."""
        if self._carried and time.monotonic() - self._held_since >= HOLD_MAX:
            self._send_held()

    def take_acks(self) -> list[Carried]:
        """Remove and return up to `CLAIM_MAX` waiting acks for a claim to carry; answer them
        with `answer_acks`."""
        taken, self._carried = self._carried[:CLAIM_MAX], self._carried[CLAIM_MAX:]
        self._held_since = time.monotonic()
        return taken

    @staticmethod
    def answer_acks(taken: list[Carried], results: list[AckResult] | BaseException) -> None:
        """Answer acks a claim carried: with the claim's per-ack results, or its error."""
        if isinstance(results, BaseException):
            for _, answer in taken:
                answer(results)
            return
        by_id = {result.id: result for result in results}
        for entry, answer in taken:
            result = by_id.get(entry.id)
            answer(result or JobqError(f"the claim answered no ack for job {entry.id}"))

    def carry(self, entry: AckEntry, answer: AckAnswer) -> bool:
        """Hold one job's ack for the next claim, `answer` to be called once with what became
        of it (`AckAnswer`); False, holding nothing, when acks are not carried now or
        `CLAIM_MAX` already wait: then send it with `ack`."""
        if not self._carry or len(self._carried) >= CLAIM_MAX:
            return False
        if not self._carried:
            self._held_since = time.monotonic()
        self._carried.append((entry, answer))
        return True

    async def ack(self, entry: AckEntry) -> AckResult:
        """Complete one job in a batch of acks (`POST /jobs/ack`), never held for a claim."""
        result = await self._acks.submit(entry)
        check_status(entry.id, result.status)
        return result

    async def fail(self, entry: FailEntry) -> FailResult:
        """Report one failed attempt (batched); the result says the job's status now."""
        result = await self._fails.submit(entry)
        check_status(entry.id, result.status)
        return result

    async def heartbeat(self, entry: HeartbeatEntry) -> HeartbeatResult:
        """Extend or release one lease (batched); the result carries any cancel request."""
        result = await self._heartbeats.submit(entry)
        check_status(entry.id, result.status)
        return result

    async def cancelled(self, job_id: uuid.UUID, receipt_handle: uuid.UUID) -> JobView:
        """Confirm a cooperative cancel (rare: not batched)."""
        return await self._client.cancelled(job_id, receipt_handle)

    async def aclose(self) -> None:
        """Send the acks still waiting and wait for the batches under way."""
        self.carry_acks = False
        for coalescer in (self._acks, self._fails, self._heartbeats):
            await coalescer.aclose()
