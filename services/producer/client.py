"""The producer's typed client for the queue service."""

from __future__ import annotations

import uuid

import httpx
import msgspec

from common.contracts import (
    BatchSubmitRequest,
    BatchSubmitResponse,
    EnqueueRequest,
    JobList,
    JobView,
    RedriveRequest,
    RedriveResponse,
    SubmitJobResponse,
)
from common.http import call, decode


class QueueServiceClient:
    """Forwards validated requests to the queue service over a pooled httpx client.

    Errors are the `common.errors` classes the queue service answered with; an unreachable or
    slow queue service is ServiceUnavailable (503 with Retry-After to the caller).
    """

    def __init__(self, http: httpx.AsyncClient, timeout: float) -> None:
        self._http = http
        self._timeout = timeout

    async def submit(self, request: EnqueueRequest) -> tuple[SubmitJobResponse, bool]:
        """Create the job (or replay it); returns the reply and whether it was created (202)."""
        response = await call(self._http, "POST", "/jobs", request, read_timeout=self._timeout)
        return decode(response, SubmitJobResponse), response.status_code == 202

    async def submit_batch(self, requests: list[EnqueueRequest]) -> BatchSubmitResponse:
        """Create many jobs in one call; results are indexed by position in `requests`."""
        body = BatchSubmitRequest(jobs=[msgspec.to_builtins(r) for r in requests])
        response = await call(
            self._http, "POST", "/jobs/batch", body, read_timeout=self._timeout * 2
        )
        return decode(response, BatchSubmitResponse)

    async def list_jobs(self, params: dict[str, str | int]) -> JobList:
        """One page of `GET /jobs` with the given (already validated) query parameters."""
        response = await call(self._http, "GET", "/jobs", read_timeout=self._timeout, params=params)
        return decode(response, JobList)

    async def get(self, job_id: uuid.UUID) -> JobView:
        """The job's view; raises JobNotFound."""
        response = await call(self._http, "GET", f"/jobs/{job_id}", read_timeout=self._timeout)
        return decode(response, JobView)

    async def act(self, job_id: uuid.UUID, action: str) -> JobView:
        """`POST /jobs/{id}/{action}` (`cancel` or `retry`) on the queue service."""
        path = f"/jobs/{job_id}/{action}"
        response = await call(self._http, "POST", path, read_timeout=self._timeout)
        return decode(response, JobView)

    async def redrive(self, request: RedriveRequest) -> RedriveResponse:
        """Move dead-lettered jobs back to PENDING. A large redrive runs in many batches, so it
        gets a longer timeout (60 s) than single-job calls."""
        response = await call(
            self._http, "POST", "/dead-letter/redrive", request, read_timeout=60.0
        )
        return decode(response, RedriveResponse)

    async def live(self) -> bool:
        """True when the queue service answers its liveness probe within 2 s."""
        try:
            return (await self._http.get("/health/live", timeout=2.0)).is_success
        except httpx.HTTPError:
            return False
