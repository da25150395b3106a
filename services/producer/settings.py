"""Producer settings (docs/architecture.md#configuration)."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr, field_validator, model_validator

from common.web.access import ApiKeys, parse_api_keys
from common.web.settings import (
    Duration,
    EmailPolicySettings,
    HttpServiceSettings,
    Port,
    Rate,
    Token,
)


class ProducerSettings(HttpServiceSettings, EmailPolicySettings):
    """Everything the producer reads from its environment; durations are seconds."""

    queue_service_url: str = "http://127.0.0.1:8081"
    producer_host: str = "127.0.0.1"
    producer_port: Port = 8080
    producer_forward_timeout: Duration = 5.0
    producer_shutdown_grace: Duration = 10.0
    queue_internal_token: Token | None = None
    jobq_api_keys: SecretStr | None = None
    jobq_api_keys_file: Path | None = None
    producer_rate_limit: Rate = None
    redis_url: str = "redis://127.0.0.1:6379/0"
    smtp_tenant_rate: Rate = ("minute", 100)
    console_session_ttl: Duration = 8 * 3600.0
    """Seconds a console session lasts from its sign-in (services/producer/console)."""

    @field_validator("jobq_api_keys")
    @classmethod
    def _keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not parse_api_keys(value.get_secret_value()):
            # Set but empty must not silently mean "open": unset it for open access.
            raise ValueError("lists no key; give role:tenant:key entries, or unset it")
        return value

    @field_validator("jobq_api_keys_file")
    @classmethod
    def _keys_file(cls, value: Path | None) -> Path | None:
        if value is not None and not parse_api_keys(
            _read_keys_file(value), _file(value), lines=True
        ):
            raise ValueError(f"{value} lists no key; give role:tenant:key lines, or unset it")
        return value

    @model_validator(mode="after")
    def _no_key_twice(self) -> ProducerSettings:
        self.api_keys()
        return self

    def api_keys(self) -> ApiKeys:
        """The keys of `JOBQ_API_KEYS` and `JOBQ_API_KEYS_FILE` together; empty means open
        access. Raises ValueError for a key listed in both."""
        inline = self.jobq_api_keys.get_secret_value() if self.jobq_api_keys else ""
        from_file = (
            _read_keys_file(self.jobq_api_keys_file) if self.jobq_api_keys_file is not None else ""
        )
        return ApiKeys.merge(
            parse_api_keys(inline),
            parse_api_keys(from_file, _file(self.jobq_api_keys_file), lines=True),
        )


def _file(path: Path | None) -> str:
    return str(path)


def _read_keys_file(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
