"""Settings shared by every service: duration and size types, logging and connection URLs.

Each service extends `BaseServiceSettings` in its own `settings.py`. Field names are the
environment variable names (docs/architecture.md#configuration) in lower case
(`queue_reaper_interval` ↔ `QUEUE_REAPER_INTERVAL`), read once in `main()`, never at import
time. Bad values fail at start with pydantic's message naming the variable.
"""

from __future__ import annotations

import ipaddress
import math
import re
import sys
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from common.contracts import CLIENT_IDLE_SECONDS, SERVER_KEEP_ALIVE_MIN_SECONDS
from common.mail import EmailPolicy
from common.web.access import ApiKeys, Caller, parse_api_keys
from common.web.serving import ServerLimits

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*$")
_SIZE_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, None: 1}


def parse_duration(value: object) -> float:
    """Parse `30`, `0.5`, `500ms`, `30s`, `5m`, `12h` or `14d` into seconds (float ≥ 0).

    Raises ValueError for anything else, including negative, NaN and infinite values.
    """
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a number with ms/s/m/h/d")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(
                f"{value!r} is not a duration: use seconds (30, 0.5) or a unit (500ms, 5m, 14d)"
            )
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{value!r} is not a finite, non-negative duration")
    return seconds


def parse_size(value: object) -> int:
    """Parse `262144`, `256KiB` or `8MiB` into bytes (int ≥ 0); raises ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size: use bytes (1024) or a unit (256KiB, 8MiB)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


RateUnit = Literal["second", "minute", "hour", "day"]
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour|d|day)\s*$")
_RATE_UNITS: dict[str, RateUnit] = {
    "s": "second",
    "sec": "second",
    "second": "second",
    "m": "minute",
    "min": "minute",
    "minute": "minute",
    "h": "hour",
    "hour": "hour",
    "d": "day",
    "day": "day",
}


def parse_rate(value: object) -> tuple[RateUnit, int] | None:
    """Parse a rate such as `100/second`, `6000/minute` or `50/h` into (unit, count); an
    empty value, `0` or `off` is None (no limit).

    Raises ValueError for anything else, including a count of 0 with a unit.
    """
    if value is None or (isinstance(value, tuple) and len(value) == 2):
        return value
    text = str(value).strip().lower()
    if text in ("", "0", "off"):
        return None
    match = _RATE.match(text)
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"{value!r} is not a rate: use <count>/<second|minute|hour|day>, or off")
    return _RATE_UNITS[match.group(2)], int(match.group(1))


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A duration in seconds, accepting the unit suffixes of `parse_duration`."""

Size = Annotated[int, BeforeValidator(parse_size)]
"""A size in bytes, accepting `KiB`/`MiB`/`GiB`."""

Rate = Annotated[tuple[RateUnit, int] | None, NoDecode, BeforeValidator(parse_rate)]
"""A rate limit as (unit, count), or None for none; see `parse_rate`."""


def split_commas(value: object) -> object:
    """`a, b,,c` → ["a", "b", "c"]; anything but a string passes unchanged."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


CommaList = Annotated[list[str], NoDecode, BeforeValidator(split_commas)]
"""A list setting written comma-separated (`WORKER_QUEUES=default,email`)."""


def parse_networks(value: object) -> object:
    """`10.0.0.0/8, 192.168.1.7, ::1` → [IPv4Network('10.0.0.0/8'), IPv4Network('192.168.1.7/32'),
    IPv6Network('::1/128')]: IP addresses or CIDR networks, comma-separated.

    Raises ValueError naming the entry for anything else, including a network with host bits
    set (`10.0.0.1/8`: say `10.0.0.0/8`) and `*` (trusting everyone is never meant).
    """
    entries = split_commas(value)
    if not isinstance(entries, list):
        return entries
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry))
        except ValueError as exc:
            raise ValueError(f"{entry!r}: {exc}; use IP addresses or CIDR networks") from None
    return networks


Networks = Annotated[
    list[ipaddress.IPv4Network | ipaddress.IPv6Network], NoDecode, BeforeValidator(parse_networks)
]
"""IP addresses and CIDR networks, comma-separated (see `parse_networks`)."""

Port = Annotated[int, Field(ge=0, le=65535)]

Token = Annotated[SecretStr, Field(min_length=16)]
"""A bearer secret of at least 16 characters; never shown in logs or reprs."""


class BaseServiceSettings(BaseSettings):
    """Settings every service reads: logging and the URLs it may connect to."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"


