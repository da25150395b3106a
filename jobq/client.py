"""`Client` and `AsyncClient`: small clients for the producer API, on `httpx.Client` and
`httpx.AsyncClient`, with the same methods, errors and retries (the requests are built once,
as `_Call`s, and sent by either).

Submits never duplicate through the client's own retries: every submit carries an idempotency
key (the caller's, or one minted per submit), and a submit answered 503, 504 or cut off is sent
again with that same key, so a retry of one that was in fact created is a replay
(docs/architecture.md#idempotency).
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar, Unpack

import httpx
import msgspec

from common.contracts import (
    CLIENT_IDLE_SECONDS,
    FINISHED_STATUSES,
    NAME_PATTERN,
    WAIT_SECONDS_MAX,
    BatchSubmitRequest,
    BatchSubmitResponse,
    JobList,
    JobStatus,
    JobView,
    ListView,
    QueuesResponse,
    QueueState,
    RedriveRequest,
    RedriveResponse,
    SubmitJobRequest,
    SubmitJobResponse,
)
from common.errors import (
    InvalidInput,
    JobqError,
    OutcomeUnknown,
    ServiceUnavailable,
    UpstreamMisconfigured,
    from_problem,
)
from common.operations import (
    BulkAction,
    BulkRequest,
    BulkResponse,
    PurgeRequest,
    PurgeResponse,
    SchedulesResponse,
    ThroughputResponse,
    WorkersResponse,
)
from jobq.request import SubmitOptions, build_request
from jobq.tracecontext import add_caller_context

T = TypeVar("T")

_RETRY_PAUSE = 0.5
"""Seconds before a submit's first retry (full jitter, doubling per retry)."""
_RETRY_PAUSE_MAX = 10.0
"""Seconds a submit waits before a retry at most, whatever `Retry-After` says."""
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport failures that happen before a request leaves: it cannot have been applied."""
_CLOSED_UNANSWERED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""What httpx raises when the server closed the connection instead of answering."""


def minted_key() -> str:
    """A fresh idempotency key for one submit (`jobq-client-<uuid4>`, 48 characters)."""
    return f"jobq-client-{uuid.uuid4()}"


MINTED_KEY_WINDOW = 3600
"""Seconds the queue service holds a key the client minted (`idempotencyWindowSeconds`),
unless the caller set a window: it only makes the client's own retries replays (a few of them,
seconds apart) and a follow-up of an `OutcomeUnknown`, so an hour (Cloud Tasks' shortest
deduplication window) keeps the key table at an hour of keyless submits, not
`QUEUE_IDEMPOTENCY_WINDOW`'s 7 days."""


def _retryable(exc: JobqError) -> bool:
    # 503s and 504s (the producer or the queue service could not answer now) and transport
    # failures; a misconfigured deployment will not heal by asking again.
    return isinstance(exc, ServiceUnavailable) and not isinstance(exc, UpstreamMisconfigured)


def _segment(name: str) -> str:
    """`name` as one URL path segment. Raises InvalidInput, sending nothing, unless it is a
    queue name (`NAME_PATTERN`): `..` or `a/b` would otherwise reach another route."""
    if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
        raise InvalidInput(
            f"{name!r} is not a queue name",
            errors=[{"pointer": "path:queue", "detail": "not a queue name"}],
        )
    return urllib.parse.quote(name, safe="")


_LIMIT_BOUNDS = {
    "concurrency": "concurrency",
    "tenant_concurrency": "tenantConcurrency",
    "rate": "rate",
    "burst": "burst",
    "tenant_rate": "tenantRate",
    "tenant_burst": "tenantBurst",
}
"""`Client.set_limits` bound names and their wire names."""


