"""The `webhook` processor: POST a job's JSON body to a URL, once per attempt.

Payload (a JSON object; other keys are refused so a typo does not silently drop a setting):

    {"url": "https://example.com/hook",   # required, http or https
     "body": <any JSON>,                    # optional, default null; sent as the request body
     "headers": {"X-Name": "value"},        # optional, printable-ASCII values
     "timeoutSeconds": 10}                  # optional, 0 < t <= 300, else WEBHOOK_TIMEOUT

Each attempt sends `Idempotency-Key: <job id>` so the receiver can deduplicate retries of the same
job (the header convention of Stripe's API and the IETF draft "The Idempotency-Key HTTP Header
Field"). Outcomes: 2xx → `{"status": code}`; 5xx, 408 and 429 → `Retry` (honouring a numeric
`Retry-After` on 429/503, RFC 9110 §10.2.3); any other status → `NonRetryable`; network errors and
timeouts → `Retry`. Redirects are not followed: a 3xx could point the request at an internal
address after the destination check.

SSRF guard (OWASP Server-Side Request Forgery Prevention Cheat Sheet, "deny private and reserved
addresses"; docs/architecture.md#webhooks): the host is resolved once and the job is refused if
any address is not publicly routable, unless the host (or host and port) is listed in
`WEBHOOK_ALLOWED_HOSTS`. The connection then goes to an address of that one answer, never to a
second lookup's: the client from `webhook_client` connects through `PinnedBackend`, which knows
only the addresses checked for this attempt, while the URL keeps the name, so the `Host` header,
TLS SNI and certificate verification all use the name (a DNS answer that changes between check
and connect, DNS rebinding, changes nothing). One deadline covers the whole attempt: resolving,
connecting, sending and reading the reply, however slowly it trickles in. A refusal stored as the
job's `lastError` names the host and the kind of address, never the address itself, which is
logged on the worker instead: the submitter must not learn the internal network's layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import json
import logging
import math
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpcore
import httpx

from common.logging import RepeatedEvents
from jobq.processors import JobContext, NonRetryable, Retry
from services.worker.processors.spans import outbound_span

logger = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""`async (host, port) -> [address, ...]`; raises OSError when the name does not resolve."""

MAX_TIMEOUT_SECONDS: Final = 300.0
MAX_RETRY_AFTER_SECONDS: Final = 3600.0
_PAYLOAD_KEYS: Final = frozenset({"url", "body", "headers", "timeoutSeconds"})
# Headers the processor owns; framing headers are included because overriding them would make
# httpx send a malformed request.
_RESERVED_HEADERS: Final = frozenset(
    {"idempotency-key", "content-type", "host", "content-length", "transfer-encoding", "connection"}
)
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 §5.6.2 token
_HEADER_VALUE: Final = re.compile(r"[\t\x20-\x7e]*")
_RETRY_AFTER: Final = re.compile(r"\d+(?:\.\d+)?")
_SNIPPET_BYTES: Final = 512
_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")


_PINNED: contextvars.ContextVar[Mapping[tuple[str, int], Sequence[str]] | None] = (
    contextvars.ContextVar("webhook_pinned_addresses", default=None)
)
"""The addresses checked for the attempt running in this task, by (host, port)."""


@contextlib.contextmanager
def pinned(host: str, port: int, addresses: Sequence[str]) -> Iterator[None]:
    """Let connections made in this task to `host:port` go to `addresses` (checked) only."""
    token = _PINNED.set({(host.lower(), port): list(addresses)})
    try:
        yield
    finally:
        _PINNED.reset(token)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that never resolves a name: a connection to `host:port`
    goes to the addresses `pinned` for them in this task, in order, through `network` (the
    real network by default), and fails when none are pinned."""

    def __init__(self, network: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._network = network or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Connect to the first pinned address of `host:port` that accepts."""
        addresses = (_PINNED.get() or {}).get((host.lower(), port))
        if not addresses:
            raise httpcore.ConnectError(f"no checked address for {host}:{port}")
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._network.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Webhooks never go to a Unix socket."""
        raise httpcore.ConnectError("webhooks do not connect to Unix sockets")

    async def sleep(self, seconds: float) -> None:
        """Sleep as the underlying network backend does."""
        await self._network.sleep(seconds)


_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a `PinnedBackend`; `verify` as in httpx (an SSLContext, a CA
    bundle path, or True for the system's). Proxy variables are ignored: a proxy would resolve
    the destination itself."""

    def __init__(
        self,
        *,
        network: httpcore.AsyncNetworkBackend | None = None,
        verify: ssl.SSLContext | bool = True,
        limits: httpx.Limits = _LIMITS,
    ) -> None:
        super().__init__(verify=verify, trust_env=False, limits=limits)
        # httpx takes no network backend, so the pool it built is replaced by the same pool
        # over the pinned backend.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=PinnedBackend(network),
        )


