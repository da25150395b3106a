"""One exception family for every jobq failure, with its HTTP status and problem type.

The queue service raises these, maps them once to RFC 9457 problem details, and the HTTP
clients in the producer and worker map problem details back to the same classes (`from_problem`).
"""

from __future__ import annotations

from typing import Any, ClassVar


class JobqError(Exception):
    """Base of every jobq error.

    Attributes: `status` (HTTP status), `slug` (the last part of the problem `type` URI),
    `title` (short, constant summary) and `errors` (a list of `{"pointer", "detail"}` dicts that
    locate each bad input in the request body, RFC 6901 JSON pointers).
    """

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal-error"
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str = "", *, errors: list[dict[str, str]] | None = None) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.errors = errors or []

    @property
    def type_uri(self) -> str:
        """The problem `type` URI, e.g. `urn:jobq:problem:stale-receipt-handle`."""
        return f"urn:jobq:problem:{self.slug}"

    def to_problem(self, instance: str | None = None) -> dict[str, Any]:
        """Return the RFC 9457 body: `type`, `title`, `status`, `detail`, `instance`, `errors`."""
        body: dict[str, Any] = {
            "type": self.type_uri,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        if self.errors:
            body["errors"] = self.errors
        return body


class InvalidInput(JobqError):
    """The request is well-formed JSON but breaks a bound (422)."""

    status = 422
    slug = "invalid-input"
    title = "Invalid input"


class MalformedRequest(JobqError):
    """The request body is not valid JSON or not the expected shape (400)."""

    status = 400
    slug = "malformed-request"
    title = "Malformed request"


class PayloadTooLarge(JobqError):
    """The request body or payload exceeds its size bound (413)."""

    status = 413
    slug = "payload-too-large"
    title = "Payload too large"


class Unauthorized(JobqError):
    """No valid credentials (401): a missing, malformed or unknown bearer token."""

    status = 401
    slug = "unauthorized"
    title = "Unauthorized"


class Forbidden(JobqError):
    """The credentials are valid but their role does not allow this operation (403)."""

    status = 403
    slug = "forbidden"
    title = "Forbidden"


class JobNotFound(JobqError):
    """No job has this id (404)."""

    status = 404
    slug = "job-not-found"
    title = "Job not found"


class QueueNotFound(JobqError):
    """No queue of that name has a job or was ever paused (404)."""

    status = 404
    slug = "queue-not-found"
    title = "Queue not found"


class StaleReceiptHandle(JobqError):
    """The receipt handle is not the job's latest: the lease was lost (409).

    As in SQS, every claim mints a new receipt handle; only the latest may settle the job.
    """

    status = 409
    slug = "stale-receipt-handle"
    title = "Stale receipt handle"


class QueueExists(JobqError):
    """A queue of that name exists with other settings, or the name is taken (409)."""

    status = 409
    slug = "queue-exists"
    title = "Queue exists"


class IdempotencyConflict(JobqError):
    """The idempotency key is already used by a job created from a different request (409)."""

    status = 409
    slug = "idempotency-conflict"
    title = "Idempotency key reused with a different request"


class InvalidState(JobqError):
    """The job's state does not allow this operation (409), e.g. retrying a live job."""

    status = 409
    slug = "invalid-state"
    title = "Operation not allowed in the job's state"


class RateLimited(JobqError):
    """Too many requests (429): the caller's tenant used up its rate; `retry_after` seconds
    until the window resets, sent as `Retry-After`."""

    status = 429
    slug = "rate-limited"
    title = "Too many requests"

    def __init__(
        self,
        detail: str = "",
        *,
        errors: list[dict[str, str]] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(detail, errors=errors)
        self.retry_after = retry_after


class ServiceUnavailable(JobqError):
    """A dependency (the queue service, PostgreSQL) cannot be reached right now (503).
    `retry_after`: the seconds a reply's `Retry-After` asked for, when a client read one."""

    status = 503
    slug = "service-unavailable"
    title = "Service unavailable"

    def __init__(
        self,
        detail: str = "",
        *,
        errors: list[dict[str, str]] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(detail, errors=errors)
        self.retry_after = retry_after


class UpstreamMisconfigured(ServiceUnavailable):
    """A jobq service refused this service's own credentials (503): an operator must fix the
    configuration (`QUEUE_INTERNAL_TOKEN`); callers are told no more than that."""

    slug = "upstream-misconfigured"
    title = "Upstream misconfigured"


class DeadlineExceeded(ServiceUnavailable):
    """The caller's deadline (`X-Jobq-Deadline`) had passed before the work began (503): the
    caller has given up, so nothing was done; retrying is safe."""

    slug = "deadline-exceeded"
    title = "Deadline exceeded"


class OutcomeUnknown(ServiceUnavailable):
    """A request was sent but its answer never came (504): it timed out while the upstream
    held it, or the reply was lost. It may have been applied.

    For a submit the producer gives the job id it minted (`job_id`, the problem's `jobId`) and
    the idempotency key if any (`idempotency_key`, `idempotencyKey`); for a batch, `jobs`
    (`[{"index", "jobId", "idempotencyKey"?}]`, the entries that were forwarded). `GET
    /jobs/{jobId}` tells whether the job exists; only a retry with the same idempotency key is
    sure not to create a second one (docs/architecture.md#idempotency).
    """

    status = 504
    slug = "outcome-unknown"
    title = "Outcome unknown"

    def __init__(
        self,
        detail: str = "",
        *,
        errors: list[dict[str, str]] | None = None,
        retry_after: float | None = None,
        job_id: str | None = None,
        idempotency_key: str | None = None,
        jobs: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(detail, errors=errors, retry_after=retry_after)
        self.job_id = job_id
        self.idempotency_key = idempotency_key
        self.jobs = jobs

    def to_problem(self, instance: str | None = None) -> dict[str, Any]:
        """The RFC 9457 body with the extension members `jobId`, `idempotencyKey` (when set)
        and `jobs` (a batch's forwarded entries)."""
        body = super().to_problem(instance)
        if self.job_id is not None:
            body["jobId"] = self.job_id
        if self.idempotency_key is not None:
            body["idempotencyKey"] = self.idempotency_key
        if self.jobs is not None:
            body["jobs"] = self.jobs
        return body


_BY_SLUG: dict[str, type[JobqError]] = {
    cls.slug: cls
    for cls in (
        JobqError,
        InvalidInput,
        MalformedRequest,
        PayloadTooLarge,
        Unauthorized,
        Forbidden,
        JobNotFound,
        QueueNotFound,
        QueueExists,
        StaleReceiptHandle,
        IdempotencyConflict,
        InvalidState,
        RateLimited,
        ServiceUnavailable,
        UpstreamMisconfigured,
        DeadlineExceeded,
        OutcomeUnknown,
    )
}


# For replies without a jobq problem type (a framework's `about:blank`, a proxy's HTML page).
_BY_STATUS: dict[int, type[JobqError]] = {
    400: MalformedRequest,
    401: Unauthorized,
    403: Forbidden,
    404: JobNotFound,
    413: PayloadTooLarge,
    422: InvalidInput,
    429: RateLimited,
    502: ServiceUnavailable,
    503: ServiceUnavailable,
    # A gateway's timeout: the request may have been applied upstream.
    504: OutcomeUnknown,
}


def from_problem(body: Any, status: int) -> JobqError:
    """Rebuild the `JobqError` a problem-details body describes.

    `body` is the decoded JSON (any shape is tolerated); unknown types become a plain
    `JobqError` carrying the detail. Used by the producer's and worker's HTTP clients.
    """
    if isinstance(body, dict):
        type_uri = str(body.get("type", ""))
        slug = type_uri.rsplit(":", 1)[-1]
        detail = str(body.get("detail", ""))
        errors = body.get("errors") if isinstance(body.get("errors"), list) else None
        cls = _BY_SLUG.get(slug) or _BY_STATUS.get(status)
        if cls is OutcomeUnknown:
            return _outcome_unknown(body, detail, errors)
        if cls is not None:
            return cls(detail, errors=errors)
        return JobqError(f"HTTP {status}: {detail or body.get('title', '')}")
    cls = _BY_STATUS.get(status)
    return cls() if cls is not None else JobqError(f"HTTP {status}")


def _outcome_unknown(
    body: dict[str, Any], detail: str, errors: list[dict[str, str]] | None
) -> OutcomeUnknown:
    """OutcomeUnknown with the extension members its body carries (ignored when malformed)."""
    job_id, key, jobs = body.get("jobId"), body.get("idempotencyKey"), body.get("jobs")
    return OutcomeUnknown(
        detail,
        errors=errors,
        job_id=job_id if isinstance(job_id, str) else None,
        idempotency_key=key if isinstance(key, str) else None,
        jobs=jobs if isinstance(jobs, list) else None,
    )