_DOC = """Talk to a jobq producer: `{name}("http://127.0.0.1:8080", api_key=…)`.

    Requests that fail to connect are retried by httpx's transport (`retries`). Submits carry
    an idempotency key (minted when the caller gives none) and are sent again, with the same
    key, up to `submit_retries` times when answered 503 or 504 or cut off, after a jittered
    pause (0.5 s doubling, or the `Retry-After` given, at most 10 s). A read whose connection
    the server closed before any response arrived (an idle keep-alive connection closing just
    as it was sent) is sent once more at once on a fresh connection (RFC 9110 §9.2.2: only
    idempotent requests are retried automatically); idle connections are given up after
    `common.contracts.CLIENT_IDLE_SECONDS`, before the producer closes them. Every method
    raises the `jobq.errors` class the producer answered with (InvalidInput, IdempotencyConflict,
    JobNotFound, Unauthorized, ServiceUnavailable, …); a submit whose outcome stayed unknown
    raises OutcomeUnknown (its `idempotency_key`, and `job_id` when the producer gave one).
    Timeouts are in seconds. Use it as {usage}, or call `{close}`.
    """


@dataclass(frozen=True, slots=True)
class _Call(Generic[T]):
    """One request of the producer API: `method`, `path`, the JSON `body` (None: none), the
    query `params`, the type its reply decodes to (`reply`), for a submit the idempotency
    key it carries (`key`, reported by OutcomeUnknown), and the seconds the producer may hold
    it on purpose (`held`, a waiting read's `waitSeconds`), added to the client's timeout."""

    method: str
    path: str
    reply: type[T]
    body: Any = None
    params: dict[str, Any] | None = None
    key: str | None = None
    held: float = 0


def _submit_call(
    task_type: str, payload: dict[str, Any], options: SubmitOptions
) -> _Call[SubmitJobResponse]:
    """`POST /jobs`, keyed (a key minted when `options` has none); raises InvalidInput or
    PayloadTooLarge for bad input, before anything is sent."""
    if options.get("idempotency_key") is None:
        options["idempotency_key"] = minted_key()
        if options.get("idempotency_window_seconds") is None:
            options["idempotency_window_seconds"] = MINTED_KEY_WINDOW
    request = build_request(task_type, payload, **options)
    return _Call("POST", "/jobs", SubmitJobResponse, request, key=request.idempotency_key)


def _batch_call(requests: list[SubmitJobRequest]) -> _Call[BatchSubmitResponse]:
    """`POST /jobs/batch`, every entry keyed (minted for those without a key)."""
    keyed = [
        r
        if r.idempotency_key is not None
        else msgspec.structs.replace(
            r,
            idempotency_key=minted_key(),
            idempotency_window_seconds=r.idempotency_window_seconds or MINTED_KEY_WINDOW,
        )
        for r in requests
    ]
    body = BatchSubmitRequest(jobs=[msgspec.Raw(msgspec.json.encode(r)) for r in keyed])
    return _Call("POST", "/jobs/batch", BatchSubmitResponse, body)


def _list_call(
    status: JobStatus | None,
    queue: str | None,
    task_type: str | None,
    limit: int,
    cursor: str | None,
    view: ListView,
) -> _Call[JobList]:
    params = {"status": status, "queue": queue, "taskType": task_type, "cursor": cursor}
    if view != "summary":
        params["view"] = view
    query = {k: v for k, v in params.items() if v is not None} | {"limit": limit}
    return _Call("GET", "/jobs", JobList, params=query)


def _redrive_call(
    queue: str | None, task_type: str | None, limit: int | None
) -> _Call[RedriveResponse]:
    body = RedriveRequest(queue=queue, task_type=task_type, limit=limit)
    return _Call("POST", "/dead-letter/redrive", RedriveResponse, body)


def _limits_call(queue: str, limits: Mapping[str, Mapping[str, float]]) -> _Call[QueueState]:
    """`PUT /queues/{queue}/limits`; raises InvalidInput for an unknown bound, sending
    nothing."""
    entries: list[dict[str, Any]] = []
    for task_type, bounds in limits.items():
        unknown = set(bounds) - set(_LIMIT_BOUNDS)
        if unknown:
            raise InvalidInput(
                f"unknown limit {sorted(unknown)[0]!r} for {task_type!r}",
                errors=[{"pointer": f"/limits/{len(entries)}", "detail": "unknown bound"}],
            )
        entry: dict[str, Any] = {"taskType": task_type}
        for name, value in bounds.items():
            entry[_LIMIT_BOUNDS[name]] = value
        entries.append(entry)
    return _Call("PUT", f"/queues/{_segment(queue)}/limits", QueueState, {"limits": entries})


