"""`create_app(settings)`: the queue service as a Litestar app, owning every resource it uses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from alembic.config import Config
from alembic.script import ScriptDirectory
from litestar import Litestar, Response, get
from litestar.datastructures import State
from litestar.di import Provide
from prometheus_client import CollectorRegistry

from common import contracts, operations
from common.contracts import REQUEST_BODY_MAX_BYTES
from common.errors import JobqError
from common.web.access import token_check
from common.web.app import (
    exception_handlers,
    live,
    metrics_route,
    openapi_config,
    refine_struct_schemas,
    request_checks,
)
from common.web.http_metrics import HttpMetrics
from common.web.pools import PoolMetrics
from services.queue.background import HotVacuum, Reaper, Scheduler, every, refresh_depth
from services.queue.depth import DepthCache
from services.queue.history import History
from services.queue.metrics import QueueMetrics
from services.queue.operator import Operator
from services.queue.operator_routes import OPERATOR_ROUTES
from services.queue.recurring import Recurring
from services.queue.repository import JobRepository, create_pool
from services.queue.routes import (
    JobController,
    change_queue,
    queues,
    redrive,
    set_limits,
    set_weights,
)
from services.queue.schedules import parse_schedules
from services.queue.service import QueueService
from services.queue.settings import QueueSettings, plain_database_url
from services.queue.sqs_routes import SqsController
from services.queue.sqs_store import SqsStore
from services.queue.wakeup import WakeupHub, listen_forever

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"


def head_revision() -> str:
    """The alembic head revision this code expects the database to be at."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


@get("/health/ready", include_in_schema=False)
async def ready(state: State) -> Response[dict[str, Any]]:
    """Readiness: PostgreSQL answers and its schema is at this code's head revision.

    Redis is reported but not required: it only accelerates depth reads.
    """
    checks: dict[str, Any] = {"redis": "ok" if await state.depth_cache.ping() else "unavailable"}
    status = 200
    try:
        async with asyncio.timeout(2):
            revision = await state.service.schema_revision()
        if revision == state.head_revision:
            checks["database"] = "ok"
        else:
            checks["database"] = f"schema at {revision}, expected {state.head_revision}: migrate"
            status = 503
    except Exception as exc:
        checks["database"] = f"unavailable: {type(exc).__name__}"
        status = 503
    return Response(
        {"status": "ok" if status == 200 else "unavailable", **checks}, status_code=status
    )


