"""HTTP request metrics of the producer and the queue service, on prometheus_client.

The series are those Litestar's Prometheus plugin exports (`jobq_http_requests_total`,
`jobq_http_request_duration_seconds`, `jobq_http_requests_in_progress`,
`jobq_http_requests_error_total`, labelled `method`, `path` (the route template, so ids never
become label values), `status_code` and `app_name`), which the dashboards and alert rules read.
The plugin builds a Request object, label dicts and a wrapped `send` for every request, which
measured at about a quarter of a small request's CPU here; this middleware keeps one set of
label children per route and status instead (docs/architecture.md#performance).
"""

from __future__ import annotations

import time

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_NOT_COUNTED = ("/metrics", "/health")
"""Probes and scrapes: counting them would drown the traffic that matters."""


class HttpMetrics:
    """The HTTP series of one app (`app_name`), registered on `registry`.

    `middleware` is the Litestar middleware factory that records them.
    """

    def __init__(self, app_name: str, registry: CollectorRegistry) -> None:
        self._app_name = app_name
        labels = ["method", "path", "status_code", "app_name"]
        self._requests = Counter(
            "jobq_http_requests", "HTTP requests answered.", labels, registry=registry
        )
        self._errors = Counter(
            "jobq_http_requests_error", "HTTP requests answered 5xx.", labels, registry=registry
        )
        self._duration = Histogram(
            "jobq_http_request_duration_seconds",
            "Time from a request's arrival to its response, seconds.",
            labels,
            registry=registry,
        )
        self._in_progress = Gauge(
            "jobq_http_requests_in_progress",
            "HTTP requests being handled.",
            ["method", "path", "app_name"],
            registry=registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._gauges: dict[tuple[str, str], Gauge] = {}

    def _record(self, method: str, path: str, status: int, seconds: float) -> None:
        key = (method, path, status)
        pair = self._children.get(key)
        if pair is None:
            values = (method, path, str(status), self._app_name)
            pair = (self._requests.labels(*values), self._duration.labels(*values))
            self._children[key] = pair
            if status >= 500:
                self._errors.labels(*values)
        pair[0].inc()
        pair[1].observe(seconds)
        if status >= 500:
            self._errors.labels(method, path, str(status), self._app_name).inc()

    def _gauge(self, method: str, path: str) -> Gauge:
        gauge = self._gauges.get((method, path))
        if gauge is None:
            gauge = self._in_progress.labels(method, path, self._app_name)
            self._gauges[(method, path)] = gauge
        return gauge

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """Litestar middleware factory: wraps `app` to record every HTTP request but probes
        and scrapes. It runs after routing, so `path` is the matched route template."""

        async def record(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP or scope["path"].startswith(_NOT_COUNTED):
                await app(scope, receive, send)
                return
            method = str(scope.get("method", ""))
            path = str(scope.get("path_template") or scope["path"])
            status = 500
            started = time.perf_counter()
            in_progress = self._gauge(method, path)

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            in_progress.inc()
            try:
                await app(scope, receive, send_status)
            finally:
                in_progress.dec()
                self._record(method, path, status, time.perf_counter() - started)

        return record
