"""Child spans of an attempt for the processors' outbound calls, when tracing is on
(docs/architecture.md#tracing): the webhook's POST (which also sends the attempt's
`traceparent` downstream) and the SMTP delivery. Without tracing they are empty contexts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import httpx
from opentelemetry.trace import Span, SpanKind

from common.web import tracing


@contextlib.contextmanager
def outbound_span(
    url: httpx.URL, port: int, headers: MutableMapping[str, str]
) -> Iterator[Span | None]:
    """A CLIENT span `POST` for a webhook to `url` (its query string, which may carry secrets,
    left out of `url.full`), with the W3C `traceparent`/`tracestate` of that span added to
    `headers`; yields None, changing nothing, when tracing is off."""
    if tracing.tracer is None:
        yield None
        return
    attributes: dict[str, Any] = {
        "http.request.method": "POST",
        "server.address": url.host,
        "server.port": port,
        "url.full": str(url.copy_with(query=None, fragment=None)),
    }
    with tracing.tracer.start_as_current_span(
        "POST", kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        tracing.inject(headers)
        yield span


@contextlib.contextmanager
def smtp_span(host: str, port: int, recipients: int) -> Iterator[None]:
    """A CLIENT span `smtp send` for one delivery to `host:port`; nothing when tracing is off."""
    if tracing.tracer is None:
        yield
        return
    attributes: dict[str, Any] = {
        "server.address": host,
        "server.port": port,
        "network.protocol.name": "smtp",
        "jobq.recipients": recipients,
    }
    with tracing.tracer.start_as_current_span(
        "smtp send", kind=SpanKind.CLIENT, attributes=attributes
    ):
        yield
