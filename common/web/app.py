"""HTTP plumbing shared by the producer and the queue service (Litestar).

One mapping from exceptions to RFC 9457 problem details, so every error either service returns
(our own, a validation failure, a 404/405/413/415 from the framework, or an unexpected crash)
has the same shape, and a 500 never leaks internals.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import msgspec
from litestar import Litestar, MediaType, Request, Response, get
from litestar.exceptions import HTTPException, ValidationException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, Schema, SecurityScheme
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from common.contracts import REQUEST_BODY_MAX_BYTES
from common.errors import (
    InvalidInput,
    JobqError,
    MalformedRequest,
    PayloadTooLarge,
    RateLimited,
)
from common.validation import msgspec_problem
from common.web.access import RequestCheck
from common.web.query_params import QueryParameterCheck

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"


def _validation_to_error(exc: ValidationException) -> JobqError:
    """Map Litestar's body/parameter validation failure onto InvalidInput or MalformedRequest."""
    entries = exc.extra if isinstance(exc.extra, list) else []
    errors: list[dict[str, str]] = []
    malformed = False
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        message = str(entry.get("message", ""))
        source = entry.get("source")
        # Litestar's ParamType is an Enum: use its value ("query"), not its repr.
        source = getattr(source, "value", source)
        key = str(entry.get("key") or "")
        if "malformed" in message.lower() or "truncated" in message.lower():
            malformed = True
        if source == "body" and message == "'data'":
            # Litestar's way of saying the body was missing entirely.
            return MalformedRequest("the request body is empty; send a JSON object")
        fallback = ""
        if source == "body" and key and key != "data":
            fallback = key if key.startswith(("[", ".")) else "." + key
        pointer, detail = msgspec_problem(message, fallback_path=fallback)
        if source in ("query", "path", "header", "cookie") and key:
            pointer = f"{source}:{key}"
        errors.append({"pointer": pointer, "detail": detail})
    if malformed or not errors:
        detail = errors[0]["detail"] if errors else str(exc.detail)
        return MalformedRequest(f"the request body is not valid JSON: {detail}", errors=errors)
    summary = "; ".join(f"{e['pointer'] or '/'}: {e['detail']}" for e in errors)
    return InvalidInput(summary, errors=errors)


def problem_response(
    error: JobqError, request: Request[Any, Any, Any], headers: dict[str, str] | None = None
) -> Response[Any]:
    """Render `error` as an `application/problem+json` response, with `headers` and those its
    status calls for (`Retry-After` on 503 and 429, `WWW-Authenticate` on 401)."""
    headers = dict(headers or {})
    if error.status == 503:
        headers["Retry-After"] = "1"
    elif error.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="jobq"'
    elif isinstance(error, RateLimited) and error.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    return Response(
        content=error.to_problem(instance=request.url.path),
        status_code=error.status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def _jobq_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, JobqError)
    return problem_response(exc, request)


def _validation_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, ValidationException)
    return problem_response(_validation_to_error(exc), request)


class _HttpProblem(JobqError):
    """An HTTP error raised by the framework itself (404, 405, 413, 415, …)."""


_CLIENT_GONE = "client disconnected prematurely"
"""Litestar's detail when the client went away while its body was read (no server error)."""


def _http_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, HTTPException)
    if exc.status_code >= 500 and exc.detail == _CLIENT_GONE:
        # Nobody reads this reply; the server closed the connection or the client left.
        logger.info(
            "client left while sending %s %s",
            request.method,
            request.url.path,
            extra={"event": "client_disconnected"},
        )
    elif exc.status_code >= 500:
        logger.error(
            "server error on %s %s: %s",
            request.method,
            request.url.path,
            exc.detail,
            extra={"event": "unhandled_error"},
            exc_info=exc,
        )
    if exc.status_code == 400:
        malformed = MalformedRequest(f"the request body could not be read: {exc.detail}")
        return problem_response(malformed, request)
    if exc.status_code == 413:
        limit = f"the request body exceeds {REQUEST_BODY_MAX_BYTES} bytes"
        return problem_response(PayloadTooLarge(limit), request)
    if exc.status_code == 429:
        # Litestar's rate-limit middleware: its RateLimit-* headers, and Retry-After.
        headers = dict(exc.headers or {})
        reset = headers.get("RateLimit-Reset", "")
        limited = RateLimited(
            "this tenant's request rate is used up; retry after Retry-After seconds",
            retry_after=float(reset) if reset.isdigit() else None,
        )
        return problem_response(limited, request, headers)
    error = _HttpProblem(str(exc.detail))
    body = {
        "type": "about:blank",
        "title": str(exc.detail) if exc.status_code < 500 else "Internal error",
        "status": exc.status_code,
        "detail": str(exc.detail) if exc.status_code < 500 else error.title,
        "instance": request.url.path,
    }
    return Response(
        content=body, status_code=exc.status_code, media_type=PROBLEM_JSON, headers=exc.headers
    )


