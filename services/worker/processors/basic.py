"""Trivial processors for smoke tests, benchmarks and demos: `noop` and `sleep`."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Final

from jobq.processors import JobContext, NonRetryable

MAX_SLEEP_MS: Final = 3_600_000


async def noop(job: JobContext) -> None:
    """Succeed at once with no result; the payload is ignored."""


async def sleep(job: JobContext) -> dict[str, Any]:
    """Sleep `payload.ms` milliseconds (number 0..3,600,000; missing → 0), then succeed.

    Returns `{"sleptMs": ms}`. Raises NonRetryable when `ms` is not a number in range. A long
    sleep may need the job's `timeoutSeconds` raised above `WORKER_JOB_TIMEOUT`.
    """
    ms = job.payload.get("ms", 0)
    if isinstance(ms, bool) or not isinstance(ms, int | float):
        raise NonRetryable(f"sleep `ms` must be a number of milliseconds, not {ms!r}")
    if not math.isfinite(ms) or not 0 <= ms <= MAX_SLEEP_MS:
        raise NonRetryable(f"sleep `ms` must be between 0 and {MAX_SLEEP_MS}, not {ms!r}")
    await asyncio.sleep(ms / 1000)
    return {"sleptMs": ms}
