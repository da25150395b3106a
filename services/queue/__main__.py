"""`python -m services.queue`: serve the queue service."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from common.logging import configure_logging
from common.web import tracing
from common.web.access import refuse_open_access
from common.web.serving import serve
from common.web.settings import load_settings
from services.queue.app import create_app
from services.queue.settings import QueueSettings


def main() -> None:
    """Read settings from the environment, configure logging and serve until SIGTERM/SIGINT.

    On a signal, waiting claims answer 204 at once, in-flight requests get up to
    `QUEUE_SHUTDOWN_GRACE` seconds, then the background loops and connections stop; one
    second after the grace the process leaves whatever is still running.
    """
    settings = load_settings(QueueSettings)
    configure_logging(settings.log_level, settings.log_format)
    tracing.start("jobq-queue")
    refuse_open_access(
        "queue service",
        settings.queue_host,
        ["QUEUE_INTERNAL_TOKEN"] if settings.queue_internal_token is None else [],
        insecure_allowed=settings.jobq_insecure_open_access,
    )
    app = create_app(settings)
    begin: Any = app.state["begin_shutdown"]
    # Past the grace, leave even if threads are stuck: a database host whose name stopped
    # resolving (in compose, a stopped container) leaves getaddrinfo calls blocked in threads
    # for many seconds, and the interpreter would wait for them at exit until the
    # orchestrator's SIGKILL (issue 25 item 4). By then the application has shut down.
    watchdog = threading.Timer(settings.queue_shutdown_grace + 1.0, _leave)
    watchdog.daemon = True

    def begin_shutdown() -> None:
        begin()
        if watchdog.ident is None:  # not started yet (a second signal calls this again)
            watchdog.start()

    app.state["begin_shutdown"] = begin_shutdown
    serve(
        app,
        settings.queue_host,
        settings.queue_port,
        settings.queue_shutdown_grace,
        settings.server_limits(),
    )


def _leave() -> None:
    logging.getLogger("services.queue").warning(
        "shutdown overran QUEUE_SHUTDOWN_GRACE (threads still blocked, e.g. resolving the "
        "database host); exiting",
        extra={"event": "shutdown_overrun"},
    )
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
