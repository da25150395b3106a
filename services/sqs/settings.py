"""SQS endpoint settings (docs/architecture.md#configuration)."""

from __future__ import annotations

import re

from pydantic import field_validator

from common.web.settings import ApiKeySettings, Duration, HttpServiceSettings, Port, Token

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")


class SqsSettings(HttpServiceSettings, ApiKeySettings):
    """Everything the SQS endpoint reads from its environment; durations are seconds.

    `sqs_region` is the region clients sign for (SigV4's credential scope) and that ARNs
    name; `sqs_public_url`, when set, is the base of the queue URLs it hands out (behind a
    proxy), else the request's own `Host`; `sqs_cache_ttl` is how long a queue's attributes
    are reused before they are read again (SQS itself says attribute changes take up to 60 s).
    """

    queue_service_url: str = "http://127.0.0.1:8081"
    queue_internal_token: Token | None = None
    sqs_host: str = "127.0.0.1"
    sqs_port: Port = 9324
    sqs_region: str = "us-east-1"
    sqs_public_url: str | None = None
    sqs_forward_timeout: Duration = 5.0
    sqs_cache_ttl: Duration = 1.0
    sqs_shutdown_grace: Duration = 25.0

    @field_validator("sqs_region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION.fullmatch(value):
            raise ValueError("must look like an AWS region, e.g. us-east-1")
        return value

    @field_validator("sqs_public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^/\s]+", value.rstrip("/")):
            raise ValueError("must be a base URL such as https://sqs.example.com")
        return None if value is None else value.rstrip("/")
