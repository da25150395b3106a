"""The worker's small HTTP side: `/metrics` and `/health/*` on `WORKER_METRICS_PORT`."""

from __future__ import annotations

import contextlib
from typing import Any

import uvicorn
from litestar import Litestar, Response, get
from prometheus_client import CollectorRegistry

from common.web.app import live, metrics_route
from services.worker.client import QueueClient


def create_app(registry: CollectorRegistry, client: QueueClient) -> Litestar:
    """Metrics and health for one worker; ready means the queue service answers."""

    @get("/health/ready", include_in_schema=False)
    async def ready() -> Response[dict[str, Any]]:
        ok = await client.live()
        body = {
            "status": "ok" if ok else "unavailable",
            "queueService": "ok" if ok else "unreachable",
        }
        return Response(body, status_code=200 if ok else 503)

    return Litestar(
        route_handlers=[live, ready, metrics_route(registry)],
        logging_config=None,
        openapi_config=None,
    )


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the worker's own shutdown logic."""

    def capture_signals(self) -> contextlib.nullcontext[None]:  # type: ignore[override]
        return contextlib.nullcontext()
