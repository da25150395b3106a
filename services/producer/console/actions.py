"""The console's forms (POST): sign in and out, a job's retry / cancel / delete, bulk actions
with a confirmation that states the count, and redrive after a dry-run count. Every form but
the sign-in carries the session's CSRF token; only admin keys act."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Request, post
from litestar.datastructures import FormMultiDict
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect, Template

from common.contracts import JobStatus, RedriveRequest
from common.errors import Forbidden, InvalidInput
from common.operations import BULK_LIMIT_MAX, BulkRequest
from services.producer.client import QueueServiceClient
from services.producer.console.pages import name_or_none, page, scope_of, status_or_none
from services.producer.console.sessions import (
    COOKIE_PATH,
    LOGIN_COOKIE,
    NotSignedIn,
    Session,
    Sessions,
    check_csrf,
    check_login_token,
    ended,
    login_cookie,
)

_ACTIONS = ("retry", "cancel", "delete")


async def _form(request: Request[Any, Any, Any]) -> FormMultiDict:
    form: FormMultiDict = await request.form()
    return form


def _acting(session: Session, form: FormMultiDict) -> None:
    """Raise Forbidden unless the form is this session's (CSRF) and its key may act."""
    check_csrf(session, form.get("csrf"))
    if not session.may_act:
        raise Forbidden("a submit key reads; retry, cancel, delete and redrive need an admin key")


def _name(form: FormMultiDict, field: str) -> str | None:
    """An optional queue / task type / tenant name of the form; InvalidInput when malformed."""
    return name_or_none(form.get(field), field, star=field == "tenant")


def _confirm(
    session: Session, action: str, count: int, target: str, form: FormMultiDict
) -> Template:
    """The page that states the dry-run `count` and posts `form` again, confirmed, to
    `target`."""
    hidden = [(k, v) for k, v in form.multi_items() if k not in ("csrf", "confirmed")]
    return page("confirm.html", session, action=action, count=count, target=target, hidden=hidden)


@post("/login", name="console-sign-in", opt={"public": True})
async def sign_in(
    request: Request[Any, Any, Any], sessions: NamedDependency[Sessions]
) -> Redirect | Template:
    """Exchange the form's API key for a session; the key is not kept."""
    form = await _form(request)
    check_login_token(request, form.get("login_token"))
    try:
        session_id, _ = await sessions.sign_in(str(form.get("api_key") or ""))
    except NotSignedIn as exc:
        token, cookie = login_cookie(request)
        return Template(
            template_name="login.html",
            context={"login_token": token, "error": exc.detail},
            cookies=[cookie],
            status_code=401,
        )
    response = Redirect("/console/", status_code=303)
    response.set_cookie(sessions.session_cookie(request, session_id))
    response.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return response


@post("/logout", name="console-sign-out")
async def sign_out(
    request: Request[Any, Any, Any],
    session: NamedDependency[Session],
    sessions: NamedDependency[Sessions],
) -> Redirect:
    """End the session, here and in the browser."""
    check_csrf(session, (await _form(request)).get("csrf"))
    await sessions.sign_out(request)
    return ended(Redirect("/console/login", status_code=303))  # type: ignore[return-value]


@post("/jobs/{job_id:uuid}/{action:str}", name="console-job-action")
async def job_action(
    request: Request[Any, Any, Any],
    session: NamedDependency[Session],
    queue: NamedDependency[QueueServiceClient],
    job_id: FromPath[uuid.UUID],
    action: FromPath[str],
) -> Redirect:
    """Retry, cancel or delete one job, then show it (or the jobs after a delete)."""
    _acting(session, await _form(request))
    if action not in _ACTIONS:
        raise InvalidInput(f"unknown action {action!r}; use retry, cancel or delete")
    scope = session.caller.scope
    if action == "delete":
        await queue.delete(job_id, scope)
        return Redirect("/console/jobs", status_code=303)
    await queue.act(job_id, action, scope)
    return Redirect(f"/console/jobs/{job_id}", status_code=303)


@post("/jobs/bulk", name="console-bulk")
async def bulk(
    request: Request[Any, Any, Any],
    session: NamedDependency[Session],
    queue: NamedDependency[QueueServiceClient],
) -> Template:
    """The selected jobs (`ids`) or all matching the filter (`all=1`): the first post counts
    them and asks to confirm that number; the confirmed post (`confirmed=1`) changes them."""
    form = await _form(request)
    _acting(session, form)
    action = form.get("action")
    if action not in _ACTIONS:
        raise InvalidInput("choose retry, cancel or delete")
    fields: dict[str, Any] = {"action": action, "limit": BULK_LIMIT_MAX}
    if form.get("all") == "1":
        status = status_or_none(form.get("status"))
        fields |= {"status": status, "queue": _name(form, "queue")}
        fields["taskType"] = _name(form, "task_type")
    else:
        try:
            ids = [str(uuid.UUID(value)) for value in form.getall("ids", [])]
        except ValueError:
            raise InvalidInput("a selected job id is not an id") from None
        if not ids:
            raise InvalidInput("select jobs, or choose all matching")
        fields["ids"] = ids[:500]
    try:
        request_body = msgspec.convert(
            {k: v for k, v in fields.items() if v is not None}, BulkRequest
        )
    except msgspec.ValidationError as exc:
        raise InvalidInput(f"the filter is not valid: {exc}") from None
    scope = scope_of(session, _name(form, "tenant"))
    if form.get("confirmed") != "1":
        dry = msgspec.structs.replace(request_body, dry_run=True)
        counted = await queue.bulk(dry, scope)
        return _confirm(session, str(action), counted.matched, "/console/jobs/bulk", form)
    done = await queue.bulk(request_body, scope)
    return page("done.html", session, action=action, reply=done)


@post("/dead-letters/redrive", name="console-redrive")
async def redrive(
    request: Request[Any, Any, Any],
    session: NamedDependency[Session],
    queue: NamedDependency[QueueServiceClient],
) -> Template:
    """Redrive a queue's (and task type's) dead letters: a dry-run count to confirm first,
    then the number moved."""
    form = await _form(request)
    _acting(session, form)
    queue_name, task_type = _name(form, "queue"), _name(form, "task_type")
    scope = scope_of(session, _name(form, "tenant"))
    if form.get("confirmed") != "1":
        dry = BulkRequest(
            action="retry",
            status=JobStatus.DEAD_LETTER,
            queue=queue_name,
            task_type=task_type,
            dry_run=True,
        )
        counted = await queue.bulk(dry, scope)
        return _confirm(session, "redrive", counted.matched, "/console/dead-letters/redrive", form)
    moved = await queue.redrive(RedriveRequest(queue=queue_name, task_type=task_type), scope)
    return page("done.html", session, action="redrive", moved=moved.moved)
