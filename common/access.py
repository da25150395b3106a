"""Bearer-token access (docs/architecture.md#access): API keys with roles on the producer, one token
on the queue service. Tokens are compared in constant time and never logged."""

from __future__ import annotations

import enum
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from common.errors import Forbidden, Unauthorized

PROBE_PATHS = ("/health/live", "/health/ready", "/metrics")
"""Paths every service serves without credentials: probes and scrapes."""

Guard = Callable[[ASGIConnection[Any, Any, Any, Any], BaseRouteHandler], Awaitable[None]]
"""Guards are coroutines: Litestar runs synchronous guards on a thread pool, which costs more
than a constant-time compare."""


class Role(enum.StrEnum):
    """`submit` creates and reads jobs; `admin` may also list, cancel, retry and redrive."""

    SUBMIT = "submit"
    ADMIN = "admin"


def parse_api_keys(spec: str) -> dict[str, Role]:
    """Parse `JOBQ_API_KEYS` (`role:key,role:key`) into {key: role}.

    Raises ValueError (naming no key) for an unknown role, a key shorter than 16 characters,
    or a key listed twice.
    """
    keys: dict[str, Role] = {}
    for index, entry in enumerate(part.strip() for part in spec.split(",") if part.strip()):
        role, sep, key = entry.partition(":")
        if not sep or role not in Role.__members__.values():
            raise ValueError(f"entry {index + 1}: expected role:key with role submit or admin")
        if len(key) < 16 or any(c.isspace() for c in key):
            raise ValueError(f"entry {index + 1}: keys need 16+ characters and no spaces")
        if key in keys:
            raise ValueError(f"entry {index + 1}: the same key is listed twice")
        keys[key] = Role(role)
    return keys


def _bearer(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send Authorization: Bearer <key>")
    return token.strip()


def _is_public(connection: ASGIConnection[Any, Any, Any, Any], *, schema: bool) -> bool:
    path = connection.url.path
    if path in PROBE_PATHS:
        return True
    return schema and (path == "/schema" or path.startswith("/schema/"))


def _match(token: str, candidates: dict[str, Role]) -> Role | None:
    # Compare against every key so timing reveals neither the key nor which one matched.
    found: Role | None = None
    for key, role in candidates.items():
        if hmac.compare_digest(token.encode(), key.encode()):
            found = role
    return found


ADMIN_ONLY = {"role": Role.ADMIN}
"""`opt` for a route handler that needs an admin key; other routes need a submit key."""


def role_guard(keys: dict[str, Role]) -> Guard:
    """A Litestar guard: 401 without a known key, 403 when the handler's `opt["role"]` is
    admin and the key's is not. With no keys configured, access is open (development)."""

    async def guard(
        connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
    ) -> None:
        # The public API's description is public; the internal one is not.
        if not keys or _is_public(connection, schema=True):
            return
        role = _match(_bearer(connection), keys)
        if role is None:
            raise Unauthorized("unknown API key")
        if handler.opt.get("role") is Role.ADMIN and role is not Role.ADMIN:
            raise Forbidden("this operation needs an admin key")

    return guard


def token_guard(token: str | None) -> Guard:
    """A Litestar guard for the queue service: every route but health and metrics needs
    `Authorization: Bearer <QUEUE_INTERNAL_TOKEN>` once it is set (docs/architecture.md#access)."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        if token is None or _is_public(connection, schema=False):
            return
        if _match(_bearer(connection), {token: Role.ADMIN}) is None:
            raise Unauthorized("unknown internal token")

    return guard