def _too_deep_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    error = MalformedRequest("the JSON body is nested too deeply to read")
    return problem_response(error, request)


def _crash_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    logger.exception(
        "unhandled error on %s %s",
        request.method,
        request.url.path,
        extra={"event": "unhandled_error"},
        exc_info=exc,
    )
    return problem_response(JobqError("an unexpected error occurred; it has been logged"), request)


def exception_handlers() -> dict[type[Exception] | int, Callable[..., Response[Any]]]:
    """Litestar `exception_handlers` mapping every failure onto problem details."""
    return {
        JobqError: _jobq_handler,
        ValidationException: _validation_handler,
        HTTPException: _http_handler,
        RecursionError: _too_deep_handler,
        Exception: _crash_handler,
    }


def openapi_config(title: str, credential: str) -> OpenAPIConfig:
    """The OpenAPI document at `/schema/openapi.json` (and `/schema`), declaring the bearer
    security scheme every documented route uses; `credential` says which token it is.

    No documentation UI is served: Litestar's UIs load their scripts from public CDNs, which a
    service should not make its users' browsers fetch. Open the document (or the committed
    `openapi/*.json`) in any OpenAPI viewer instead."""
    return OpenAPIConfig(
        title=title,
        version="0.1.0",
        path="/schema",
        render_plugins=[JsonRenderPlugin()],
        components=Components(
            security_schemes={
                "bearer": SecurityScheme(type="http", scheme="bearer", description=credential)
            }
        ),
        security=[{"bearer": []}],
    )


def metrics_route(registry: CollectorRegistry) -> HTTPRouteHandler:
    """`GET /metrics`: the process-wide registry (HTTP and process metrics) plus the app's own."""

    @get("/metrics", media_type=MediaType.TEXT, include_in_schema=False, sync_to_thread=False)
    def metrics() -> Response[bytes]:
        body = generate_latest(REGISTRY) + generate_latest(registry)
        return Response(content=body, media_type=CONTENT_TYPE_LATEST)

    return metrics


@get("/health/live", include_in_schema=False, sync_to_thread=False)
def live() -> dict[str, str]:
    """Liveness: the process answers; checks no dependency."""
    return {"status": "ok"}


class UnsupportedMediaType(JobqError):
    """The request has a body that is not declared as JSON (415)."""

    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported media type"


async def require_json_body(request: Request[Any, Any, Any]) -> None:
    """`before_request` hook: a request that carries a body must declare it JSON
    (`application/json` or `application/*+json`), else 415. Bodiless POSTs pass.

    Asynchronous (though it never awaits) because Litestar runs synchronous hooks on a thread
    pool, which costs more than the check itself. It runs after authentication and before the
    body is read."""
    headers = request.headers
    has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
    if not has_body:
        return
    media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        return
    raise UnsupportedMediaType(
        f"send the body as application/json (got {media_type or 'no Content-Type'})"
    )


SESSION_ROUTE = "session_route"
"""`opt` key of route handlers that authenticate with a console session instead."""


def request_checks(authenticate: RequestCheck) -> RequestCheck:
    """The apps' `before_request` hook (before the body is read): `authenticate` first
    (`common.web.access.role_check` or `token_check`: 401/403), then unknown query parameters
    are refused (`common.web.query_params`, 422), then a body must be JSON
    (`require_json_body`, 415)."""
    query = QueryParameterCheck()

    async def check(request: Request[Any, Any, Any]) -> None:
        if request.route_handler.opt.get(SESSION_ROUTE):
            # The console's pages: a session cookie, not a bearer key, and HTML forms
            # (services/producer/console/sessions.py checks both).
            return
        await authenticate(request)
        query(request)
        await require_json_body(request)

    return check


