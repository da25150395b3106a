"""Processors for end-to-end failure tests, loaded with WORKER_PROCESSOR_MODULES."""

from __future__ import annotations

import os
import signal

from jobq.processors import JobContext, ProcessorRegistry


async def crash(job: JobContext) -> None:
    """Kill the worker process running it, every time (a poison job)."""
    os.kill(os.getpid(), signal.SIGKILL)


def register(registry: ProcessorRegistry) -> None:
    """Add the `crash` task type."""
    registry.register("crash", crash)
