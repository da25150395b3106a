"""Bearer-token access (docs/architecture.md#access): API keys with a role and a tenant on the
producer, one token on the queue service. Tokens are never logged, and checking one reveals
nothing about the keys through timing.

Every API key belongs to a tenant (docs/architecture.md#tenants). Its jobs record that tenant;
reads, cancels, retries, listings and redrives see that tenant's jobs only, and an admin key
of the tenant `*` sees every tenant's.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import logging
import re
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection

from common.contracts import NAME_PATTERN
from common.errors import Forbidden, Unauthorized

logger = logging.getLogger(__name__)

PROBE_PATHS = ("/health/live", "/health/ready", "/metrics")
"""Paths every service serves without credentials: probes and scrapes."""

RequestCheck = Callable[[Request[Any, Any, Any]], Awaitable[None]]
"""A step of the apps' `before_request` hook. Coroutines: Litestar runs a synchronous hook on
a thread pool, which costs more than a constant-time compare."""

ALL_TENANTS = "*"
"""The tenant of an admin key that sees every tenant's jobs."""
DEFAULT_TENANT = "default"
"""The tenant of keys given as `role:key`, of jobs made without a tenant (recurring jobs, the
client library's default) and of jobs a global admin submits."""
_TENANT = re.compile(NAME_PATTERN)


class Role(enum.StrEnum):
    """`submit` creates and reads jobs; `admin` may also list, cancel, retry and redrive."""

    SUBMIT = "submit"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: the key's role and tenant (a tenant name, or `*` for all)."""

    role: Role
    tenant: str
    key_id: str = field(default="", compare=False)
    """The first 12 hex digits of the key's SHA-256 ("" for open access): names the key in
    records (who paused a queue) without revealing it."""

    @property
    def actor(self) -> str:
        """How records name this caller: `<role>:<tenant>:key-<key_id>`, or `open-access`."""
        if not self.key_id:
            return "open-access"
        return f"{self.role}:{self.tenant}:key-{self.key_id}"

    @property
    def scope(self) -> str | None:
        """The tenant whose jobs this caller may see, None for every tenant."""
        return None if self.tenant == ALL_TENANTS else self.tenant

    @property
    def owner(self) -> str:
        """The tenant that owns the jobs this caller submits."""
        return DEFAULT_TENANT if self.tenant == ALL_TENANTS else self.tenant


OPEN_ACCESS = Caller(Role.ADMIN, ALL_TENANTS)
"""The caller of every request when no key is configured (development only)."""


_FORMS = "role:tenant:key (or role:key for tenant default)"


def _parse_entry(entry: str, where: str) -> tuple[str, Caller]:
    # The number of fields decides, never what they look like: two are the older `role:key`,
    # three or more `role:tenant:key`, whose key may hold colons. A second field that is no
    # tenant name is refused, not read as the head of an older key: `admin:ACME:<key>` once
    # meant an admin of `default` with key `ACME:<key>`. Errors never quote the entry, whose
    # fields may be parts of a key.
    role, _, rest = entry.partition(":")
    if role not in Role.__members__.values():
        raise ValueError(f"{where}: expected {_FORMS}, role submit or admin")
    tenant, sep, key = rest.partition(":")
    if not sep:
        tenant, key = DEFAULT_TENANT, rest
    elif not (tenant == ALL_TENANTS or _TENANT.fullmatch(tenant)):
        raise ValueError(
            f"{where}: the tenant, the second of three fields, must be * or a name of "
            "lowercase letters, digits and . _ - (64 at most); a key holding ':' needs all "
            "three fields, role:default:<key> for the default tenant"
        )
    if tenant == ALL_TENANTS and role != Role.ADMIN:
        raise ValueError(f"{where}: only admin keys may have the tenant *")
    if len(key) < 16 or any(c.isspace() for c in key):
        raise ValueError(f"{where}: keys need 16+ characters and no spaces")
    return key, Caller(Role(role), tenant, key_id=hashlib.sha256(key.encode()).hexdigest()[:12])


def _entries(spec: str, source: str, lines: bool) -> list[tuple[str, str]]:
    """(where, entry) of each entry of `spec`: by line number when `lines` (a keys file; and
    by position within the line when it holds several, comma-separated), else by position."""
    found: list[tuple[str, str]] = []
    for number, line in enumerate(spec.splitlines(), 1):
        if line.strip().startswith("#"):
            continue
        fields = line.split(",")
        for position, text in enumerate(fields, 1):
            entry = text.strip()
            if not entry:
                continue
            if not lines:
                where = f"{source} entry {len(found) + 1}"
            elif len(fields) > 1:
                where = f"{source} line {number} entry {position}"
            else:
                where = f"{source} line {number}"
            where = where.lstrip()
            found.append((where, entry))
    return found