def _weights_call(queue: str, weights: Mapping[str, float]) -> _Call[QueueState]:
    entries = [{"tenant": tenant, "weight": weight} for tenant, weight in weights.items()]
    return _Call("PUT", f"/queues/{_segment(queue)}/weights", QueueState, {"weights": entries})


def _job_call(job_id: uuid.UUID | str, action: str = "") -> _Call[JobView]:
    """`GET /jobs/{id}`, or `POST /jobs/{id}/{action}`."""
    if action:
        return _Call("POST", f"/jobs/{job_id}/{action}", JobView)
    return _Call("GET", f"/jobs/{job_id}", JobView)


def _wait_deadline(timeout: float) -> float:
    """The `time.monotonic()` by which `wait` answers; raises InvalidInput, sending nothing,
    for a timeout that is not a number of seconds >= 0."""
    if not isinstance(timeout, int | float) or not 0 <= timeout < math.inf:
        raise InvalidInput(
            f"timeout must be a number of seconds >= 0, not {timeout!r}",
            errors=[{"pointer": "timeout", "detail": "not a number of seconds >= 0"}],
        )
    return time.monotonic() + timeout


def _wait_call(job_id: uuid.UUID | str, deadline: float) -> _Call[JobView]:
    """`GET /jobs/{id}?waitSeconds=N`, N the seconds left until `deadline` (monotonic), at
    most the producer's bound; without the parameter when none are left."""
    left = min(float(WAIT_SECONDS_MAX), deadline - time.monotonic())
    if left <= 0:
        return _job_call(job_id)
    return _Call(
        "GET", f"/jobs/{job_id}", JobView, params={"waitSeconds": f"{left:.3f}"}, held=left
    )


def _waited(view: JobView, deadline: float) -> bool:
    """Whether `wait` answers with `view`: the job is finished, or the time is up."""
    return view.status in FINISHED_STATUSES or time.monotonic() >= deadline


def _queue_call(queue: str, action: str) -> _Call[QueueState]:
    """`POST /queues/{queue}/{action}` (pause, resume)."""
    return _Call("POST", f"/queues/{_segment(queue)}/{action}", QueueState)


def _bulk_call(
    action: BulkAction,
    *,
    status: JobStatus | None,
    queue: str | None,
    task_type: str | None,
    ids: Sequence[uuid.UUID] | None,
    limit: int | None,
    dry_run: bool,
) -> _Call[BulkResponse]:
    """`POST /jobs/bulk`; the body is validated here (InvalidInput, nothing sent)."""
    fields: dict[str, Any] = {"action": action, "status": status, "queue": queue}
    fields |= {"taskType": task_type, "limit": limit, "dryRun": dry_run}
    fields["ids"] = None if ids is None else [str(i) for i in ids]
    body = {k: v for k, v in fields.items() if v is not None}
    try:
        request = msgspec.convert(body, BulkRequest)
    except msgspec.ValidationError as exc:
        raise InvalidInput(str(exc), errors=[{"pointer": "/", "detail": str(exc)}]) from None
    return _Call("POST", "/jobs/bulk", BulkResponse, request)


def _purge_call(queue: str, confirm: str, dry_run: bool) -> _Call[PurgeResponse]:
    body = PurgeRequest(confirm=confirm, dry_run=dry_run)
    return _Call("POST", f"/queues/{_segment(queue)}/pending/purge", PurgeResponse, body)


_NO_REPLY: type[None] = type(None)

_QUEUES = _Call("GET", "/queues", QueuesResponse)
_WORKERS = _Call("GET", "/workers", WorkersResponse)
_SCHEDULES = _Call("GET", "/schedules", SchedulesResponse)


def _throughput_call(minutes: int) -> _Call[ThroughputResponse]:
    return _Call("GET", "/throughput", ThroughputResponse, params={"minutes": minutes})


def _delete_call(job_id: uuid.UUID | str) -> _Call[None]:
    return _Call("DELETE", f"/jobs/{job_id}", _NO_REPLY)


