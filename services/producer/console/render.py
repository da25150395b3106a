"""What the console's templates show that is not in a reply as is: a throughput chart as
inline SVG, dead-letter errors normalised into groups, JSON pretty-printed with a size cap."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from common.contracts import ListedJob
from common.operations import MinuteCount

JSON_SHOWN_BYTES = 64 * 1024
"""A payload or result larger than this is cut, with a link to show it all."""

CHART_WIDTH, CHART_HEIGHT = 240, 40

# Ids, numbers and quoted values would give every failure its own group; what is left is the
# error's shape ("connection refused to <n>.<n>.<n>.<n>:<n>").
_VARIABLE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # uuid
    r"|\b[0-9a-f]{12,}\b"  # long hex ids
    r"|'[^']*'|\"[^\"]*\""  # quoted values
    r"|\d+(?:\.\d+)?",  # numbers
    re.IGNORECASE,
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def normalised(error: str | None) -> str:
    """`error` with ids, numbers and quoted values replaced, cut at 200 characters."""
    if not error:
        return "(no error recorded)"
    shape = _VARIABLE.sub(lambda m: "<n>" if _NUMBER.fullmatch(m.group()) else "<id>", error)
    return " ".join(shape.split())[:200]


@dataclass
class DeadGroup:
    """Dead letters of one queue and task type: how many, and their commonest errors."""

    queue: str
    task_type: str
    tenants: set[str] = field(default_factory=set)
    ids_by_error: dict[str, list[str]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        """Jobs in the group."""
        return sum(len(ids) for ids in self.ids_by_error.values())

    def errors(self, most: int = 5) -> list[tuple[str, list[str]]]:
        """The `most` commonest normalised errors with their jobs' ids, commonest first."""
        counts = Counter({error: len(ids) for error, ids in self.ids_by_error.items()})
        return [(error, self.ids_by_error[error]) for error, _ in counts.most_common(most)]


def dead_groups(jobs: Iterable[ListedJob]) -> list[DeadGroup]:
    """Group dead-lettered jobs by queue and task type, then by normalised last error;
    largest group first."""
    groups: dict[tuple[str, str], DeadGroup] = {}
    for job in jobs:
        group = groups.setdefault((job.queue, job.task_type), DeadGroup(job.queue, job.task_type))
        group.tenants.add(job.tenant)
        group.ids_by_error.setdefault(normalised(job.last_error), []).append(str(job.id))
    return sorted(groups.values(), key=lambda g: (-g.count, g.queue, g.task_type))


@dataclass(frozen=True)
class Chart:
    """One queue's per-minute counts as SVG polyline points (`width` x `height` user units),
    and the largest count (the chart's top)."""

    completed: str
    failed: str
    top: int
    total_completed: int
    total_failed: int


def charts(points: Sequence[MinuteCount], now: datetime, minutes: int = 60) -> dict[str, Chart]:
    """Per queue, the chart of its last `minutes` minutes ending at `now` (missing minutes
    count 0)."""
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    series: dict[str, list[tuple[int, int]]] = {}
    for point in points:
        index = int((point.minute - start).total_seconds() // 60)
        if 0 <= index < minutes:
            slots = series.setdefault(point.queue, [(0, 0)] * minutes)
            slots[index] = (point.completed, point.failed)
    result = {}
    for queue, slots in series.items():
        top = max(max(c, f) for c, f in slots) or 1
        step = CHART_WIDTH / max(minutes - 1, 1)

        def line(values: list[int], top: int = top, step: float = step) -> str:
            return " ".join(
                f"{i * step:.1f},{CHART_HEIGHT - v / top * (CHART_HEIGHT - 2):.1f}"
                for i, v in enumerate(values)
            )

        result[queue] = Chart(
            completed=line([c for c, _ in slots]),
            failed=line([f for _, f in slots]),
            top=top,
            total_completed=sum(c for c, _ in slots),
            total_failed=sum(f for _, f in slots),
        )
    return result


def pretty(value: Any, show_all: bool) -> tuple[str, bool]:
    """`value` as indented JSON, cut at JSON_SHOWN_BYTES unless `show_all`; returns the text
    and whether it was cut."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    if show_all or len(text.encode()) <= JSON_SHOWN_BYTES:
        return text, False
    return text.encode()[:JSON_SHOWN_BYTES].decode(errors="ignore") + "\n…", True
