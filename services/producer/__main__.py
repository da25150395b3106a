"""`python -m services.producer`: serve the public producer API."""

from __future__ import annotations

from common.logging import configure_logging
from common.web import tracing
from common.web.access import refuse_open_access
from common.web.serving import serve
from common.web.settings import load_settings
from services.producer.app import create_app
from services.producer.settings import ProducerSettings


def main() -> None:
    """Read settings from the environment, configure logging and serve until SIGTERM/SIGINT,
    draining in-flight requests for up to `PRODUCER_SHUTDOWN_GRACE` seconds."""
    settings = load_settings(ProducerSettings)
    configure_logging(settings.log_level, settings.log_format)
    tracing.start("jobq-producer")
    refuse_open_access(
        "producer",
        settings.producer_host,
        [] if settings.api_keys() else ["JOBQ_API_KEYS"],
        insecure_allowed=settings.jobq_insecure_open_access,
    )
    serve(
        create_app(settings),
        settings.producer_host,
        settings.producer_port,
        settings.producer_shutdown_grace,
        settings.server_limits(),
    )


if __name__ == "__main__":
    main()