def webhook_client(
    timeout: float,
    *,
    network: httpcore.AsyncNetworkBackend | None = None,
    verify: ssl.SSLContext | bool = True,
) -> httpx.AsyncClient:
    """The HTTP client webhooks need: connections only to pinned addresses, no redirects, no
    proxy or other settings from the environment, `timeout` (seconds) per operation.
    `network` and `verify` replace the real network and the system's CA store in tests."""
    return httpx.AsyncClient(
        transport=PinnedTransport(network=network, verify=verify),
        trust_env=False,
        follow_redirects=False,
        timeout=timeout,
    )


@dataclass(frozen=True, slots=True)
class AllowedHost:
    """A `WEBHOOK_ALLOWED_HOSTS` entry: a host name or IP, and optionally one port."""

    host: str
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> AllowedHost:
        """`name`, `name:port`, `1.2.3.4:port`, `::1`, `[::1]` or `[::1]:port`; raises
        ValueError for an empty host or a bad port."""
        text = entry.strip()
        host, port = text, None
        if text.startswith("["):
            host, bracket, rest = text[1:].partition("]")
            if not bracket or (rest and not rest.startswith(":")):
                raise ValueError(f"{entry!r}: expected [address] or [address]:port")
            port = rest[1:] if rest else None
        elif text.count(":") == 1:
            host, port = text.split(":")
        if not _valid_host(host) or (
            port is not None and not (port.isdigit() and 0 < int(port) < 65536)
        ):
            raise ValueError(f"{entry!r}: expected host, host:port or [address]:port")
        return cls(_normalise_host(host), int(port) if port is not None else None)

    def admits(self, host: str, port: int) -> bool:
        """Whether a request to `host:port` is allowed by this entry."""
        return self.host == _normalise_host(host) and self.port in (None, port)


@dataclass(frozen=True, slots=True)
class WebhookRequest:
    """A validated payload: where to POST, the encoded JSON body, extra headers, timeout (s)."""

    url: httpx.URL
    body: bytes
    headers: dict[str, str]
    timeout: float | None