class ProblemError(msgspec.Struct, kw_only=True):
    """Where one bad input is (an RFC 6901 JSON pointer into the body, or `query:<name>`)."""

    pointer: str
    detail: str


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """RFC 9457 problem details, as every jobq error is answered."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[ProblemError] | None = None


class ForwardedJob(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """A batch entry whose forward's outcome is unknown: its index, the job id minted for it,
    its idempotency key if it had one."""

    index: int
    job_id: str
    idempotency_key: str | None = None


class OutcomeUnknownProblem(Problem, kw_only=True, omit_defaults=True, rename="camel"):
    """`urn:jobq:problem:outcome-unknown` (504): the submit was forwarded and no answer came,
    so the job may exist. `jobId` (a single submit) or `jobs` (a batch) says which ids to
    `GET`; retry only with the same idempotency key."""

    job_id: str | None = None
    idempotency_key: str | None = None
    jobs: list[ForwardedJob] | None = None


_PROBLEM_DESCRIPTIONS = {
    400: "Malformed or empty body, or bad framing",
    401: "Missing or unknown bearer token (when access keys are configured)",
    403: "The key's role does not allow this operation",
    404: "No such job",
    409: "Conflict: stale receipt handle, reused idempotency key, or the job's state",
    413: "Body or payload too large",
    415: "The body is not application/json",
    422: "A bound was broken; `errors` points at each bad input",
    429: "The tenant's rate is used up; retry after Retry-After seconds",
    503: "A dependency is unavailable; retry after Retry-After seconds",
    504: "Outcome unknown: forwarded, not answered in time; `jobId` (or `jobs`) says what to GET",
}
ALWAYS = (400, 401, 422, 503)
"""Problems any route may answer."""


def problems(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAPI responses for problem details: the `ALWAYS` set plus `statuses`."""
    return {
        status: ResponseSpec(
            OutcomeUnknownProblem if status == 504 else Problem,
            description=_PROBLEM_DESCRIPTIONS[status],
            media_type=PROBLEM_JSON,
            generate_examples=False,
        )
        for status in sorted({*ALWAYS, *statuses})
    }


def refine_struct_schemas(app: Litestar, module: ModuleType) -> None:
    """Make the OpenAPI schemas of `module`'s Structs say what the server enforces.

    Litestar's generator drops some msgspec constraints (a bound of 0, patterns on list items)
    and never closes objects; this fills those in from the Structs themselves:
    `additionalProperties: false` for `forbid_unknown_fields`, `minimum`/`maximum` and item
    patterns from `Meta`.
    """
    structs = {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, msgspec.Struct)
    }
    components = app.openapi_schema.components
    for name, schema in (components.schemas or {}).items():
        struct = structs.get(name)
        if struct is None or not isinstance(schema, Schema):
            continue
        if struct.__struct_config__.forbid_unknown_fields:
            schema.additional_properties = False
        info = msgspec.inspect.type_info(struct)
        assert isinstance(info, msgspec.inspect.StructType)
        for field in info.fields:
            prop = (schema.properties or {}).get(field.encode_name)
            if isinstance(prop, Schema):
                _apply_constraints(prop, field.type)


def _unwrap(kind: msgspec.inspect.Type) -> msgspec.inspect.Type:
    while isinstance(kind, msgspec.inspect.Metadata):
        kind = kind.type
    return kind


def _apply_constraints(prop: Schema, kind: msgspec.inspect.Type) -> None:
    kind = _unwrap(kind)
    if isinstance(kind, msgspec.inspect.UnionType):
        concrete = [t for t in kind.types if not isinstance(t, msgspec.inspect.NoneType)]
        if len(concrete) != 1:
            return
        kind = _unwrap(concrete[0])
    if isinstance(kind, msgspec.inspect.IntType | msgspec.inspect.FloatType):
        if kind.ge is not None and prop.minimum is None:
            prop.minimum = kind.ge
        if kind.le is not None and prop.maximum is None:
            prop.maximum = kind.le
    elif isinstance(kind, msgspec.inspect.ListType) and isinstance(prop.items, Schema):
        item = _unwrap(kind.item_type)
        if isinstance(item, msgspec.inspect.StrType) and item.pattern:
            prop.items.pattern = item.pattern
