"""Console sign-in: an API key exchanged for a server-side session, and CSRF tokens.

The browser holds only an opaque session id (256 random bits) in a cookie that is `HttpOnly`,
`SameSite=Strict`, scoped to `/console`, and `Secure` whenever the request came over TLS (as
the server sees it, `X-Forwarded-Proto` from `HTTP_TRUSTED_PROXIES` included); the key itself
never reaches the browser again after the sign-in form. The session (the key's role, tenant
and key id, never the key) lives in the producer's store (Redis, shared by every replica,
with the memory fallback of the rate limits) for `CONSOLE_SESSION_TTL`; signing out deletes
it. Every state-changing form carries the session's CSRF token, compared in constant time
(OWASP CSRF Prevention Cheat Sheet: "synchronizer token pattern"); the sign-in form, which has
no session yet, carries the token of a short-lived pre-session cookie instead (double submit).
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.datastructures import Cookie
from litestar.stores.base import Store

from common.errors import Forbidden, Unauthorized
from common.web.access import ApiKeys, Caller, Role

SESSION_COOKIE = "jobq_console"
LOGIN_COOKIE = "jobq_console_login"
COOKIE_PATH = "/console"
_PREFIX = "console-session:"
LOGIN_TOKEN_SECONDS = 600
"""How long a sign-in form may stay open before it must be loaded again."""


class NotSignedIn(Unauthorized):
    """No session, or it expired or was ended: the console redirects to its sign-in page."""


class Session(msgspec.Struct, frozen=True):
    """A signed-in console user: the key's role, tenant and key id, and the CSRF token of
    this session's forms."""

    role: str
    tenant: str
    key_id: str
    csrf: str

    @property
    def caller(self) -> Caller:
        """The caller the API would see for the same key."""
        return Caller(Role(self.role), self.tenant, self.key_id)

    @property
    def may_act(self) -> bool:
        """Admins act (retry, cancel, delete, redrive); a submit key only reads."""
        return self.role == Role.ADMIN.value


class Sessions:
    """Sessions in `store`, `ttl` seconds each, for the API keys `keys` (none: open access,
    every sign-in is an admin of every tenant, as the API is then)."""

    def __init__(self, store: Store, keys: ApiKeys, ttl: int) -> None:
        self._store = store
        self._keys = keys
        self._ttl = ttl

    async def sign_in(self, api_key: str) -> tuple[str, Session]:
        """A new session for `api_key`; returns its id and the session. Raises NotSignedIn
        for an unknown key (the API's words: "unknown API key")."""
        if self._keys:
            caller = self._keys.resolve(api_key.strip())
            if caller is None:
                raise NotSignedIn("unknown API key")
        else:
            caller = Caller(Role.ADMIN, "*")
        session = Session(caller.role.value, caller.tenant, caller.key_id, secrets.token_hex(32))
        session_id = secrets.token_urlsafe(32)
        await self._store.set(_PREFIX + session_id, msgspec.json.encode(session), self._ttl)
        return session_id, session

    async def current(self, request: Request[Any, Any, Any]) -> Session:
        """The session of the request's cookie; raises NotSignedIn without a live one."""
        session_id = request.cookies.get(SESSION_COOKIE)
        if not session_id or len(session_id) > 128:
            raise NotSignedIn("sign in with an API key")
        raw = await self._store.get(_PREFIX + session_id)
        if raw is None:
            raise NotSignedIn("the session ended; sign in again")
        return msgspec.json.decode(raw, type=Session)

    async def sign_out(self, request: Request[Any, Any, Any]) -> None:
        """End the request's session (nothing when there is none)."""
        session_id = request.cookies.get(SESSION_COOKIE)
        if session_id and len(session_id) <= 128:
            await self._store.delete(_PREFIX + session_id)

    def session_cookie(self, request: Request[Any, Any, Any], session_id: str) -> Cookie:
        """The cookie carrying `session_id` (expiring with the session)."""
        return _cookie(request, SESSION_COOKIE, session_id, self._ttl)


def _cookie(request: Request[Any, Any, Any], name: str, value: str, max_age: int) -> Cookie:
    return Cookie(
        key=name,
        value=value,
        path=COOKIE_PATH,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def login_cookie(request: Request[Any, Any, Any]) -> tuple[str, Cookie]:
    """A fresh sign-in form token and the pre-session cookie that carries it."""
    token = secrets.token_hex(32)
    return token, _cookie(request, LOGIN_COOKIE, token, LOGIN_TOKEN_SECONDS)


def check_login_token(request: Request[Any, Any, Any], sent: str | None) -> None:
    """Raise Forbidden unless the sign-in form's token matches its pre-session cookie."""
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not sent or not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Forbidden("the sign-in form expired or was not this site's; load it again")


def check_csrf(session: Session, sent: str | None) -> None:
    """Raise Forbidden unless `sent` is the session's CSRF token (a forged or stale form)."""
    if not sent or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise Forbidden("the form's CSRF token is missing or wrong; reload the page")


def ended(response: Response[Any]) -> Response[Any]:
    """`response`, deleting the session cookie in the browser."""
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return response