def _orphaned_resolution_quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Event-loop exception handler: a name lookup of the database host that finished (failed)
    after the connect that asked for it was given up (its timeout, the shutdown deadline) is
    one WARNING line, not an "exception was never retrieved" error with a traceback; anything
    else goes to the default handler."""
    error = context.get("exception")
    if "never retrieved" in str(context.get("message", "")) and isinstance(error, OSError):
        logger.warning(
            "database connection attempt failed after it was given up: %s",
            error,
            extra={"event": "database_unavailable"},
        )
        return
    loop.default_exception_handler(context)


def _from_state(name: str) -> Provide:
    """A dependency handing routes the object the lifespan put in the app's state as `name`
    (the service, the depth cache, the SQS store, the operator views)."""

    def provide(state: State) -> Any:
        return state[name]

    return Provide(provide, sync_to_thread=False)


def create_app(settings: QueueSettings | None = None) -> Litestar:
    """Build the queue service. Resources (engine, Redis, LISTEN connection, background loops)
    are created in the lifespan and closed when the app stops."""
    settings = settings or QueueSettings()
    token = settings.queue_internal_token
    registry = CollectorRegistry(auto_describe=True)
    metrics = QueueMetrics(registry, depth_cache=bool(settings.redis_url))
    # Created here rather than in the lifespan so the server can signal them the moment a
    # shutdown begins, before it waits for in-flight requests: waiting claims then end at once.
    shutdown = asyncio.Event()
    hub = WakeupHub()
    repositories: list[JobRepository] = []
    deadline: list[float] = []
    """Event-loop time by which database work ends once a shutdown began (set once)."""

    def bound_database_work() -> None:
        if not deadline:
            # Half a second of the drain is kept for the answers to be written.
            budget = max(settings.queue_shutdown_grace - 0.5, 0.5)
            deadline.append(asyncio.get_running_loop().time() + budget)
        for repository in repositories:
            repository.stop_waiting_at(deadline[0])

    def begin_shutdown() -> None:
        shutdown.set()
        hub.wake_all()
        # Called from the server's signal handler: touch timers from the loop itself.
        with contextlib.suppress(RuntimeError):  # no running loop (a test calling it)
            asyncio.get_running_loop().call_soon_threadsafe(bound_database_work)

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_orphaned_resolution_quiet)
        dsn = plain_database_url(settings.database_url)
        pool = await create_pool(
            dsn, size=settings.queue_db_pool_size, server_settings=settings.session_limits()
        )
        redis_client = (
            aioredis.from_url(settings.redis_url, socket_timeout=1, socket_connect_timeout=1)
            if settings.redis_url
            else None
        )
        shutdown.clear()
        repository = JobRepository(
            pool, metrics=PoolMetrics(registry, "database", settings.queue_db_pool_size)
        )
        repositories[:] = [repository]
        depth_cache = DepthCache(redis_client, ttl=settings.queue_depth_interval * 3)
        service = QueueService(repository, hub, settings, metrics, shutdown)
        reaper, scheduler = Reaper(repository, metrics), Scheduler(repository)
        recurring = Recurring(service, parse_schedules(settings.queue_schedules))
        history = History(
            repository,
            settings.queue_history_partition,
            settings.queue_retention,
            settings.queue_dead_letter_retention,
            settings.queue_partition_manager,
        )
        operator = Operator(
            repository,
            service.activity,
            parse_schedules(settings.queue_schedules),
            settings.queue_worker_live,
        )
        app.state.update(
            pool=pool,
            service=service,
            depth_cache=depth_cache,
            sqs_store=SqsStore(repository),
            operator=operator,
            head_revision=head_revision(),
        )

        async def retention_pass() -> None:
            started = time.perf_counter()
            done = await history.maintain()
            metrics.observe_maintenance(done, time.perf_counter() - started)

        loops: list[asyncio.Task[None]] = []
        try:
            try:
                # Logs which manager runs the partitions; refuses to start when pg_partman is
                # required and missing. An unreachable database is decided at the first pass.
                await history.start()
            except (JobqError, OSError, asyncpg.PostgresError) as exc:
                logger.warning(
                    "history: partition manager not decided yet (%s): at the first pass", exc
                )
            async with asyncio.TaskGroup() as tasks:
                loops.append(
                    tasks.create_task(
                        listen_forever(
                            dsn,
                            hub,
                            shutdown,
                            probe_interval=settings.queue_listen_probe_interval,
                            probe_timeout=settings.queue_listen_probe_timeout,
                            reconnected=lambda reason: metrics.listener_reconnects.labels(
                                reason
                            ).inc(),
                        )
                    )
                )
                loops.append(
                    tasks.create_task(
                        every("reaper", settings.queue_reaper_interval, reaper.sweep, shutdown)
                    )
                )
                loops.append(
                    tasks.create_task(
                        every(
                            "scheduler",
                            settings.queue_scheduler_interval,
                            scheduler.promote,
                            shutdown,
                        )
                    )
                )
                loops.append(
                    tasks.create_task(
                        every(
                            "recurring", settings.queue_schedule_interval, recurring.tick, shutdown
                        )
                    )
                )
                loops.append(
                    tasks.create_task(
                        every(
                            "retention",
                            settings.queue_retention_interval,
                            retention_pass,
                            shutdown,
                        )
                    )
                )
                if settings.queue_vacuum_dead_rows:
                    vacuum = HotVacuum(
                        repository,
                        metrics,
                        settings.queue_vacuum_dead_rows,
                        settings.queue_vacuum_interval,
                    )
                    loops.append(
                        tasks.create_task(
                            every("vacuum", settings.queue_vacuum_interval, vacuum.tick, shutdown)
                        )
                    )
                loops.append(
                    tasks.create_task(
                        every(
                            "depth",
                            settings.queue_depth_interval,
                            lambda: refresh_depth(repository, depth_cache, metrics),
                            shutdown,
                        )
                    )
                )
                loops.append(
                    tasks.create_task(
                        every(
                            "activity",
                            settings.queue_activity_interval,
                            service.activity.flush,
                            shutdown,
                        )
                    )
                )
                try:
                    yield
                finally:
                    begin_shutdown()
                    bound_database_work()
                    await service.aclose()
                    # The loops end at their next check of `shutdown`; one stuck where the
                    # deadline does not reach (the LISTEN connection's connect) is cancelled.
                    remaining = max(deadline[0] - asyncio.get_running_loop().time(), 1.0)
                    _, stuck = await asyncio.wait(loops, timeout=remaining)
                    for task in stuck:
                        task.cancel()
        finally:
            try:
                await asyncio.wait_for(pool.close(), timeout=2.0)
            except TimeoutError:
                pool.terminate()
            if redis_client is not None:
                await redis_client.aclose()

    app = Litestar(
        route_handlers=[
            JobController,
            SqsController,
            queues,
            change_queue,
            set_limits,
            set_weights,
            redrive,
            *OPERATOR_ROUTES,
            ready,
            live,
            metrics_route(registry),
        ],
        lifespan=[lifespan],
        dependencies={
            name: _from_state(name) for name in ("service", "depth_cache", "sqs_store", "operator")
        },
        exception_handlers=exception_handlers(),
        before_request=request_checks(token_check(token.get_secret_value() if token else None)),
        middleware=[HttpMetrics("queue", registry).middleware],
        openapi_config=openapi_config(
            "jobq queue service",
            "QUEUE_INTERNAL_TOKEN; not needed when it is unset.",
        ),
        # Headroom above the public bound for the ids and defaults the producer adds when it
        # forwards a batch that was just under 8 MiB.
        request_max_body_size=REQUEST_BODY_MAX_BYTES + 1024 * 1024,
        state=State({"begin_shutdown": begin_shutdown}),
        logging_config=None,
        debug=False,
    )
    refine_struct_schemas(app, contracts)
    refine_struct_schemas(app, operations)
    return app
