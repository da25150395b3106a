"""`create_app(settings)`: the SQS endpoint as a Litestar app
(docs/architecture.md#sqs-compatibility)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, Response, get
from litestar.datastructures import State
from prometheus_client import CollectorRegistry

from common.web.app import exception_handlers, live, metrics_route
from common.web.http import QUEUE_SERVICE_CONNECTIONS, ServiceClient
from common.web.http_metrics import HttpMetrics
from common.web.pools import PoolMetrics
from services.sqs.client import QueueServiceClient
from services.sqs.metrics import SqsMetrics
from services.sqs.routes import sqs_action
from services.sqs.settings import SqsSettings
from services.sqs.sigv4 import SigV4Verifier

REQUEST_MAX_BYTES = 4 * 1024 * 1024
"""An SQS request's body at most: a batch of 256 KiB in all, JSON-escaped."""


@get("/health/ready", include_in_schema=False)
async def ready(state: State) -> Response[dict[str, Any]]:
    """Readiness: the queue service answers and accepts our token."""
    ok = await state.client.readiness()
    body = {"status": "ok" if ok else "unavailable", "queueService": "ok" if ok else "unavailable"}
    return Response(body, status_code=200 if ok else 503)


def create_app(settings: SqsSettings | None = None) -> Litestar:
    """Build the SQS endpoint; its pooled HTTP client to the queue service lives in the
    lifespan. With no API keys configured it runs open (every caller an admin of `*`)."""
    settings = settings or SqsSettings()
    registry = CollectorRegistry(auto_describe=True)
    pool_metrics = PoolMetrics(registry, "queue-service", QUEUE_SERVICE_CONNECTIONS)
    keys = settings.key_entries()

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        token = settings.queue_internal_token
        secret = token.get_secret_value() if token else None
        async with (
            ServiceClient(
                settings.queue_service_url,
                token=secret,
                timeout=settings.sqs_forward_timeout,
                metrics=pool_metrics,
            ) as http,
            ServiceClient(
                settings.queue_service_url,
                token=secret,
                timeout=settings.sqs_forward_timeout,
                max_connections=settings.sqs_max_long_polls,
            ) as polls,
        ):
            app.state.client = QueueServiceClient(
                http, polls, settings.sqs_forward_timeout, settings.sqs_cache_ttl
            )
            yield

    return Litestar(
        route_handlers=[sqs_action, ready, live, metrics_route(registry)],
        lifespan=[lifespan],
        exception_handlers=exception_handlers(),
        middleware=[HttpMetrics("sqs", registry).middleware],
        state=State(
            {
                "verifier": SigV4Verifier(keys, settings.sqs_region) if keys else None,
                "region": settings.sqs_region,
                "public_url": settings.sqs_public_url,
                "own_address": f"{settings.sqs_host}:{settings.sqs_port}",
                "metrics": SqsMetrics(registry),
            }
        ),
        request_max_body_size=REQUEST_MAX_BYTES,
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
