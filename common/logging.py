"""The one logging configuration: JSON lines (or readable text for `make run`) to stdout.

Every record carries a stable `event` field (the `extra={"event": ...}` given at the call site,
else the logger name) so log queries do not depend on message wording. Lines that repeat per
attempt or per job go through `FailureRun` (a retrying loop: first failure, one line every 30 s,
the recovery) or `RepeatedEvents` (per-job lines folded by kind), so a fault or a tenant's junk
is a few lines, never one per event.
"""

from __future__ import annotations

import json
import logging
import logging.config
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}

span_ids: Callable[[], dict[str, str] | None] | None = None
"""Set by `common.web.tracing.setup_tracing` when tracing is on: the current span's `trace_id` and
`span_id`, which every log line then carries. None (the default): no lookup at all."""


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object: time, level, logger, event, message and extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": getattr(record, "event", record.name),
            "message": record.getMessage(),
        }
        if span_ids is not None:
            entry.update(span_ids() or {})
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Readable single lines for a terminal: `LEVEL event: message key=value …`."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={v}" for k, v in record.__dict__.items() if k not in _RESERVED and k != "event"
        )
        line = (
            f"{record.levelname:<7} {getattr(record, 'event', record.name)}: {record.getMessage()}"
        )
        if extras:
            line += f"  {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Configure the root logger (and uvicorn's) once, for the whole process."""
    formatter = "json" if fmt == "json" else "text"
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {
                "json": {"()": JsonFormatter},
                "text": {"()": TextFormatter},
            },
            "handlers": {
                "stdout": {
                    "class": "logging.StreamHandler",
                    "stream": "ext://sys.stdout",
                    "formatter": formatter,
                }
            },
            "root": {"level": level, "handlers": ["stdout"]},
            "loggers": {
                "uvicorn": {"level": level, "handlers": [], "propagate": True},
                "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": True},
                "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
                "httpx": {"level": "WARNING"},
            },
        }
    )


REPEAT_LOG_SECONDS = 30.0
"""While one kind of event keeps repeating (a failing step, a refused LISTEN, dead letters of
one task type), how often it is logged again; the first occurrence is always logged."""


class FailureRun:
    """Logs a run of failures of one operation as a few lines, not one per attempt.

    The first failure is logged at once; while the run lasts, at most one line every
    `interval` seconds, carrying the count so far (`failures`); when the operation succeeds
    again, one INFO line says how many attempts failed and for how long (`down_seconds`).
    Events are `<name>_failed` and `<name>_recovered`. `clock` returns seconds (monotonic).
    The rule the periodic background steps follow, shared by every retrying loop so an outage
    is a handful of lines whatever its length.
    """

    def __init__(
        self,
        logger: logging.Logger,
        name: str,
        *,
        interval: float = REPEAT_LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._name = name
        self._interval = interval
        self._clock = clock
        self.failures = 0
        self._started = 0.0
        self._logged_at = 0.0

    def failed(self, message: str, *args: object, exc_info: bool = False) -> bool:
        """Count one failure; log it (WARNING; ERROR with the traceback when `exc_info`) if it is
        the run's first or `interval` seconds passed since the last line. Returns whether it
        was logged. `message % args` is the line; ` (N in a row)` is appended."""
        now = self._clock()
        self.failures += 1
        if self.failures == 1:
            self._started = now
        elif now - self._logged_at < self._interval:
            return False
        self._logged_at = now
        self._logger.log(
            logging.ERROR if exc_info else logging.WARNING,
            message + " (%d in a row)",
            *args,
            self.failures,
            exc_info=exc_info,
            extra={"event": f"{self._name}_failed", "failures": self.failures},
        )
        return True

    def succeeded(self) -> None:
        """End the run, if one was under way, with one INFO `<name>_recovered` line."""
        if not self.failures:
            return
        down = self._clock() - self._started
        self._logger.info(
            "%s recovered after %d failed attempts in %.1fs",
            self._name,
            self.failures,
            down,
            extra={
                "event": f"{self._name}_recovered",
                "failures": self.failures,
                "down_seconds": round(down, 3),
            },
        )
        self.failures = 0


@dataclass(slots=True)
class _Group:
    """One kind of repeated line: when it was last written, and what was folded since."""

    logged_at: float
    folded: int = 0
    last: tuple[logging.Logger, int, str, tuple[object, ...], dict[str, Any]] | None = None


class RepeatedEvents:
    """Folds repetitive per-job log lines (a dead letter, a retry, an expired lease) so that
    nobody who can submit jobs can flood the operators' logs.

    Lines are grouped by `(event, key)` — the key is what makes two occurrences "the same
    thing", e.g. the task type. The first line of a group is always logged in full; further
    lines of that group within `interval` seconds are counted, not logged; the first line after
    the interval is logged with `repeated=N` (how many were folded since the last line), and a
    group that stays quiet for two intervals is forgotten after one line telling its count. At
    most `max_groups` groups are told apart per event; beyond that, new keys share one group
    (key `*`), so the number of lines per interval is bounded whatever the keys. Metrics, not
    logs, count every event.
    """

    def __init__(
        self,
        *,
        interval: float = REPEAT_LOG_SECONDS,
        max_groups: int = 32,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval = interval
        self._max_groups = max_groups
        self._clock = clock
        self._groups: dict[tuple[str, str], _Group] = {}
        self._per_event: dict[str, int] = {}

    def log(
        self,
        logger: logging.Logger,
        level: int,
        key: str,
        message: str,
        *args: object,
        extra: dict[str, Any],
    ) -> bool:
        """Log `message % args` at `level` unless it repeats its group within the interval;
        `extra` must carry the `event`. Returns whether a line was written."""
        event = str(extra["event"])
        now = self._clock()
        group = self._groups.get((event, key))
        if group is None:
            self._expire(now)
            if self._per_event.get(event, 0) >= self._max_groups:
                key = "*"
                group = self._groups.get((event, key))
            if group is None:
                self._groups[(event, key)] = _Group(now)
                self._per_event[event] = self._per_event.get(event, 0) + 1
                logger.log(level, message, *args, extra=extra)
                return True
        if now - group.logged_at < self._interval:
            group.folded += 1
            group.last = (logger, level, message, args, extra)
            return False
        self._write(group, now, logger, level, message, args, extra)
        return True

    def _write(
        self,
        group: _Group,
        now: float,
        logger: logging.Logger,
        level: int,
        message: str,
        args: tuple[object, ...],
        extra: dict[str, Any],
    ) -> None:
        repeated, group.logged_at, group.folded, group.last = group.folded, now, 0, None
        if repeated:
            message += " (and %d more like it in the last %.0fs)"
            args = (*args, repeated, self._interval)
        logger.log(level, message, *args, extra={**extra, "repeated": repeated})

    def _expire(self, now: float) -> None:
        """Forget groups quiet for two intervals (telling what they folded, in one line), so
        a new key gets its own first line again once a flood is over."""
        stale = [
            (name, group)
            for name, group in self._groups.items()
            if now - group.logged_at >= 2 * self._interval
        ]
        for name, group in stale:
            if group.last is not None:
                logger, level, message, args, extra = group.last
                group.folded -= 1  # the line written now is the last one folded
                self._write(group, now, logger, level, message, args, extra)
            del self._groups[name]
            self._per_event[name[0]] -= 1