class WebhookProcessor:
    """POSTs `payload.body` to `payload.url`; see the module docstring for shapes and outcomes.

    `http` is shared and owned by the caller, and should come from `webhook_client` (any other
    client resolves the name again when it connects); `allowed_hosts` are `WEBHOOK_ALLOWED_HOSTS`
    entries (`AllowedHost.parse`) exempt from the SSRF guard; `default_timeout` is the deadline
    of an attempt in seconds when the payload sets none. `resolver` replaces DNS in tests.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        allowed_hosts: Sequence[str],
        default_timeout: float,
        *,
        resolver: Resolver | None = None,
    ) -> None:
        self._http = http
        self._allowed_hosts = [AllowedHost.parse(entry) for entry in allowed_hosts]
        self._default_timeout = default_timeout
        self._resolve = resolver or resolve_host
        self._failures = RepeatedEvents()

    async def __call__(self, job: JobContext) -> dict[str, Any]:
        """Deliver one attempt; returns `{"status": code}` or raises Retry / NonRetryable."""
        request = parse_webhook_payload(job.payload)
        timeout = request.timeout or self._default_timeout
        host = request.url.host
        try:
            async with asyncio.timeout(timeout):
                code, headers, snippet = await self._attempt(job, request, timeout)
        except TimeoutError:
            raise Retry(f"webhook to {host} got no complete answer within {timeout:g}s") from None
        raise_for_status(code, headers, snippet)
        return {"status": code}

    async def _attempt(
        self, job: JobContext, request: WebhookRequest, read_timeout: float
    ) -> tuple[int, httpx.Headers, str]:
        """Resolve once, check, POST to a checked address; (status, headers, error snippet)."""
        url = request.url
        host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
        name = url.raw_host.decode("ascii")
        try:
            addresses = await self._resolve(name, port)
        except OSError as exc:  # socket.gaierror
            raise Retry(f"cannot resolve webhook host {host!r}: {exc!r}") from exc
        if not any(entry.admits(host, port) for entry in self._allowed_hosts):
            check_destination(host, addresses)
        headers = {
            **request.headers,
            "Content-Type": "application/json",
            "Idempotency-Key": str(job.id),
        }
        try:
            with pinned(name, port, addresses), outbound_span(url, port, headers) as span:
                async with self._http.stream(
                    "POST",
                    url,
                    content=request.body,
                    headers=headers,
                    timeout=read_timeout,
                    follow_redirects=False,
                ) as response:
                    code = response.status_code
                    if span is not None:
                        span.set_attribute("http.response.status_code", code)
                    snippet = "" if 200 <= code < 300 else await _read_snippet(response)
        except httpx.TransportError as exc:
            # The driver's text may carry the address it connected to: logged, not stored.
            # Folded per destination: a receiver that is down fails every attempt of every job.
            self._failures.log(
                logger,
                logging.WARNING,
                f"{host}:{port}",
                "webhook to %s:%d failed: %s: %s",
                host,
                port,
                type(exc).__name__,
                exc,
                extra={"event": "webhook_failed", "job_id": str(job.id)},
            )
            raise Retry(f"webhook to {host} failed: {type(exc).__name__}") from exc
        return code, response.headers, snippet


async def resolve_host(host: str, port: int) -> list[str]:
    """All addresses `host` resolves to for a TCP connection on `port`, deduplicated."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def parse_webhook_payload(payload: Mapping[str, Any]) -> WebhookRequest:
    """Validate the payload (shape in the module docstring); raises NonRetryable when bad."""
    unknown = sorted(set(payload) - _PAYLOAD_KEYS)
    if unknown:
        raise NonRetryable(
            f"webhook payload has unknown keys {unknown}; allowed: url, body, "
            "headers, timeoutSeconds"
        )
    return WebhookRequest(
        url=_parse_url(payload.get("url")),
        body=_encode_body(payload.get("body")),
        headers=_parse_headers(payload.get("headers")),
        timeout=_parse_timeout(payload.get("timeoutSeconds")),
    )


def _parse_url(value: object) -> httpx.URL:
    if not isinstance(value, str) or not value:
        raise NonRetryable("webhook payload needs `url`, a non-empty string")
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as exc:
        raise NonRetryable(f"webhook `url` is not a valid URL: {exc}") from exc
    if url.scheme not in ("http", "https"):
        raise NonRetryable(f"webhook `url` must be http or https, not {url.scheme or 'relative'}")
    if not url.host:
        raise NonRetryable("webhook `url` has no host")
    return url


def _encode_body(body: object) -> bytes:
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise NonRetryable(f"webhook `body` is not JSON-serialisable: {exc}") from exc
    return text.encode("utf-8")


