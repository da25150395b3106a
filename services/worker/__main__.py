"""`python -m services.worker`: one worker replica."""

from __future__ import annotations

import asyncio
import logging
import signal

import uvicorn
import uvloop
from prometheus_client import CollectorRegistry

from common.heap import freeze_startup_heap
from common.logging import configure_logging
from common.web import tracing
from common.web.http import QUEUE_SERVICE_CONNECTIONS, ServiceClient
from common.web.pools import PoolMetrics
from common.web.settings import load_settings
from services.worker.app import EmbeddedServer, create_app
from services.worker.client import QueueClient
from services.worker.metrics import WorkerMetrics
from services.worker.processors import build_registry
from services.worker.processors.webhook import webhook_client
from services.worker.runner import Worker
from services.worker.settings import WorkerSettings

logger = logging.getLogger("services.worker")


async def run(settings: WorkerSettings) -> None:
    """Run the worker until SIGTERM/SIGINT, then drain (see `Worker.run`)."""
    shutdown = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shutdown.set)
    registry = CollectorRegistry(auto_describe=True)
    metrics = WorkerMetrics(registry, settings.worker_concurrency)
    # Webhooks connect only to the addresses they checked (and ignore proxy variables: a proxy
    # would resolve the destination itself and bypass the private-address guard).
    outbound = webhook_client(settings.webhook_timeout)
    token = settings.queue_internal_token
    queue_http = ServiceClient(
        settings.queue_service_url,
        token=token.get_secret_value() if token else None,
        metrics=PoolMetrics(registry, "queue-service", QUEUE_SERVICE_CONNECTIONS),
    )
    async with queue_http, outbound:
        processors = build_registry(settings, outbound)
        client = QueueClient(queue_http, settings.worker_name, settings.worker_concurrency)
        worker = Worker(settings, client, processors, metrics)
        server = None
        if settings.worker_metrics_port:
            config = uvicorn.Config(
                create_app(registry, client),
                host=settings.worker_metrics_host,
                port=settings.worker_metrics_port,
                log_config=None,
                access_log=False,
                # Nothing here depends on who is asking: no forwarding headers believed.
                proxy_headers=False,
                lifespan="off",
            )
            server = EmbeddedServer(config)
        logger.info(
            "worker %s serving queues %s with %d slot(s); processors: %s",
            settings.worker_name,
            ",".join(settings.worker_queues),
            settings.worker_concurrency,
            ", ".join(processors.task_types()),
            extra={"event": "worker_started"},
        )
        freeze_startup_heap()
        async with asyncio.TaskGroup() as tasks:
            if server is not None:
                tasks.create_task(server.serve())
            await worker.run(shutdown)
            if server is not None:
                server.should_exit = True
    logger.info("worker stopped", extra={"event": "worker_stopped"})


def main() -> None:
    """Entry point: settings from the environment, JSON or text logs, then `run`."""
    settings = load_settings(WorkerSettings)
    configure_logging(settings.log_level, settings.log_format)
    tracing.start("jobq-worker")
    # uvloop, as uvicorn uses for the HTTP services: a cheaper event loop per job.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run(settings))


if __name__ == "__main__":
    main()
