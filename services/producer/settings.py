"""Producer settings (docs/architecture.md#configuration)."""

from __future__ import annotations

from common.web.settings import (
    ApiKeySettings,
    Duration,
    EmailPolicySettings,
    HttpServiceSettings,
    Port,
    Rate,
    Token,
)


class ProducerSettings(HttpServiceSettings, EmailPolicySettings, ApiKeySettings):
    """Everything the producer reads from its environment; durations are seconds."""

    queue_service_url: str = "http://127.0.0.1:8081"
    producer_host: str = "127.0.0.1"
    producer_port: Port = 8080
    producer_forward_timeout: Duration = 5.0
    producer_shutdown_grace: Duration = 10.0
    queue_internal_token: Token | None = None
    producer_rate_limit: Rate = None
    redis_url: str = "redis://127.0.0.1:6379/0"
    smtp_tenant_rate: Rate = ("minute", 100)
    console_session_ttl: Duration = 8 * 3600.0
    """Seconds a console session lasts from its sign-in (services/producer/console)."""
