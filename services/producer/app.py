"""`create_app(settings)`: the producer as a Litestar app."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.datastructures import State
from litestar.di import Provide
from prometheus_client import CollectorRegistry

from common import contracts, operations
from common.contracts import REQUEST_BODY_MAX_BYTES
from common.web.access import caller_of, role_check
from common.web.app import (
    exception_handlers,
    live,
    metrics_route,
    openapi_config,
    refine_struct_schemas,
    request_checks,
)
from common.web.http import QUEUE_SERVICE_CONNECTIONS, ServiceClient
from common.web.http_metrics import HttpMetrics
from common.web.pools import PoolMetrics
from services.producer.admission import Admission, payload_checks
from services.producer.client import QueueServiceClient
from services.producer.console import console_router, template_config
from services.producer.console.sessions import Sessions
from services.producer.limits import STORE_NAME, TenantWindow, create_store, request_rate_limit
from services.producer.metrics import ProducerMetrics
from services.producer.operations import OPERATOR_ROUTES
from services.producer.routes import (
    JobController,
    Producer,
    change_queue,
    redrive,
    set_limits,
    set_weights,
)
from services.producer.settings import ProducerSettings


@get("/health/ready", include_in_schema=False)
async def ready(state: State) -> Response[dict[str, Any]]:
    """Readiness: the queue service answers and accepts the producer's token
    (`queueService` is `ok`, `unreachable` or `misconfigured`)."""
    upstream = await state.queue.readiness()
    ok = upstream == "ok"
    body = {"status": "ok" if ok else "unavailable", "queueService": upstream}
    return Response(body, status_code=200 if ok else 503)


def create_app(settings: ProducerSettings | None = None) -> Litestar:
    """Build the producer; its pooled HTTP client to the queue service lives in the lifespan."""
    settings = settings or ProducerSettings()
    registry = CollectorRegistry(auto_describe=True)
    pool_metrics = PoolMetrics(registry, "queue-service", QUEUE_SERVICE_CONNECTIONS)
    metrics = ProducerMetrics(registry)
    keys = settings.api_keys()
    store, redis_client = create_store(settings.redis_url)
    middleware: list[Any] = [HttpMetrics("producer", registry).middleware]
    if settings.producer_rate_limit is not None:
        middleware.append(request_rate_limit(settings.producer_rate_limit, keys, metrics))

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        token = settings.queue_internal_token
        async with ServiceClient(
            settings.queue_service_url,
            token=token.get_secret_value() if token else None,
            timeout=settings.producer_forward_timeout,
            metrics=pool_metrics,
            track_delivery=True,  # a sent, unanswered submit is 504 outcome-unknown
        ) as http:
            client = QueueServiceClient(http, settings.producer_forward_timeout)
            app.state.queue = client
            app.state.console_sessions = Sessions(
                store, keys, max(int(settings.console_session_ttl), 1)
            )
            try:
                yield
            finally:
                await client.aclose()
                if redis_client is not None:
                    await redis_client.aclose()

    email_rate, job_rate = settings.smtp_tenant_rate, settings.producer_rate_limit
    admission = Admission(
        payload_checks(settings.email_policy()),
        TenantWindow(store, email_rate, "email") if email_rate is not None else None,
        metrics,
        TenantWindow(store, job_rate, "jobs") if job_rate is not None else None,
    )

    def provide_producer(request: Request[Any, Any, Any]) -> Producer:
        # One dependency, not three: Litestar resolves sibling dependencies in a task group
        # of their own, which cost more than this whole function.
        return Producer(request.app.state.queue, caller_of(request), admission)

    app = Litestar(
        route_handlers=[
            JobController,
            change_queue,
            set_limits,
            set_weights,
            redrive,
            *OPERATOR_ROUTES,
            console_router(),
            ready,
            live,
            metrics_route(registry),
        ],
        lifespan=[lifespan],
        dependencies={"producer": Provide(provide_producer, sync_to_thread=False)},
        exception_handlers=exception_handlers(),
        before_request=request_checks(role_check(keys)),
        middleware=middleware,
        stores={STORE_NAME: store},
        template_config=template_config(),
        openapi_config=openapi_config(
            "jobq producer",
            "An API key of JOBQ_API_KEYS (role:tenant:key); not needed when none is configured.",
        ),
        request_max_body_size=REQUEST_BODY_MAX_BYTES,
        logging_config=None,
        debug=False,
    )
    refine_struct_schemas(app, contracts)
    refine_struct_schemas(app, operations)
    return app
