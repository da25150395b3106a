"""SQS endpoint settings (docs/architecture.md#configuration)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator

from common.web.settings import ApiKeySettings, Duration, HttpServiceSettings, Port, Token

_REGION = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


class SqsSettings(HttpServiceSettings, ApiKeySettings):
    """Everything the SQS endpoint reads from its environment; durations are seconds.

    `sqs_region` is the region clients sign for (SigV4's credential scope) and that ARNs
    name: by default none of AWS's, because the AWS CLI v1 sends a known region's SQS calls
    to AWS whatever `AWS_ENDPOINT_URL_SQS` says (docs/adr/005-the-sqs-region-is-not-aws.md).
    `sqs_public_url`, when set, is the base of the queue URLs it hands out (behind a proxy),
    else the request's own `Host`; `sqs_cache_ttl` is how long a queue's attributes are
    reused before they are read again (SQS itself says attribute changes take up to 60 s);
    `sqs_max_long_polls` bounds the receives waiting on the queue service at once (their own
    connection pool, so sends and deletes never queue behind long polls).
    """

    queue_service_url: str = "http://127.0.0.1:8081"
    queue_internal_token: Token | None = None
    sqs_host: str = "127.0.0.1"
    sqs_port: Port = 9324
    sqs_region: str = "jobq-local-1"
    sqs_public_url: str | None = None
    sqs_forward_timeout: Duration = 5.0
    sqs_cache_ttl: Duration = 1.0
    sqs_shutdown_grace: Duration = 25.0
    sqs_max_long_polls: Annotated[int, Field(ge=1, le=10_000)] = 1000

    @field_validator("sqs_region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION.fullmatch(value):
            raise ValueError("must be a region name: lower-case letters, digits and -")
        return value

    @field_validator("sqs_public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^/\s]+", value.rstrip("/")):
            raise ValueError("must be a base URL such as https://sqs.example.com")
        return None if value is None else value.rstrip("/")
