"""Settings shared by every service: duration and size types, logging and connection URLs.

Each service extends `BaseServiceSettings` in its own `settings.py`. Field names are the
environment variable names (docs/architecture.md#configuration) in lower case
(`queue_reaper_interval` ↔ `QUEUE_REAPER_INTERVAL`), read once in `main()`, never at import
time. Bad values fail at start with pydantic's message naming the variable.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Annotated, Literal, TypeVar

from pydantic import BeforeValidator, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


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


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A duration in seconds, accepting the unit suffixes of `parse_duration`."""

Port = Annotated[int, Field(ge=0, le=65535)]

Token = Annotated[SecretStr, Field(min_length=16)]
"""A bearer secret of at least 16 characters; never shown in logs or reprs."""


class BaseServiceSettings(BaseSettings):
    """Settings every service reads: logging and the URLs it may connect to."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"


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
