"""The worker's typed client for the queue service's worker endpoints."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from common.contracts import (
    AckRequest,
    CancelledRequest,
    ClaimRequest,
    ClaimResponse,
    FailRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    JobMessage,
    JobView,
    ReleaseReason,
)
from common.http import call, decode


class QueueClient:
    """Claims and settles jobs over HTTP. Errors are `common.errors` classes
    (StaleReceiptHandle for a lost lease, ServiceUnavailable when the queue is unreachable)."""

    def __init__(self, http: httpx.AsyncClient, worker: str) -> None:
        self._http = http
        self._worker = worker

    async def claim(
        self,
        queues: list[str],
        max_jobs: int,
        wait_seconds: float,
        visibility_timeout: int | None = None,
    ) -> list[JobMessage]:
        """Long-poll for up to `max_jobs` jobs; [] when none arrived within `wait_seconds`.

        The read timeout is set above the wait, so the server, not the client, ends the poll.
        """
        request = ClaimRequest(
            worker=self._worker,
            queues=queues,
            max=max_jobs,
            wait_seconds=wait_seconds,
            visibility_timeout=visibility_timeout,
        )
        response = await call(
            self._http, "POST", "/jobs/next", request, read_timeout=wait_seconds + 10.0
        )
        if response.status_code == 204:
            return []
        return decode(response, ClaimResponse).jobs

    async def ack(self, job_id: uuid.UUID, receipt_handle: uuid.UUID, result: Any) -> JobView:
        """Complete the job."""
        body = AckRequest(receipt_handle=receipt_handle, result=result)
        return decode(await call(self._http, "POST", f"/jobs/{job_id}/ack", body), JobView)

    async def fail(
        self,
        job_id: uuid.UUID,
        receipt_handle: uuid.UUID,
        error: str,
        *,
        retryable: bool = True,
        retry_after: float | None = None,
    ) -> JobView:
        """Report a failed attempt (retried with backoff unless not retryable)."""
        body = FailRequest(
            receipt_handle=receipt_handle,
            error=error,
            retryable=retryable,
            retry_after_seconds=retry_after,
        )
        return decode(await call(self._http, "POST", f"/jobs/{job_id}/fail", body), JobView)

    async def heartbeat(
        self,
        job_id: uuid.UUID,
        receipt_handle: uuid.UUID,
        visibility_timeout: int,
        reason: ReleaseReason | None = None,
    ) -> HeartbeatResponse:
        """Extend the lease to `visibility_timeout` seconds from now; 0 releases the job
        (`reason` says why, recorded in the job's errors)."""
        body = HeartbeatRequest(
            receipt_handle=receipt_handle, visibility_timeout=visibility_timeout, reason=reason
        )
        response = await call(self._http, "POST", f"/jobs/{job_id}/heartbeat", body)
        return decode(response, HeartbeatResponse)

    async def cancelled(self, job_id: uuid.UUID, receipt_handle: uuid.UUID) -> JobView:
        """Confirm the job was stopped after a cancel request."""
        body = CancelledRequest(receipt_handle=receipt_handle)
        return decode(await call(self._http, "POST", f"/jobs/{job_id}/cancelled", body), JobView)
