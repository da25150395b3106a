"""Recurring schedules as configured (`QUEUE_SCHEDULES`): `Schedule` and `parse_schedules`.

Parsed by the settings (to refuse a bad value at start) and fired by `recurring.py`
(docs/architecture.md#recurring-jobs); this module imports neither, so the two never form a
cycle.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from croniter import CroniterBadDateError, croniter

from common.contracts import Name, Priority
from common.errors import JobqError
from common.validation import check_payload

_CRON_SHAPE = re.compile(r"\S+( \S+){4,5}")
"""Five or six space-separated fields, nothing else (no tabs, newlines or a seventh field)."""


class Schedule(
    msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True
):
    """One entry of `QUEUE_SCHEDULES`: `{"name","cron","taskType",?"queue",?"payload",?"priority"}`.

    `cron` is a 5-field expression (minute hour day month weekday), or 6 fields with seconds
    last, as croniter reads it.
    """

    name: Name
    cron: str
    task_type: Name
    queue: Name = "default"
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    priority: Priority = 0

    def __post_init__(self) -> None:
        if not _CRON_SHAPE.fullmatch(self.cron) or not croniter.is_valid(self.cron):
            raise ValueError(
                f"schedule {self.name!r}: {self.cron!r} is not a 5- or 6-field cron expression"
            )
        try:
            croniter(self.cron, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
        except CroniterBadDateError:
            raise ValueError(f"schedule {self.name!r}: {self.cron!r} never fires") from None
        try:
            check_payload(self.payload)
        except JobqError as exc:
            raise ValueError(f"schedule {self.name!r}: payload: {exc.detail}") from None

    def bucket(self, now: datetime) -> datetime:
        """The start of the bucket `now` falls in: the latest cron time at or before now."""
        # get_prev is strictly before its start; nudging past `now` makes "at" count too.
        start: datetime = croniter(self.cron, now + timedelta(microseconds=1)).get_prev(datetime)
        return start

    def period(self, bucket: datetime) -> timedelta:
        """From the start of `bucket` to the next cron time (positive)."""
        following: datetime = croniter(self.cron, bucket).get_next(datetime)
        return following - bucket


def parse_schedules(raw: str) -> list[Schedule]:
    """Parse `QUEUE_SCHEDULES` (a JSON array); raises ValueError naming the bad entry."""
    try:
        schedules = msgspec.json.decode(raw.encode() or b"[]", type=list[Schedule])
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"QUEUE_SCHEDULES: {exc}") from None
    names = [s.name for s in schedules]
    if len(names) != len(set(names)):
        raise ValueError("QUEUE_SCHEDULES: schedule names must be unique")
    return schedules
