"""The operator console, served by the producer at `/console` (README, "Console").

Server-rendered Jinja templates (Litestar's templating) with a vendored htmx
(`static/htmx.min.js`, htmx.org from the npm registry; see `static/htmx.VERSION`) for the
overview's live refresh; every page reads and every form posts without JavaScript. It uses
the producer's queue-service client, with the session's tenant scope, exactly as the public
API's routes do: no second path to the database. A strict Content-Security-Policy (scripts,
styles and everything else from this origin only; no inline script or style) and the usual
hardening headers go with every console response.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Request, Response, Router
from litestar.datastructures import ResponseHeader
from litestar.di import Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from common.errors import JobqError
from common.web.app import SESSION_ROUTE
from services.producer.client import QueueServiceClient
from services.producer.console import actions, pages
from services.producer.console.sessions import NotSignedIn, Session, Sessions

HERE = Path(__file__).parent

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""Nothing inline and nothing from elsewhere: an injected script or style does not run."""

HEADERS = [
    ResponseHeader(name="Content-Security-Policy", value=CONTENT_SECURITY_POLICY),
    ResponseHeader(name="X-Content-Type-Options", value="nosniff"),
    ResponseHeader(name="X-Frame-Options", value="DENY"),
    ResponseHeader(name="Referrer-Policy", value="no-referrer"),
    ResponseHeader(name="Cache-Control", value="no-store"),
]


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    """The console's templates (autoescaped HTML)."""
    return TemplateConfig(directory=HERE / "templates", engine=JinjaTemplateEngine)


async def _session(request: Request[Any, Any, Any]) -> Session:
    if request.route_handler.opt.get("public"):
        raise NotSignedIn("the sign-in pages have no session")
    sessions: Sessions = request.app.state.console_sessions
    return await sessions.current(request)


def _sessions(request: Request[Any, Any, Any]) -> Sessions:
    sessions: Sessions = request.app.state.console_sessions
    return sessions


def _queue(request: Request[Any, Any, Any]) -> QueueServiceClient:
    queue: QueueServiceClient = request.app.state.queue
    return queue


def _not_signed_in(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    # A page asks the browser to sign in; htmx's poll gets a 401 (it then stops swapping).
    if request.headers.get("hx-request") or request.method != "GET":
        return Response("sign in again", status_code=401, media_type="text/plain")
    return Redirect("/console/login", status_code=303)


def _failed(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """A refusal (`JobqError`: 403, 404, 409, 422, 503 …) or a bad query string, as a page
    naming the problem and its fields; never a stack trace."""
    if isinstance(exc, JobqError):
        status, title, detail, errors = exc.status, exc.title, exc.detail, exc.errors
    elif isinstance(exc, ValidationException):
        extra = exc.extra if isinstance(exc.extra, list) else []
        status, title, detail = 400, "Invalid input", "a query parameter is not valid"
        errors = [
            {"pointer": str(e.get("key", "")), "detail": str(e.get("message", ""))}
            for e in extra
            if isinstance(e, dict)
        ]
    elif isinstance(exc, HTTPException):
        status, title, detail, errors = exc.status_code, "Refused", str(exc.detail), []
    else:
        status, title, detail, errors = 500, "Internal error", "something went wrong", []
    return Template(
        template_name="error.html",
        context={"status": status, "title": title, "detail": detail, "errors": errors},
        status_code=status,
        headers={h.name: h.value or "" for h in HEADERS},
    )


def console_router() -> Router:
    """`/console` and `/console/static`; the app holds `console_sessions` and `queue` in its
    state and `template_config()` as its template config."""
    static = create_static_files_router(
        path="/static",
        directories=[HERE / "static"],
        opt={SESSION_ROUTE: True},
        include_in_schema=False,
        name="console-static",
    )
    return Router(
        path="/console",
        route_handlers=[
            pages.overview,
            pages.queues_fragment,
            pages.jobs,
            pages.job_page,
            pages.dead_letters,
            pages.workers,
            pages.schedules,
            pages.login_form,
            actions.sign_in,
            actions.sign_out,
            actions.job_action,
            actions.bulk,
            actions.redrive,
            static,
        ],
        dependencies={
            "session": Provide(_session),
            "sessions": Provide(_sessions, sync_to_thread=False),
            "queue": Provide(_queue, sync_to_thread=False),
        },
        exception_handlers={
            NotSignedIn: _not_signed_in,
            JobqError: _failed,
            ValidationException: _failed,
            HTTPException: _failed,
            Exception: _failed,
        },
        response_headers=HEADERS,
        opt={SESSION_ROUTE: True},
        include_in_schema=False,
    )