class HttpServiceSettings(BaseServiceSettings):
    """Settings of the HTTP services (producer, queue service): connection, time and size
    limits of their HTTP server (docs/architecture.md#connection-limits), the reverse proxies
    whose forwarding headers it believes (docs/architecture.md#client-addresses), and the
    switch that lets them run open on a non-loopback address (docs/architecture.md#access)."""

    http_max_connections: int = Field(default=2048, ge=1, le=1_000_000)
    http_keep_alive_timeout: Duration = 5.0
    http_header_timeout: Duration = 10.0
    http_body_timeout: Duration = 30.0
    http_max_header_bytes: Size = Field(default=64 * 1024, ge=1024)
    http_trusted_proxies: Networks = []
    jobq_insecure_open_access: bool = False

    @field_validator("http_keep_alive_timeout", "http_header_timeout", "http_body_timeout")
    @classmethod
    def _positive_timeout(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("a timeout must be greater than zero")
        return value

    @field_validator("http_keep_alive_timeout")
    @classmethod
    def _outlasts_clients(cls, value: float) -> float:
        if value < SERVER_KEEP_ALIVE_MIN_SECONDS:
            raise ValueError(
                f"must be at least {SERVER_KEEP_ALIVE_MIN_SECONDS:g}s: jobq's clients reuse an "
                f"idle connection for up to {CLIENT_IDLE_SECONDS:g}s, and a server closing it "
                "sooner races their next request"
            )
        return value

    def server_limits(self) -> ServerLimits:
        """The HTTP server limits these settings describe."""
        return ServerLimits(
            max_connections=self.http_max_connections,
            keep_alive_timeout=self.http_keep_alive_timeout,
            header_timeout=self.http_header_timeout,
            body_timeout=self.http_body_timeout,
            max_header_bytes=self.http_max_header_bytes,
            trusted_proxies=tuple(str(network) for network in self.http_trusted_proxies),
        )


class EmailPolicySettings(BaseServiceSettings):
    """Who email jobs may name as sender and send to (docs/architecture.md#email), read by
    the producer (checked at submit) and the worker (checked again before sending)."""

    smtp_allowed_senders: CommaList = []
    smtp_allowed_recipient_domains: CommaList = []

    @model_validator(mode="after")
    def _valid_policy(self) -> EmailPolicySettings:
        self.email_policy()
        return self

    def email_policy(self) -> EmailPolicy:
        """The policy these settings describe; raises ValueError for a bad entry."""
        return EmailPolicy.of(self.smtp_allowed_senders, self.smtp_allowed_recipient_domains)


class ApiKeySettings(BaseServiceSettings):
    """The public API keys (`JOBQ_API_KEYS`, `JOBQ_API_KEYS_FILE`) of the services that
    authenticate callers: the producer and the SQS endpoint (docs/architecture.md#access)."""

    jobq_api_keys: SecretStr | None = None
    jobq_api_keys_file: Path | None = None

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
        if value is not None and not parse_api_keys(_read_keys_file(value), str(value), lines=True):
            raise ValueError(f"{value} lists no key; give role:tenant:key lines, or unset it")
        return value

    @model_validator(mode="after")
    def _no_key_twice(self) -> ApiKeySettings:
        self.api_keys()
        return self

    def key_entries(self) -> dict[str, Caller]:
        """{key: Caller} of `JOBQ_API_KEYS` and `JOBQ_API_KEYS_FILE` together; raises
        ValueError for a key listed in both."""
        inline = self.jobq_api_keys.get_secret_value() if self.jobq_api_keys else ""
        parsed = parse_api_keys(inline)
        if self.jobq_api_keys_file is not None:
            from_file = parse_api_keys(
                _read_keys_file(self.jobq_api_keys_file), str(self.jobq_api_keys_file), lines=True
            )
            if parsed.keys() & from_file.keys():
                raise ValueError("the same key is listed in JOBQ_API_KEYS and the keys file")
            parsed.update(from_file)
        return parsed

    def api_keys(self) -> ApiKeys:
        """The keys of `JOBQ_API_KEYS` and `JOBQ_API_KEYS_FILE` together; empty means open
        access. Raises ValueError for a key listed in both."""
        return ApiKeys(self.key_entries())


def _read_keys_file(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None


SettingsT = TypeVar("SettingsT", bound=BaseServiceSettings)


def load_settings(cls: type[SettingsT]) -> SettingsT:
    """Read `cls` from the environment; on bad values print one line per variable, named as
    the user set it (`QUEUE_REAPER_INTERVAL: '5x' is not a duration …`), and exit with 2."""
    try:
        return cls()
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            variable = str(error["loc"][0]).upper() if error["loc"] else "?"
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"  {variable}: {message}")
        print("jobq: invalid configuration:\n" + "\n".join(lines), file=sys.stderr)
        raise SystemExit(2) from None
