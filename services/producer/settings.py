"""Producer settings (environment variables of DESIGN.md §5)."""

from __future__ import annotations

from common.settings import BaseServiceSettings, Duration, Port


class ProducerSettings(BaseServiceSettings):
    """Everything the producer reads from its environment; durations are seconds."""

    queue_service_url: str = "http://127.0.0.1:8081"
    producer_host: str = "127.0.0.1"
    producer_port: Port = 8080
    producer_forward_timeout: Duration = 5.0
    producer_shutdown_grace: Duration = 10.0