def _parse_headers(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise NonRetryable("webhook `headers` must be an object of string to string")
    headers: dict[str, str] = {}
    for name, header_value in value.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise NonRetryable(f"webhook header name {name!r} is not a valid HTTP token")
        if name.lower() in _RESERVED_HEADERS:
            raise NonRetryable(f"webhook header {name!r} is set by jobq and cannot be overridden")
        if not isinstance(header_value, str) or not _HEADER_VALUE.fullmatch(header_value):
            raise NonRetryable(f"webhook header {name!r} needs a printable-ASCII string value")
        headers[name] = header_value
    return headers


def _parse_timeout(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise NonRetryable("webhook `timeoutSeconds` must be a number")
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise NonRetryable(f"webhook `timeoutSeconds` must be > 0 and <= {MAX_TIMEOUT_SECONDS:g}")
    return float(value)


_HOST_NAME: Final = re.compile(r"[A-Za-z0-9._-]+")


def _valid_host(host: str) -> bool:
    """A host name, or an IP address (IPv6 without brackets)."""
    if _HOST_NAME.fullmatch(host):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _normalise_host(host: str) -> str:
    return host.strip().lower().removeprefix("[").removesuffix("]")


def check_destination(host: str, addresses: list[str]) -> None:
    """Refuse a webhook to `host` unless every address it resolved to is publicly routable.

    `host` is as written in the URL; `addresses` are textual IPs (IPv6 may carry a `%scope`).
    Raises NonRetryable naming the host and the kind of the offending address (loopback,
    private, …) but not the address, which is logged at WARNING; an empty or unparsable
    address list is refused (fail closed). Source: OWASP SSRF Prevention Cheat Sheet
    (deny-list of non-public ranges, check every resolved address).
    """
    if not addresses:
        raise NonRetryable(f"refusing webhook to {host!r}: it resolved to no addresses")
    for address in addresses:
        found = non_public_reason(address)
        if found is not None:
            kind, detail = found
            logger.warning(
                "refusing webhook to %s: it resolves to %s (%s)",
                host,
                address,
                detail,
                extra={"event": "webhook_refused"},
            )
            raise NonRetryable(
                f"refusing webhook to {host!r}: it resolves to a non-public address ({kind}); "
                "list the host in WEBHOOK_ALLOWED_HOSTS to allow it"
            )


def non_public_reason(address: str) -> tuple[str, str] | None:
    """None for a publicly routable address, else (kind, detail): the kind of address
    (`loopback`, `private`, …, `IPv4-mapped loopback`) and a detail naming any embedded IPv4
    address (`IPv4-mapped 127.0.0.1 is loopback`)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "malformed", "not an IP address"
    reason = _classify(ip)
    if reason is not None:
        return reason, reason
    for label, embedded in _embedded_ipv4(ip):
        inner = _classify(embedded)
        if inner is not None:
            return f"{label} {inner}", f"{label} {embedded} is {inner}"
    return None


def _embedded_ipv4(ip: _IPAddress) -> list[tuple[str, ipaddress.IPv4Address]]:
    # IPv6 forms that carry an IPv4 address a gateway or the kernel may connect to instead.
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    if ip.ipv4_mapped is not None:
        found.append(("IPv4-mapped", ip.ipv4_mapped))
    if ip.sixtofour is not None:
        found.append(("6to4", ip.sixtofour))
    if ip.teredo is not None:
        found.append(("Teredo client", ip.teredo[1]))
    if ip in _NAT64:
        found.append(("NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
    return found


def _classify(ip: _IPAddress) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return None  # judged by its embedded IPv4 address
    checks = (
        (ip.is_unspecified, "unspecified"),
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local"),
        (ip.is_multicast, "multicast"),
        (isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local, "site-local"),
        (ip.is_private, "private"),
        (ip.is_reserved, "reserved"),
        # e.g. 100.64.0.0/10 shared address space, where some clouds keep metadata services
        (not ip.is_global, "not globally routable"),
    )
    return next((reason for flagged, reason in checks if flagged), None)


def raise_for_status(code: int, headers: httpx.Headers, snippet: str = "") -> None:
    """Map a non-2xx status to Retry (5xx, 408, 429) or NonRetryable (the rest).

    The message always contains the code; `snippet` (start of the response body) is appended.
    """
    if 200 <= code < 300:
        return
    detail = f"webhook answered {code}" + (f": {snippet}" if snippet else "")
    if 500 <= code < 600 or code in (408, 429):
        after = retry_after_seconds(headers) if code in (429, 503) else None
        raise Retry(detail, after=after)
    raise NonRetryable(detail)


def retry_after_seconds(headers: httpx.Headers) -> float | None:
    """A numeric `Retry-After` in seconds, capped at one hour; None if absent or an HTTP-date."""
    value = headers.get("retry-after", "").strip()
    if not _RETRY_AFTER.fullmatch(value):
        return None
    return min(float(value), MAX_RETRY_AFTER_SECONDS)


async def _read_snippet(response: httpx.Response) -> str:
    # Only the start of an error body is worth keeping, and reading all of it could be unbounded.
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= _SNIPPET_BYTES:
                break
    except httpx.HTTPError:
        pass  # the status decides the outcome; a broken error body must not change it
    text = b"".join(chunks)[:_SNIPPET_BYTES].decode("utf-8", "replace")
    return " ".join(text.split())[:200]
