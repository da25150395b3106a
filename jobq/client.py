"""`Client`: a small synchronous client for the producer API, built on `httpx.Client`."""

from __future__ import annotations

import uuid
from types import TracebackType
from typing import Any, TypeVar, Unpack

import httpx
import msgspec

from common.contracts import (
    CLIENT_IDLE_SECONDS,
    BatchSubmitRequest,
    BatchSubmitResponse,
    JobList,
    JobStatus,
    JobView,
    ListView,
    RedriveRequest,
    RedriveResponse,
    SubmitJobRequest,
    SubmitJobResponse,
)
from common.errors import JobqError, ServiceUnavailable, from_problem
from jobq.request import SubmitOptions, build_request

T = TypeVar("T")

_CLOSED_UNANSWERED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""What httpx raises when the server closed the connection instead of answering."""


class Client:
    """Talk to a jobq producer: `Client("http://127.0.0.1:8080", api_key=…)`.

    Requests that fail to connect are retried by httpx's transport (`retries`). A request
    whose connection the server closed before any response arrived (an idle keep-alive
    connection closing just as it was sent) is sent once more on a fresh connection when that
    is safe: reads, and submits whose every job carries an idempotency key (RFC 9110 §9.2.2:
    only idempotent requests may be retried automatically). Idle connections are given up
    after `common.contracts.CLIENT_IDLE_SECONDS`, before the producer closes them. Every method
    raises the `jobq.errors` class the producer answered with (InvalidInput,
    IdempotencyConflict, JobNotFound, Unauthorized, ServiceUnavailable, …). Timeouts are in
    seconds. Use it as a context manager, or call `close()`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=base_url,
            headers=headers,
            timeout=timeout,
            transport=transport
            or httpx.HTTPTransport(
                retries=retries, limits=httpx.Limits(keepalive_expiry=CLIENT_IDLE_SECONDS)
            ),
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def submit(
        self, task_type: str, payload: dict[str, Any], **options: Unpack[SubmitOptions]
    ) -> SubmitJobResponse:
        """Submit one job; a replay (same idempotency key and request) returns the same job.
        Bad input raises InvalidInput/PayloadTooLarge before anything is sent."""
        request = build_request(task_type, payload, **options)
        replayable = request.idempotency_key is not None
        return self._call("POST", "/jobs", SubmitJobResponse, request, replayable=replayable)

    def submit_batch(self, requests: list[SubmitJobRequest]) -> BatchSubmitResponse:
        """Submit up to 500 jobs; each gets its own result (202, 200, 409, 413 or 422)."""
        body = BatchSubmitRequest(jobs=[msgspec.Raw(msgspec.json.encode(r)) for r in requests])
        replayable = all(r.idempotency_key is not None for r in requests)
        return self._call("POST", "/jobs/batch", BatchSubmitResponse, body, replayable=replayable)

    def get(self, job_id: uuid.UUID | str) -> JobView:
        """The job's current view."""
        return self._call("GET", f"/jobs/{job_id}", JobView)

    def list(
        self,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task_type: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        view: ListView = "summary",
    ) -> JobList:
        """One page of jobs, newest first (admin key); pass `next_cursor` for the next page.
        Jobs come without payload, errors and result unless `view="full"`; a page stops at
        `limit` jobs or 1 MiB of JSON."""
        params = {"status": status, "queue": queue, "taskType": task_type, "cursor": cursor}
        if view != "summary":
            params["view"] = view
        query = {k: v for k, v in params.items() if v is not None} | {"limit": limit}
        return self._call("GET", "/jobs", JobList, params=query)

    def cancel(self, job_id: uuid.UUID | str) -> JobView:
        """Cancel a job (admin key); a running one is stopped by its worker."""
        return self._call("POST", f"/jobs/{job_id}/cancel", JobView)

    def retry(self, job_id: uuid.UUID | str) -> JobView:
        """Run a dead-lettered or cancelled job again (admin key)."""
        return self._call("POST", f"/jobs/{job_id}/retry", JobView)

    def redrive(
        self, *, queue: str | None = None, task_type: str | None = None, limit: int | None = None
    ) -> int:
        """Move dead-lettered jobs back to PENDING (admin key); returns how many moved."""
        body = RedriveRequest(queue=queue, task_type=task_type, limit=limit)
        return self._call("POST", "/dead-letter/redrive", RedriveResponse, body).moved

    def _call(
        self,
        method: str,
        path: str,
        type_: type[T],
        body: Any = None,
        params: dict[str, Any] | None = None,
        *,
        replayable: bool | None = None,
    ) -> T:
        """Send one request and decode its reply; `replayable` (default: reads only) says
        whether it may be sent again after its connection closed without an answer."""
        content = None if body is None else msgspec.json.encode(body)
        headers = {"Content-Type": "application/json"} if content is not None else None
        again = method == "GET" if replayable is None else replayable
        while True:
            try:
                response = self._http.request(
                    method, path, content=content, headers=headers, params=params
                )
                break
            except _CLOSED_UNANSWERED as exc:
                if not again:
                    raise ServiceUnavailable(f"jobq unreachable: {type(exc).__name__}") from exc
                again = False
            except httpx.TransportError as exc:
                raise ServiceUnavailable(f"jobq unreachable: {type(exc).__name__}") from exc
        if not response.is_success:
            try:
                problem = response.json()
            except ValueError:
                problem = None
            raise from_problem(problem, response.status_code)
        try:
            return msgspec.json.decode(response.content, type=type_)
        except msgspec.DecodeError as exc:
            raise JobqError(f"unexpected reply from {path}: {exc}") from exc
