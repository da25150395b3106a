"""Typed HTTP calls between jobq services, mapping problem details back to `JobqError`s."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import httpx
import msgspec

from common.errors import JobqError, ServiceUnavailable, from_problem

T = TypeVar("T")
logger = logging.getLogger(__name__)

_JSON = {"Content-Type": "application/json"}


def make_client(
    base_url: str,
    *,
    token: str | None = None,
    timeout: float = 10.0,
    connect_retries: int = 2,
    max_connections: int = 100,
) -> httpx.AsyncClient:
    """A pooled `httpx.AsyncClient` for service-to-service calls.

    Connection failures are retried by httpx's transport (`connect_retries` times), which is
    safe for every jobq call: submits carry their job id and settles are idempotent.
    Timeouts are in seconds; `token` is sent as `Authorization: Bearer <token>`.
    """
    transport = httpx.AsyncHTTPTransport(
        retries=connect_retries,
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        ),
    )
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return httpx.AsyncClient(
        base_url=base_url,
        transport=transport,
        timeout=httpx.Timeout(timeout, connect=3.0),
        headers=headers,
    )


async def call(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    read_timeout: float | None = None,
    params: dict[str, str | int] | None = None,
) -> httpx.Response:
    """Send one request (body encoded with msgspec) and return a 2xx response.

    Raises the `JobqError` a problem-details reply describes, and ServiceUnavailable when the
    peer cannot be reached or times out.
    """
    content = None if body is None else msgspec.json.encode(body)
    kwargs: dict[str, Any] = {
        "content": content,
        "headers": _JSON if content is not None else None,
        "params": params,
    }
    if read_timeout is not None:
        kwargs["timeout"] = httpx.Timeout(read_timeout, connect=3.0)
    try:
        response = await client.request(method, path, **kwargs)
    except httpx.TransportError as exc:
        # The address stays in the log: a public caller of the producer must not learn it.
        logger.warning(
            "%s %s%s failed: %s",
            method,
            client.base_url,
            path,
            type(exc).__name__,
            extra={"event": "upstream_unavailable"},
        )
        raise ServiceUnavailable("a jobq service is unreachable; retry shortly") from exc
    if response.is_success:
        return response
    try:
        problem = response.json()
    except ValueError:
        problem = None
    raise from_problem(problem, response.status_code)


def decode(response: httpx.Response, type_: type[T]) -> T:
    """Decode a JSON reply into `type_`; a reply of the wrong shape is a JobqError."""
    try:
        return msgspec.json.decode(response.content, type=type_)
    except msgspec.DecodeError as exc:
        raise JobqError(f"unexpected reply from {response.request.url}: {exc}") from exc
