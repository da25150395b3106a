"""Helpers for Prometheus metrics with bounded label values (docs/architecture.md#metrics)."""

from __future__ import annotations

import re

from common.contracts import NAME_PATTERN

OTHER = "other"
_NAME = re.compile(NAME_PATTERN)


class BoundedLabel:
    """Map label values onto at most `limit` distinct values; the rest become "other".

    Values that do not match the queue/task-type pattern are "other" too, so a metric's series
    count stays bounded whatever clients send.
    """

    def __init__(self, limit: int = 100) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        """Return `value` itself while there is room for it, else "other"."""
        if value in self._seen:
            return value
        if not _NAME.match(value) or len(self._seen) >= self._limit:
            return OTHER
        self._seen.add(value)
        return value
