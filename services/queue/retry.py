"""The retry policy: how long a failed attempt waits before it runs again.

Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015): attempt `a`
(1-based) of a job that failed waits

    delay(a) = u · min(max_delay, base_delay · multiplier^min(a - 1, 30))  seconds,

with `u` drawn uniformly from (0, 1] for every failure, so jobs that failed together (a partner
down for everyone) come back spread out rather than in a herd. Capping the exponent at 30 keeps
attempt 10,000 finite. A processor's own `Retry(after=…)` replaces the delay; a job out of
attempts is dead-lettered instead (docs/architecture.md#fail). The ceiling is computed in the
fail statement itself, from the job's own attempt count; `u` is bound from here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

EXPONENT_CAP = 30
"""Attempts beyond this add no more growth to the ceiling."""

BACKOFF_CEILING_SQL = (
    "LEAST({max_delay}, {base_delay} * power({multiplier},"
    f" GREATEST(0, LEAST({{attempt}}::bigint - 1, {EXPONENT_CAP}))))"
)
"""The ceiling min(max_delay, base_delay · multiplier^min(attempt - 1, 30)) in SQL, given SQL
expressions for `attempt` and the three settings (`str.format`)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """The policy's settings, in seconds: `QUEUE_RETRY_BASE_DELAY`, `QUEUE_RETRY_MULTIPLIER`,
    `QUEUE_RETRY_MAX_DELAY`."""

    base_delay: float
    multiplier: float
    max_delay: float


def jitter() -> float:
    """A fresh `u`, uniform in (0, 1]: never 0, or a failed job would come back at once."""
    return 1.0 - random.random()
