"""Serve a Litestar app with uvicorn, within connection, time and size limits, telling the app
the moment a shutdown begins (docs/architecture.md#connection-limits).

uvicorn bounds concurrency (`limit_concurrency`: requests beyond it are answered 503) and idle
keep-alive connections (`timeout_keep_alive`), but it waits forever for a request's headers
and body, and its httptools parser takes headers of any size. `limited_protocol` adds what is
missing to uvicorn's own httptools protocol, the way nginx's `client_header_timeout`,
`client_body_timeout` and `large_client_header_buffers` do:

- **Header deadline**: a connection must deliver a request's complete headers within
  `header_timeout` seconds of opening (or of its first byte, for the next request on a
  keep-alive connection), or it is closed (a `408` first when some bytes came).
- **Body deadline**: once the headers are in, the whole body must arrive within
  `body_timeout` seconds, however it trickles in, or the request ends with a `408` and the
  connection is closed.
- **Header size**: more than `max_header_bytes` of request line and headers is answered
  `431` and the connection is closed.
- **Unread bodies end the connection**: a response sent before its request's body arrived (a
  `401`, a `413`, `415` or `429`) ends the connection, so a body nobody reads is
  never buffered, parsed or waited for, and an unauthenticated client cannot keep the
  connection busy. Closing a socket with unread data makes the kernel send a reset, which can
  destroy the response before a client that sends its whole body first (most do) reads it, so
  the close lingers as nginx's `lingering_close` does, but briefly: the server ends its side
  (FIN after the response) and discards what still arrives, without parsing or keeping it,
  until the declared body is in or `LINGER_SECONDS` have passed, then closes. Such a response
  says `Connection: close` (RFC 9112 §9.6), so a keep-alive client opens a new connection for
  its next request instead of failing on this one.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from types import FrameType
from typing import Any

import msgspec
import uvicorn
from litestar import Litestar
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from common.heap import freeze_startup_heap

logger = logging.getLogger(__name__)

LINGER_SECONDS = 2.0
"""How long a connection answered before its body arrived keeps discarding incoming bytes."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Per-process HTTP limits; times in seconds, sizes in bytes.

    `max_connections` is uvicorn's `limit_concurrency`: with that many connections open (or
    requests running), further requests are answered 503.

    `trusted_proxies` (IP addresses or CIDR networks, as `ipaddress` writes them) are the
    reverse proxies whose `X-Forwarded-For` and `X-Forwarded-Proto` name the client and the
    scheme (uvicorn's `forwarded_allow_ips`; of a chain of proxies, the client is the
    right-most address that is not a trusted proxy). Empty, the default: those headers are
    ignored and a request's client is the connection's peer, so no client chooses the address
    it is known by (uvicorn's own default would trust them from 127.0.0.1).
    """

    max_connections: int = 2048
    keep_alive_timeout: float = 5.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 64 * 1024
    trusted_proxies: tuple[str, ...] = ()


def _raw_response(status: int, reason: bytes, slug: str, detail: str) -> bytes:
    """A complete HTTP/1.1 response closing the connection, whose body is an RFC 9457 problem
    (as every other refusal of the services): for answers given below the app."""
    body = msgspec.json.encode(
        {
            "type": f"urn:jobq:problem:{slug}",
            "title": reason.decode(),
            "status": status,
            "detail": detail,
        }
    )
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/problem+json\r\n" % (status, reason)
        + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        + body
    )


_HEADER_TIMEOUT = _raw_response(
    408, b"Request Timeout", "request-timeout", "request headers took too long"
)
_BODY_TIMEOUT = _raw_response(
    408, b"Request Timeout", "request-timeout", "request body took too long"
)
_HEADERS_TOO_LARGE = _raw_response(
    431, b"Request Header Fields Too Large", "headers-too-large", "request headers too large"
)


class _HeadersTooLarge(Exception):
    """Raised from a parser callback to stop reading headers past the size cap."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header and body deadlines, the header size cap
    and the no-drain rule of the module docstring; `limited_protocol` sets its `limits`."""

    limits = ServerLimits()
    _deadline: asyncio.TimerHandle | None = None
    _header_bytes = 0
    _reading_headers = True
    _received_any = False
    _lingering = False  # answered early: discarding what arrives until the close
    _body_left: int | None = None  # declared body bytes not arrived yet (None: unknown)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout, self._headers_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            if self._body_left is not None:
                self._body_left -= len(data)
                if self._body_left <= 0:
                    self.transport.close()
            return
        self._received_any = True
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers any parser error 400; headers stopped for their size get 431.
        if self._reading_headers and self._header_bytes > self.limits.max_header_bytes:
            self._refuse(_HEADERS_TOO_LARGE, "http_headers_too_large")
        else:
            # uvicorn's own 400 is plain text; every refusal here is a problem document.
            self.transport.write(_raw_response(400, b"Bad Request", "malformed-request", msg))
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_headers = True
        self._header_bytes = 0
        if self._deadline is None:
            self._arm(self.limits.header_timeout, self._headers_too_slow)

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.limits.max_header_bytes:
            raise _HeadersTooLarge

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        self._disarm()
        declared = next((v for n, v in self.headers if n == b"content-length"), None)
        self._body_left = int(declared) if declared is not None and declared.isdigit() else None
        super().on_headers_complete()
        if self.cycle is not None:
            _announce_early_close(self.cycle)
        # Armed now, disarmed by on_message_complete (at once for a bodiless request).
        self._arm(self.limits.body_timeout, self._body_too_slow)

    def on_body(self, body: bytes) -> None:
        if self._body_left is not None:
            self._body_left -= len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()
        if self.cycle is not None and not getattr(self.cycle, _CLOSE_ANNOUNCED, False):
            # The whole body is in before any answer (the usual case): the response needs no
            # announcement, so its sends skip the wrapper.
            self.cycle.__dict__.pop("send", None)

    def on_response_complete(self) -> None:
        cycle = self.cycle
        announced = cycle is not None and getattr(cycle, _CLOSE_ANNOUNCED, False)
        if announced and not self.transport.is_closing():
            # Answered before its body arrived: end the connection, as the response said,
            # lingering briefly so the answer is read before the close resets the connection.
            self._lingering = True
            self._arm(LINGER_SECONDS, self.transport.close)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.flow.resume_reading()
            return
        super().on_response_complete()

    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._received_any and (self.cycle is None or self.cycle.response_complete):
            self._refuse(_HEADER_TIMEOUT, "http_header_timeout")
        else:
            self._refuse(None, "http_header_timeout")

    def _body_too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        started = self.cycle is not None and self.cycle.response_started
        self._refuse(None if started else _BODY_TIMEOUT, "http_body_timeout")

    def _refuse(self, response: bytes | None, event: str) -> None:
        logger.warning(
            "closing a connection from %s: %s",
            self.client[0] if self.client else "?",
            event.removeprefix("http_").replace("_", " "),
            extra={"event": event},
        )
        self._disarm()
        if response is not None:
            self.transport.write(response)
        self.transport.close()


_CLOSE_ANNOUNCED = "jobq_close_announced"
"""Set on a request cycle whose response said `Connection: close` for an unread body."""


def _announce_early_close(cycle: RequestResponseCycle) -> None:
    """Make `cycle`'s response say `Connection: close` when it starts before the request's
    body arrived (the connection will close: `on_response_complete`). uvicorn closes at once
    on that header, which would reset the connection over the unread body; its keep-alive
    flag is put back, so the close stays the lingering one of this protocol."""
    send = cycle.send

    async def send_announcing_close(message: Any) -> None:
        if message["type"] != "http.response.start" or not cycle.more_body:
            await send(message)
            return
        headers = [(n, v) for n, v in message.get("headers", []) if n.lower() != b"connection"]
        headers.append((b"connection", b"close"))
        keep_alive = cycle.keep_alive
        announcing: Any = {**message, "headers": headers}
        await send(announcing)
        cycle.keep_alive = keep_alive
        setattr(cycle, _CLOSE_ANNOUNCED, True)

    cycle.send = send_announcing_close  # type: ignore[method-assign]


def limited_protocol(limits: ServerLimits) -> type[HttpToolsProtocol]:
    """`LimitedHttpToolsProtocol` within `limits` (pass it as `uvicorn.Config(http=…)`)."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Litestar) -> None:
        super().__init__(config)
        self._app = app

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup (the app's lifespan startup, then the listening sockets); then
        startup's objects are frozen out of the garbage collector's scans (`common.heap`)."""
        await super().startup(sockets)
        freeze_startup_heap()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        begin: Any = self._app.state.get("begin_shutdown")
        if begin is not None:
            begin()
        super().handle_exit(sig, frame)


def server_config(app: Any, host: str, port: int, limits: ServerLimits, **extra: Any) -> Any:
    """A `uvicorn.Config` serving `app` on `host:port` within `limits`, believing forwarding
    headers only from `limits.trusted_proxies` (no access log, no logging configuration of its
    own); `extra` passes further uvicorn options."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=limited_protocol(limits),
        limit_concurrency=limits.max_connections,
        timeout_keep_alive=max(1, round(limits.keep_alive_timeout)),
        # Explicit, so neither uvicorn's default (127.0.0.1) nor its FORWARDED_ALLOW_IPS
        # variable decides whom the forwarding headers are believed from.
        proxy_headers=bool(limits.trusted_proxies),
        forwarded_allow_ips=list(limits.trusted_proxies),
        # No route takes a WebSocket: an upgrade request is plain HTTP here.
        ws="none",
        log_config=None,
        access_log=False,
        **extra,
    )


def serve(app: Litestar, host: str, port: int, grace_seconds: float, limits: ServerLimits) -> None:
    """Serve `app` until SIGTERM/SIGINT within `limits`, then drain in-flight requests for up
    to `grace_seconds` before the lifespan shutdown runs.

    `app.state.begin_shutdown()`, when present, is called as soon as the signal arrives, so a
    long poll answers at once instead of holding the drain for its full wait.
    """
    config = server_config(
        app,
        host,
        port,
        limits,
        timeout_graceful_shutdown=max(1, int(grace_seconds)),
        lifespan="on",
    )
    _Server(config, app).run()