def parse_api_keys(spec: str, source: str = "", *, lines: bool = False) -> dict[str, Caller]:
    """Parse API key entries into {key: Caller}.

    `spec` holds entries separated by commas or newlines: `role:tenant:key` (tenant a name
    like a queue's, or `*` for an admin of every tenant; the key may hold colons) or the older
    `role:key` (tenant `default`; its key cannot hold a colon: write `role:default:<key>`).
    Lines starting with `#` and empty entries are skipped. Errors name the entry by its
    position (`entry 2`), or with `lines` (a keys file) by `source` and line
    (`/etc/jobq/keys line 3`).

    Raises ValueError (naming no key) for an unknown role, a second field that is no tenant
    name, the tenant `*` on a submit key, a key shorter than 16 characters, or a key listed
    twice.
    """
    keys: dict[str, Caller] = {}
    for where, entry in _entries(spec, source, lines):
        key, caller = _parse_entry(entry, where)
        if key in keys:
            raise ValueError(f"{where}: the same key is listed twice")
        keys[key] = caller
    return keys


class ApiKeys:
    """The configured API keys, looked up by the SHA-256 digest of a presented token.

    A dictionary lookup by digest costs the same for one key or a hundred thousand, and its
    timing can only tell an attacker about digests, never about a key (the "store a hash of
    the key" advice of OWASP's API security guidance). An empty set means open access.
    """

    def __init__(self, keys: dict[str, Caller]) -> None:
        self._by_digest = {_digest(key): caller for key, caller in keys.items()}

    def __bool__(self) -> bool:
        return bool(self._by_digest)

    def __len__(self) -> int:
        return len(self._by_digest)

    def resolve(self, token: str) -> Caller | None:
        """The caller `token` identifies, or None for an unknown token."""
        return self._by_digest.get(_digest(token))

    def tenants(self) -> set[str]:
        """Every tenant a key names (`*` included)."""
        return {caller.tenant for caller in self._by_digest.values()}


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def bearer_token(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _bearer(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    token = bearer_token(connection)
    if token is None:
        raise Unauthorized("send Authorization: Bearer <key>")
    return token


def _is_public(connection: ASGIConnection[Any, Any, Any, Any], *, schema: bool) -> bool:
    path = connection.url.path
    if path in PROBE_PATHS:
        return True
    return schema and (path == "/schema" or path.startswith("/schema/"))


ADMIN_ONLY = {"role": Role.ADMIN}
"""`opt` for a route handler that needs an admin key; other routes need a submit key."""


def caller_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Caller:
    """The caller `role_check` identified for this request."""
    caller: Caller = connection.state.caller
    return caller


def role_check(keys: ApiKeys) -> RequestCheck:
    """Authentication for the producer, a step of the `before_request` hook
    (`common.web.app.request_checks`): 401 without a known key, 403 when the route handler's
    `opt["role"]` is admin and the key's is not. It records the `Caller` for `caller_of`.
    With no keys configured, access is open (development) and every caller is a global admin.

    A hook step rather than a Litestar guard: Litestar copies the route handler for every
    guard call, 4 % of the producer's CPU per submit (py-spy at 800/s, issue 17)."""

    async def check(request: Request[Any, Any, Any]) -> None:
        if not keys:
            request.state.caller = OPEN_ACCESS
            return
        # The public API's description is public; the internal one is not.
        if _is_public(request, schema=True):
            return
        caller = keys.resolve(_bearer(request))
        if caller is None:
            raise Unauthorized("unknown API key")
        if request.route_handler.opt.get("role") is Role.ADMIN and caller.role is not Role.ADMIN:
            raise Forbidden("this operation needs an admin key")
        request.state.caller = caller

    return check


def token_check(token: str | None) -> RequestCheck:
    """Authentication for the queue service, a step of the `before_request` hook
    (`common.web.app.request_checks`): every route but health and metrics needs
    `Authorization: Bearer <QUEUE_INTERNAL_TOKEN>` once it is set (docs/architecture.md#access).

    Health and metrics need no token, but a wrong one presented there is refused too (401), so
    a caller holding a wrong token finds out from its readiness probe."""
    expected = token.encode() if token is not None else None

    async def check(request: Request[Any, Any, Any]) -> None:
        if expected is None:
            return
        presented = bearer_token(request)
        if presented is None and _is_public(request, schema=False):
            return
        if presented is None:
            raise Unauthorized("send Authorization: Bearer <key>")
        if not hmac.compare_digest(presented.encode(), expected):
            raise Unauthorized("unknown internal token")

    return check


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a service reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_open_access(
    service: str, host: str, unset: Iterable[str], *, insecure_allowed: bool
) -> None:
    """Fail closed (docs/architecture.md#access): a service whose credentials (`unset`, the
    variable names) are not configured runs open, which is allowed only on a loopback bind or
    with `JOBQ_INSECURE_OPEN_ACCESS=1`. Logs a WARNING whenever it runs open; raises
    SystemExit(2) with the reason when it must not start."""
    missing = list(unset)
    if not missing:
        return
    names = " and ".join(missing)
    if is_loopback(host) or insecure_allowed:
        why = "JOBQ_INSECURE_OPEN_ACCESS=1" if not is_loopback(host) else "a loopback bind"
        logger.warning(
            "%s runs with open access: %s unset (allowed by %s); never expose it like this",
            service,
            names,
            why,
            extra={"event": "open_access"},
        )
        return
    message = (
        f"jobq: {service} refuses to listen on {host} with open access: set {names}, bind "
        "127.0.0.1, or set JOBQ_INSECURE_OPEN_ACCESS=1 to run open on purpose"
    )
    logger.error(message, extra={"event": "open_access_refused"})
    print(message, file=sys.stderr)
    raise SystemExit(2)
