"""The processor SDK: what a processor is, what it receives, how it asks for a retry or
gives up, and how it is registered for a `taskType` (docs/architecture.md#worker).

A processor is an async callable taking a `JobContext` and returning a JSON-serialisable result
(stored on the job) or None. Delivery is at-least-once: a processor may run more than once for
the same job, so it must be idempotent; `JobContext.id` and `idempotency_key` are stable
across attempts and are what to deduplicate on.

A worker loads your processors from a module listed in `WORKER_PROCESSOR_MODULES`:

    # myapp/jobs.py, listed as WORKER_PROCESSOR_MODULES=myapp.jobs
    from jobq import JobContext, ProcessorRegistry

    async def resize(job: JobContext) -> dict[str, int]:
        ...  # must be idempotent: the same job may run more than once

    def register(registry: ProcessorRegistry) -> None:
        registry.register("resize-image", resize)

Pure: it needs the standard library only, so the client distribution ships it and the worker
service runs it.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

ProgressSink = Callable[[float, str | None], None]
"""Where a worker takes a processor's progress reports: `(fraction 0..1, message or None)`."""


@dataclass(frozen=True, slots=True)
class JobContext:
    """One claimed attempt: the job's id, task type, payload and attempt number (1-based);
    `progress()` reports how far it has got."""

    id: uuid.UUID
    task_type: str
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    idempotency_key: str | None
    progress_sink: ProgressSink | None = field(default=None, repr=False, compare=False)

    async def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far this attempt has got: `fraction` done, 0 to 1 (a value outside is
        clamped into it), with an optional short `message` (cut to 200 characters).

        Cheap to call often: it records the latest report, which rides the worker's next lease
        heartbeat (brought forward to at most one every 2 s per job), so no report costs a
        round trip of its own; reports in between replace each other. The job view shows the
        latest (`progress`: fraction, message, attempt, at). Raises ValueError for a fraction
        that is not a finite number (NaN, infinity) or a message that is not a string.
        Source: BullMQ's `job.updateProgress`, Celery's `update_state`.
        """
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ValueError(f"progress must be a number from 0 to 1, not {fraction!r}")
        if not math.isfinite(fraction):
            raise ValueError(f"progress must be a finite number, not {fraction!r}")
        if message is not None and not isinstance(message, str):
            raise ValueError(f"a progress message is a string, not {type(message).__name__}")
        if self.progress_sink is not None:
            self.progress_sink(min(1.0, max(0.0, float(fraction))), message)


Processor = Callable[[JobContext], Awaitable[Any]]
"""`async def process(job: JobContext) -> result | None`."""


class Retry(Exception):
    """Raise to fail this attempt as retryable, optionally after `after` seconds (else backoff).

    Source: arq's `Retry(defer=…)`, pgqueuer's `RetryRequested`.
    """

    def __init__(self, reason: str = "retry requested", *, after: float | None = None) -> None:
        super().__init__(reason)
        self.after = after


class NonRetryable(Exception):
    """Raise to dead-letter the job at once: retrying cannot help (bad payload, 4xx, …)."""


@dataclass(frozen=True, slots=True)
class Registration:
    """A processor, its default timeout in seconds (None: the worker's default), and the most
    a job may ask for with its own `timeoutSeconds` (None: see `timeout`)."""

    processor: Processor
    timeout_seconds: float | None = None
    max_timeout_seconds: float | None = None

    def timeout(self, requested: float | None, worker_default: float) -> float:
        """The deadline of one run, in seconds: the job's `requested` timeout, capped at
        `max_timeout_seconds` (when unset, at the larger of this processor's default and
        `worker_default`, so a submitter never gets more time than the operator gave), or
        without a request this processor's default, else `worker_default`."""
        default = self.timeout_seconds or worker_default
        if requested is None:
            return default
        ceiling = self.max_timeout_seconds or max(default, worker_default)
        return min(requested, ceiling)


class ProcessorRegistry:
    """Processors by `taskType`. Extend it without touching the worker loop: list a module in
    `WORKER_PROCESSOR_MODULES`; the worker imports it and calls its `register(registry)`."""

    def __init__(self) -> None:
        self._by_task_type: dict[str, Registration] = {}

    def register(
        self,
        task_type: str,
        processor: Processor,
        *,
        timeout_seconds: float | None = None,
        max_timeout_seconds: float | None = None,
    ) -> None:
        """Register `processor` for `task_type`, replacing any earlier one; the timeouts are
        those of `Registration`."""
        self._by_task_type[task_type] = Registration(
            processor, timeout_seconds, max_timeout_seconds
        )

    def cap_timeouts(self, caps: dict[str, float]) -> None:
        """Cap the timeout jobs of each task type in `caps` may ask for, in seconds
        (`WORKER_TIMEOUT_CAPS`); task types not registered are ignored."""
        for task_type, seconds in caps.items():
            registration = self._by_task_type.get(task_type)
            if registration is not None:
                self._by_task_type[task_type] = replace(registration, max_timeout_seconds=seconds)

    def get(self, task_type: str) -> Registration | None:
        """The registration for `task_type`, or None when no processor handles it."""
        return self._by_task_type.get(task_type)

    def task_types(self) -> list[str]:
        """Registered task types, sorted."""
        return sorted(self._by_task_type)