def _content(call: _Call[Any]) -> tuple[bytes | None, dict[str, str] | None]:
    """The request's body and headers (with the caller's trace context, when it traces:
    `jobq.tracecontext`)."""
    headers: dict[str, str] = {}
    add_caller_context(headers)
    if call.body is None:
        return None, headers or None
    headers["Content-Type"] = "application/json"
    return msgspec.json.encode(call.body), headers


def _transport_failure(method: str, exc: httpx.TransportError) -> JobqError:
    """What a transport failure means: ServiceUnavailable when the request cannot have been
    applied (it never left, or it was a read), else OutcomeUnknown."""
    if isinstance(exc, _NOT_SENT):
        return ServiceUnavailable(f"jobq unreachable: {type(exc).__name__}")
    if method == "GET":
        return ServiceUnavailable(f"jobq did not answer: {type(exc).__name__}")
    return OutcomeUnknown(
        f"jobq did not answer: {type(exc).__name__}; the request may have been applied"
    )


def _reply(call: _Call[T], response: httpx.Response) -> T:
    """The decoded reply; raises the `jobq.errors` class of a problem-details answer, or
    JobqError for a reply that is not the expected shape."""
    if not response.is_success:
        try:
            problem = response.json()
        except ValueError:
            problem = None
        error = from_problem(problem, response.status_code)
        if isinstance(error, ServiceUnavailable):
            error.retry_after = _seconds(response.headers.get("Retry-After"))
        raise error
    if call.reply is _NO_REPLY:
        return None  # type: ignore[return-value]  # T is None for these calls
    try:
        return msgspec.json.decode(response.content, type=call.reply)
    except msgspec.DecodeError as exc:
        raise JobqError(f"unexpected reply from {call.path}: {exc}") from exc


class _SubmitAttempts:
    """The retry policy of one submit: sent again while answered 503/504 or cut off, at most
    `retries` times; OutcomeUnknown (with the submit's `key`) at the end if any attempt may
    have been applied."""

    def __init__(self, retries: int, key: str | None) -> None:
        self._retries = retries
        self._key = key
        self._attempt = 0
        self._uncertain: OutcomeUnknown | None = None

    def pause_after(self, exc: JobqError) -> float:
        """Seconds to wait before sending the submit again after `exc`; raises `exc` (or the
        OutcomeUnknown seen, with the key) when it is not to be sent again."""
        if not _retryable(exc):
            raise exc
        if isinstance(exc, OutcomeUnknown):
            self._uncertain = exc
        if self._attempt == self._retries:
            if self._uncertain is not None:
                raise _unknown(self._uncertain, self._key) from exc
            raise exc
        self._attempt += 1
        return _pause(self._attempt - 1, exc)


def _transport(
    kind: type[httpx.HTTPTransport] | type[httpx.AsyncHTTPTransport], retries: int
) -> Any:
    return kind(retries=retries, limits=httpx.Limits(keepalive_expiry=CLIENT_IDLE_SECONDS))


