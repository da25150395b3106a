"""`python -m services.queue`: serve the queue service."""

from __future__ import annotations

from common.logging import configure_logging
from common.web.access import refuse_open_access
from common.web.serving import serve
from common.web.settings import load_settings
from services.queue.app import create_app
from services.queue.settings import QueueSettings


def main() -> None:
    """Read settings from the environment, configure logging and serve until SIGTERM/SIGINT.

    On a signal, waiting claims answer 204 at once, in-flight requests get up to
    `QUEUE_SHUTDOWN_GRACE` seconds, then the background loops and connections stop.
    """
    settings = load_settings(QueueSettings)
    configure_logging(settings.log_level, settings.log_format)
    refuse_open_access(
        "queue service",
        settings.queue_host,
        ["QUEUE_INTERNAL_TOKEN"] if settings.queue_internal_token is None else [],
        insecure_allowed=settings.jobq_insecure_open_access,
    )
    serve(
        create_app(settings),
        settings.queue_host,
        settings.queue_port,
        settings.queue_shutdown_grace,
        settings.server_limits(),
    )


if __name__ == "__main__":
    main()
