"""`python -m services.sqs`: serve the SQS-compatible endpoint."""

from __future__ import annotations

from common.logging import configure_logging
from common.web.access import refuse_open_access
from common.web.serving import serve
from common.web.settings import load_settings
from services.sqs.app import create_app
from services.sqs.settings import SqsSettings


def main() -> None:
    """Read settings from the environment, configure logging and serve until SIGTERM/SIGINT,
    draining in-flight requests (long polls up to 20 s) for up to `SQS_SHUTDOWN_GRACE`."""
    settings = load_settings(SqsSettings)
    configure_logging(settings.log_level, settings.log_format)
    refuse_open_access(
        "sqs",
        settings.sqs_host,
        [] if settings.api_keys() else ["JOBQ_API_KEYS"],
        insecure_allowed=settings.jobq_insecure_open_access,
    )
    serve(
        create_app(settings),
        settings.sqs_host,
        settings.sqs_port,
        settings.sqs_shutdown_grace,
        settings.server_limits(),
    )


if __name__ == "__main__":
    main()
