"""Helpers for Prometheus metrics with bounded label values (docs/architecture.md#metrics)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from common.contracts import NAME_PATTERN

OTHER = "other"
_NAME = re.compile(NAME_PATTERN)


def nameable(value: str) -> bool:
    """Whether `value` may be a label value of its own: it matches the queue/task-type name
    pattern (anything else is reported as "other")."""
    return _NAME.match(value) is not None


class BoundedLabel:
    """Map the label values of a counter or histogram onto a bounded set; the rest become
    "other".

    A counter's series cannot be handed back (a removed series loses what it counted), so a
    value that got a label keeps it for the life of the process (what it counted before that
    stays in "other"), and the set only grows, within bounds:

    - the first `limit` distinct values seen get a label of their own: first come, first
      served, so a client that names `limit` junk values first leaves later values in "other";
    - `admit(values)` gives up to `reserve` more values a label of their own, for values
      something else vouches for (the queue service admits the queues its depth gauges rank
      highest, so a queue with live jobs gets its own counters whatever came first);
    - `keep(values)` gives values a label of their own outside both bounds, for values known
      from configuration (the task types of a worker's processors).

    Values that do not match the queue/task-type name pattern are "other" unless kept, so a
    metric's series count stays below `limit + reserve + len(kept) + 1` whatever clients send.
    """

    def __init__(self, limit: int = 100, reserve: int = 0) -> None:
        self._limit = limit
        self._reserve = reserve
        self._seen: set[str] = set()
        self._admitted: set[str] = set()
        self._kept: set[str] = set()

    def __call__(self, value: str) -> str:
        """Return `value` itself when it has a label or there is room for it, else "other"."""
        if value in self._seen or value in self._admitted or value in self._kept:
            return value
        if not nameable(value) or len(self._seen) >= self._limit:
            return OTHER
        self._seen.add(value)
        return value

    def admit(self, values: Iterable[str]) -> None:
        """Give each of `values` (in order) that has no label yet one from the reserve, while
        the reserve lasts; values that do not match the name pattern are skipped."""
        for value in values:
            if len(self._admitted) >= self._reserve:
                return
            if value not in self._seen and value not in self._kept and nameable(value):
                self._admitted.add(value)

    def keep(self, values: Iterable[str]) -> None:
        """Give every one of `values` a label of its own, outside the bounds."""
        self._kept.update(values)
