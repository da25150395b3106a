"""The console's pages (GET): overview, jobs, a job, dead letters, workers, schedules. Each
reads through the producer's queue-service client with the session's tenant scope, exactly
as the public API's routes do, and renders a Jinja template; none needs JavaScript."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Request, get
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from common.contracts import LIST_LIMIT_MAX, NAME_PATTERN, JobStatus, ListedJob, QueueDepth
from common.errors import Forbidden, InvalidInput
from services.producer.client import QueueServiceClient
from services.producer.console import render
from services.producer.console.sessions import Session, login_cookie

PAGE_SIZE = 100
DEAD_LETTERS_READ = 5_000
"""Dead letters the grouping reads at most (the newest), ten pages of 500."""

_NAME = re.compile(NAME_PATTERN)
_KEY = re.compile(r"[\x20-\x7e]{1,255}")


def name_or_none(value: str | None, field: str, star: bool = False) -> str | None:
    """An optional name from a query string or form (empty: none); raises InvalidInput
    naming `field` for anything that is not a queue / task type / tenant name (`*` too when
    `star`)."""
    value = (value or "").strip()
    if not value:
        return None
    if _NAME.match(value) or (star and value == "*"):
        return value
    raise InvalidInput(
        f"{field} must be a name (lower-case letters, digits, . _ -)",
        errors=[{"pointer": f"query:{field}", "detail": "not a name"}],
    )


def status_or_none(value: str | None) -> JobStatus | None:
    """An optional job status (empty: any); InvalidInput for anything else."""
    if not value:
        return None
    try:
        return JobStatus(value.upper())
    except ValueError:
        raise InvalidInput(
            f"status must be one of {', '.join(s.value for s in JobStatus)}",
            errors=[{"pointer": "query:status", "detail": "not a status"}],
        ) from None


def scope_of(session: Session, tenant: str | None) -> str | None:
    """The tenant scope of a read: the session's own tenant, or for an admin of `*` the
    tenant filter chosen (None: every tenant). Another tenant's filter is refused."""
    own = session.caller.scope
    if own is None:
        return None if tenant in (None, "", "*") else tenant
    if tenant not in (None, own):
        raise Forbidden("a tenant's key sees its own tenant only")
    return own


def page(name: str, session: Session, **context: Any) -> Template:
    """Render `name` with what every page shows (who is signed in, the CSRF token)."""
    return Template(template_name=name, context={"session": session, **context})


async def _overview_context(
    queue: QueueServiceClient, session: Session, tenant: str | None
) -> dict[str, Any]:
    scope = scope_of(session, tenant)
    depth = await queue.depth(scope)
    names = [q.queue for q in depth.queues]
    if scope is None:
        points = (await queue.throughput(60, None)).points
    else:
        points = (await queue.throughput(60, names)).points if names else []
    now = datetime.now(UTC)
    charts = render.charts(points, now)
    # A queue that drained in the last hour keeps its row (zero counts) beside its chart.
    idle = [
        QueueDepth(
            queue=name, pending=0, scheduled=0, processing=0, dead_letter=0,
            oldest_pending_age_seconds=0.0, source=depth.source, refreshed_at=depth.refreshed_at,
        )
        for name in sorted(set(charts) - set(names))
    ]  # fmt: skip
    if idle:
        depth = msgspec.structs.replace(
            depth, queues=sorted([*depth.queues, *idle], key=lambda q: q.queue)
        )
    return {"depth": depth, "charts": charts, "tenant": tenant, "now": now}


@get("/", name="console-overview")
async def overview(
    session: NamedDependency[Session],
    queue: NamedDependency[QueueServiceClient],
    tenant: FromQuery[str | None] = None,
) -> Template:
    """Per-queue counts and the last hour's completions and failures per minute."""
    context = await _overview_context(queue, session, name_or_none(tenant, "tenant", True))
    return page("overview.html", session, **context)


@get("/fragments/queues", name="console-queues-fragment")
async def queues_fragment(
    session: NamedDependency[Session],
    queue: NamedDependency[QueueServiceClient],
    tenant: FromQuery[str | None] = None,
) -> Template:
    """The overview's table alone, which htmx swaps in every 2 s."""
    context = await _overview_context(queue, session, name_or_none(tenant, "tenant", True))
    return page("_queues.html", session, **context)