def _http_options(base_url: str, api_key: str | None, timeout: float) -> dict[str, Any]:
    """The httpx client options both clients take: base URL, bearer key, timeout (seconds)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return {"base_url": base_url, "headers": headers, "timeout": timeout}


class Client:
    __doc__ = _DOC.format(name="Client", usage="a context manager", close="close()")

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        submit_retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._submit_retries = submit_retries
        self._timeout = timeout
        self._http = httpx.Client(
            **_http_options(base_url, api_key, timeout),
            transport=transport or _transport(httpx.HTTPTransport, retries),
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

        Without an `idempotency_key` one is minted for this submit, so the client's own
        retries are replays; `idempotency_window_seconds` (1 to 2,592,000) sets how long the
        key is held, else the queue service's QUEUE_IDEMPOTENCY_WINDOW (7 days). Bad input
        raises InvalidInput/PayloadTooLarge before anything is sent; OutcomeUnknown when the
        job may or may not exist after the last retry."""
        return self._submit(_submit_call(task_type, payload, options))

    def submit_batch(self, requests: list[SubmitJobRequest]) -> BatchSubmitResponse:
        """Submit up to 500 jobs; each gets its own result (202, 200, 409, 413 or 422).

        Entries without an idempotency key get one minted, so a retried batch replays the
        entries already created; retried like `submit`."""
        return self._submit(_batch_call(requests))

    def get(self, job_id: uuid.UUID | str) -> JobView:
        """The job's current view."""
        return self._call(_job_call(job_id))

    def wait(self, job_id: uuid.UUID | str, *, timeout: float = 60.0) -> JobView:
        """The job's view once it is COMPLETED, DEAD_LETTER or CANCELLED, or when `timeout`
        seconds passed (then as it is): long-polling reads (`waitSeconds`, up to 20 s each),
        answered by the producer as soon as the job settles. Raises JobNotFound, and
        InvalidInput for a negative timeout."""
        deadline = _wait_deadline(timeout)
        while True:
            view = self._call(_wait_call(job_id, deadline))
            if _waited(view, deadline):
                return view

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
        return self._call(_list_call(status, queue, task_type, limit, cursor, view))

    def cancel(self, job_id: uuid.UUID | str) -> JobView:
        """Cancel a job (admin key); a running one is stopped by its worker."""
        return self._call(_job_call(job_id, "cancel"))

    def retry(self, job_id: uuid.UUID | str) -> JobView:
        """Run a dead-lettered or cancelled job again (admin key)."""
        return self._call(_job_call(job_id, "retry"))

    def redrive(
        self, *, queue: str | None = None, task_type: str | None = None, limit: int | None = None
    ) -> int:
        """Move dead-lettered jobs back to PENDING (admin key); returns how many moved."""
        return self._call(_redrive_call(queue, task_type, limit)).moved

    def pause(self, queue: str) -> QueueState:
        """Pause `queue` (an admin key of tenant `*`): it keeps taking submits but hands out
        nothing until `resume`; running jobs finish. Returns its state. Raises Forbidden for
        another key, QueueNotFound for a queue that has no job and was never paused."""
        return self._call(_queue_call(queue, "pause"))

    def resume(self, queue: str) -> QueueState:
        """Resume a paused `queue` (an admin key of tenant `*`); returns its state."""
        return self._call(_queue_call(queue, "resume"))

    def set_limits(self, queue: str, limits: Mapping[str, Mapping[str, float]]) -> QueueState:
        """Replace `queue`'s limits (an admin key of tenant `*`), by task type:
        `{"webhook": {"concurrency": 20, "tenant_concurrency": 3, "rate": 50, "burst": 10}}`
        lets at most 20 `webhook` jobs run at once across every worker, at most 3 of one
        tenant, and hands out at most 50 a second (10 at once after a quiet spell);
        `tenant_rate` and `tenant_burst` bound each tenant's the same way. Any bound may be
        left out, not all; `{}` removes every limit. Returns the queue's state. Raises
        InvalidInput for a bad limit or an unknown bound (nothing is changed), Forbidden for
        another key, QueueNotFound for a queue that has no job and no state."""
        return self._call(_limits_call(queue, limits))

    def set_weights(self, queue: str, weights: Mapping[str, float]) -> QueueState:
        """Replace the tenants' weights in `queue`'s fair share (an admin key of tenant `*`):
        `{"acme": 3}` gives tenant `acme` three jobs for every one of any other tenant while
        both have ready jobs in the queue (a tenant not named weighs 1; a weight is 0.01 to
        1,000); `{}` makes every tenant weigh 1 again. Returns the queue's state. Raises
        InvalidInput for a bad weight or tenant name (nothing is changed), Forbidden for
        another key, QueueNotFound for a queue that has no job and no state."""
        return self._call(_weights_call(queue, weights))

    def queues(self) -> QueuesResponse:
        """Counts per queue: the key's tenant's jobs, or every job's for an admin of `*`."""
        return self._call(_QUEUES)

    def bulk(
        self,
        action: BulkAction,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task_type: str | None = None,
        ids: Sequence[uuid.UUID] | None = None,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> BulkResponse:
        """`retry`, `cancel` or `delete` every job matching the filter (admin key), at most
        `limit`; `dry_run` only counts them. Raises InvalidInput for a status the action
        never applies to."""
        return self._call(
            _bulk_call(
                action,
                status=status,
                queue=queue,
                task_type=task_type,
                ids=ids,
                limit=limit,
                dry_run=dry_run,
            )
        )

    def delete(self, job_id: uuid.UUID | str) -> None:
        """Delete a finished job (admin key); InvalidState for a live one."""
        self._call(_delete_call(job_id))

    def purge(self, queue: str, *, confirm: str, dry_run: bool = False) -> PurgeResponse:
        """Delete `queue`'s waiting jobs (admin key); `confirm` must repeat the queue's name."""
        return self._call(_purge_call(queue, confirm, dry_run))

    def workers(self) -> WorkersResponse:
        """Every live worker (admin key)."""
        return self._call(_WORKERS)

    def schedules(self) -> SchedulesResponse:
        """Every recurring schedule with its last and next firing (admin key)."""
        return self._call(_SCHEDULES)

    def throughput(self, minutes: int = 60) -> ThroughputResponse:
        """Completed and failed attempts per queue and minute, the last `minutes` minutes."""
        return self._call(_throughput_call(minutes))

    def _submit(self, call: _Call[T]) -> T:
        attempts = _SubmitAttempts(self._submit_retries, call.key)
        while True:
            try:
                return self._call(call)
            except JobqError as exc:
                time.sleep(attempts.pause_after(exc))

    def _call(self, call: _Call[T]) -> T:
        content, headers = _content(call)
        method, path, params = call.method, call.path, call.params
        held = _held(call, self._timeout)
        try:
            try:
                response = self._http.request(
                    method, path, content=content, headers=headers, params=params, **held
                )
            except _CLOSED_UNANSWERED:
                if method != "GET":
                    raise
                response = self._http.request(method, path, headers=headers, params=params, **held)
        except httpx.TransportError as exc:
            raise _transport_failure(method, exc) from exc
        return _reply(call, response)


class AsyncClient:
    __doc__ = _DOC.format(
        name="AsyncClient", usage="an async context manager", close="await aclose()"
    )

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        submit_retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._submit_retries = submit_retries
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            **_http_options(base_url, api_key, timeout),
            transport=transport or _transport(httpx.AsyncHTTPTransport, retries),
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def submit(
        self, task_type: str, payload: dict[str, Any], **options: Unpack[SubmitOptions]
    ) -> SubmitJobResponse:
        """As `Client.submit`."""
        return await self._submit(_submit_call(task_type, payload, options))

    async def submit_batch(self, requests: list[SubmitJobRequest]) -> BatchSubmitResponse:
        """As `Client.submit_batch`."""
        return await self._submit(_batch_call(requests))

    async def get(self, job_id: uuid.UUID | str) -> JobView:
        """As `Client.get`."""
        return await self._call(_job_call(job_id))

    async def wait(
        self,
        job_id: uuid.UUID | str,
        *,
        timeout: float = 60.0,  # noqa: ASYNC109 (the same signature as Client.wait)
    ) -> JobView:
        """As `Client.wait`."""
        deadline = _wait_deadline(timeout)
        while True:
            view = await self._call(_wait_call(job_id, deadline))
            if _waited(view, deadline):
                return view

    async def list(
        self,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task_type: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        view: ListView = "summary",
    ) -> JobList:
        """As `Client.list`."""
        return await self._call(_list_call(status, queue, task_type, limit, cursor, view))

    async def cancel(self, job_id: uuid.UUID | str) -> JobView:
        """As `Client.cancel`."""
        return await self._call(_job_call(job_id, "cancel"))

    async def retry(self, job_id: uuid.UUID | str) -> JobView:
        """As `Client.retry`."""
        return await self._call(_job_call(job_id, "retry"))

    async def redrive(
        self, *, queue: str | None = None, task_type: str | None = None, limit: int | None = None
    ) -> int:
        """As `Client.redrive`."""
        return (await self._call(_redrive_call(queue, task_type, limit))).moved

    async def pause(self, queue: str) -> QueueState:
        """As `Client.pause`."""
        return await self._call(_queue_call(queue, "pause"))

    async def resume(self, queue: str) -> QueueState:
        """As `Client.resume`."""
        return await self._call(_queue_call(queue, "resume"))

    async def set_limits(self, queue: str, limits: Mapping[str, Mapping[str, float]]) -> QueueState:
        """As `Client.set_limits`."""
        return await self._call(_limits_call(queue, limits))

    async def set_weights(self, queue: str, weights: Mapping[str, float]) -> QueueState:
        """As `Client.set_weights`."""
        return await self._call(_weights_call(queue, weights))

    async def queues(self) -> QueuesResponse:
        """As `Client.queues`."""
        return await self._call(_QUEUES)

    async def bulk(
        self,
        action: BulkAction,
        *,
        status: JobStatus | None = None,
        queue: str | None = None,
        task_type: str | None = None,
        ids: Sequence[uuid.UUID] | None = None,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> BulkResponse:
        """As `Client.bulk`."""
        return await self._call(
            _bulk_call(
                action,
                status=status,
                queue=queue,
                task_type=task_type,
                ids=ids,
                limit=limit,
                dry_run=dry_run,
            )
        )

    async def delete(self, job_id: uuid.UUID | str) -> None:
        """As `Client.delete`."""
        await self._call(_delete_call(job_id))

    async def purge(self, queue: str, *, confirm: str, dry_run: bool = False) -> PurgeResponse:
        """As `Client.purge`."""
        return await self._call(_purge_call(queue, confirm, dry_run))

    async def workers(self) -> WorkersResponse:
        """As `Client.workers`."""
        return await self._call(_WORKERS)

    async def schedules(self) -> SchedulesResponse:
        """As `Client.schedules`."""
        return await self._call(_SCHEDULES)

    async def throughput(self, minutes: int = 60) -> ThroughputResponse:
        """As `Client.throughput`."""
        return await self._call(_throughput_call(minutes))

    async def _submit(self, call: _Call[T]) -> T:
        attempts = _SubmitAttempts(self._submit_retries, call.key)
        while True:
            try:
                return await self._call(call)
            except JobqError as exc:
                await asyncio.sleep(attempts.pause_after(exc))

    async def _call(self, call: _Call[T]) -> T:
        content, headers = _content(call)
        method, path, params = call.method, call.path, call.params
        held = _held(call, self._timeout)
        try:
            try:
                response = await self._http.request(
                    method, path, content=content, headers=headers, params=params, **held
                )
            except _CLOSED_UNANSWERED:
                if method != "GET":
                    raise
                response = await self._http.request(
                    method, path, headers=headers, params=params, **held
                )
        except httpx.TransportError as exc:
            raise _transport_failure(method, exc) from exc
        return _reply(call, response)


def _held(call: _Call[Any], timeout: float) -> dict[str, Any]:
    """httpx's per-request `timeout` for a call the producer holds on purpose (its `held`
    seconds more than the client's own timeout); none for any other call."""
    return {"timeout": timeout + call.held} if call.held else {}


def _pause(attempt: int, exc: JobqError) -> float:
    """Seconds before retry number `attempt + 1`: the `Retry-After` given, else full jitter
    over 0.5 s doubling per retry (AWS Architecture Blog, *Exponential Backoff And Jitter*),
    at most 10 s either way."""
    after = exc.retry_after if isinstance(exc, ServiceUnavailable) else None
    if after is not None and after > 0:
        return min(after, _RETRY_PAUSE_MAX)
    return random.uniform(0, min(_RETRY_PAUSE * 2**attempt, _RETRY_PAUSE_MAX))


def _unknown(exc: OutcomeUnknown, key: str | None) -> OutcomeUnknown:
    """`exc` with the submit's idempotency key, for the caller to retry or look up with."""
    if exc.idempotency_key is None:
        exc.idempotency_key = key
    return exc


def _seconds(value: str | None) -> float | None:
    """A numeric `Retry-After` in seconds (an HTTP-date is ignored)."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
