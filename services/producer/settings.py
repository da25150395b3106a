"""Producer settings (docs/architecture.md#configuration)."""

from __future__ import annotations

from pydantic import SecretStr, field_validator

from common.access import Role, parse_api_keys
from common.settings import BaseServiceSettings, Duration, Port, Token


class ProducerSettings(BaseServiceSettings):
    """Everything the producer reads from its environment; durations are seconds."""

    queue_service_url: str = "http://127.0.0.1:8081"
    producer_host: str = "127.0.0.1"
    producer_port: Port = 8080
    producer_forward_timeout: Duration = 5.0
    producer_shutdown_grace: Duration = 10.0
    queue_internal_token: Token | None = None
    jobq_api_keys: SecretStr | None = None

    @field_validator("jobq_api_keys")
    @classmethod
    def _keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not parse_api_keys(value.get_secret_value()):
            # Set but empty must not silently mean "open": unset it for open access.
            raise ValueError("lists no key; give role:key entries, or unset it for open access")
        return value

    def api_keys(self) -> dict[str, Role]:
        """{key: role} from `JOBQ_API_KEYS` (`role:key,…`); empty means open access."""
        if self.jobq_api_keys is None:
            return {}
        return parse_api_keys(self.jobq_api_keys.get_secret_value())