@get("/jobs", name="console-jobs")
async def jobs(
    request: Request[Any, Any, Any],
    session: NamedDependency[Session],
    queue: NamedDependency[QueueServiceClient],
    cursor: FromQuery[uuid.UUID | None] = None,
    job: FromQuery[str | None] = None,
) -> Template | Redirect:
    """Jobs newest first, filtered by the query string (`status`, `queue`, `task_type`,
    `tenant`, `key`: an idempotency key), 100 a page (keyset: `cursor`); `job` (an id)
    opens that job's page."""
    if job:
        try:
            return Redirect(f"/console/jobs/{uuid.UUID(job.strip())}", status_code=303)
        except ValueError:
            raise InvalidInput(
                "job must be a job id", errors=[{"pointer": "query:job", "detail": "not an id"}]
            ) from None
    query = request.query_params
    status = status_or_none(query.get("status"))
    queue_name = name_or_none(query.get("queue"), "queue")
    task_type = name_or_none(query.get("task_type"), "task_type")
    tenant = name_or_none(query.get("tenant"), "tenant", star=True)
    key = (query.get("key") or "").strip() or None
    if key is not None and not _KEY.fullmatch(key):
        raise InvalidInput(
            "key must be an idempotency key (1-255 printable ASCII characters)",
            errors=[{"pointer": "query:key", "detail": "not an idempotency key"}],
        )
    scope = scope_of(session, tenant)
    params: dict[str, str | int] = {"limit": PAGE_SIZE}
    for name, value in (
        ("status", status),
        ("queue", queue_name),
        ("taskType", task_type),
        ("idempotencyKey", key),
        ("cursor", cursor),
        ("tenant", scope),
    ):
        if value is not None:
            params[name] = str(value)
    listing = await queue.list_jobs(params)
    filters = {"status": status or "", "queue": queue_name or "", "task_type": task_type or ""}
    filters["key"] = key or ""
    return page(
        "jobs.html",
        session,
        listing=listing,
        filters=filters,
        tenant=tenant or "",
        statuses=[s.value for s in JobStatus],
    )


@get("/jobs/{job_id:uuid}", name="console-job")
async def job_page(
    session: NamedDependency[Session],
    queue: NamedDependency[QueueServiceClient],
    job_id: FromPath[uuid.UUID],
    all: FromQuery[bool] = False,
) -> Template:
    """One job: fields, payload and result as JSON (cut at 64 KiB unless `all`), the errors
    timeline, its lease, and its actions."""
    view = await queue.get(job_id, session.caller.scope)
    payload, payload_cut = render.pretty(view.payload, all)
    result, result_cut = render.pretty(view.result, all)
    return page(
        "job.html",
        session,
        job=view,
        payload=payload,
        result=result,
        cut=payload_cut or result_cut,
    )


@get("/dead-letters", name="console-dead-letters")
async def dead_letters(
    request: Request[Any, Any, Any],
    session: NamedDependency[Session],
    queue: NamedDependency[QueueServiceClient],
) -> Template:
    """Dead letters (of `queue`, `tenant` from the query string) grouped by queue and task
    type, then by normalised last error (the newest 5,000), each group with a redrive after
    a dry-run count."""
    queue_name = name_or_none(request.query_params.get("queue"), "queue")
    tenant = name_or_none(request.query_params.get("tenant"), "tenant", star=True)
    scope = scope_of(session, tenant)
    found: list[ListedJob] = []
    cursor: str | None = None
    while len(found) < DEAD_LETTERS_READ:
        params: dict[str, str | int] = {"limit": LIST_LIMIT_MAX, "status": "DEAD_LETTER"}
        for name, value in (("queue", queue_name), ("tenant", scope), ("cursor", cursor)):
            if value is not None:
                params[name] = value
        listing = await queue.list_jobs(params)
        found += listing.items
        cursor = listing.next_cursor
        if cursor is None:
            break
    return page(
        "dead_letters.html",
        session,
        groups=render.dead_groups(found),
        capped=cursor is not None,
        read=len(found),
        queue_name=queue_name or "",
        tenant=tenant or "",
    )


@get("/workers", name="console-workers")
async def workers(
    session: NamedDependency[Session], queue: NamedDependency[QueueServiceClient]
) -> Template:
    """Every live worker (admins)."""
    _admin(session)
    reply = await queue.workers()
    return page("workers.html", session, workers=reply, now=datetime.now(UTC))


@get("/schedules", name="console-schedules")
async def schedules(
    session: NamedDependency[Session], queue: NamedDependency[QueueServiceClient]
) -> Template:
    """Every recurring schedule (admins)."""
    _admin(session)
    return page("schedules.html", session, schedules=(await queue.schedules()).schedules)


def _admin(session: Session) -> None:
    if not session.may_act:
        raise Forbidden("workers and schedules are shown to admin keys")


@get("/login", name="console-login", opt={"public": True})
async def login_form(request: Request[Any, Any, Any]) -> Template:
    """The sign-in form, with its pre-session CSRF cookie."""
    token, cookie = login_cookie(request)
    return Template(
        template_name="login.html", context={"login_token": token, "error": None}, cookies=[cookie]
    )
