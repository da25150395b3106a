"""The queue service's periodic loop (`services.queue.background.every`): a run of failures is a
few log lines, not one per tick, and the loop keeps going and says when it recovered."""

from __future__ import annotations

import asyncio
import logging

import pytest

from common.errors import ServiceUnavailable
from services.queue.background import every


async def test_a_failing_step_is_logged_once_per_run_and_its_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shutdown = asyncio.Event()
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls <= 50:
            raise ServiceUnavailable("the database is unavailable; retry shortly")
        if calls == 60:
            shutdown.set()

    with caplog.at_level(logging.INFO, logger="services.queue.background"):
        await asyncio.wait_for(every("scheduler", 0.001, step, shutdown), timeout=10)

    events = [getattr(r, "event", "") for r in caplog.records]
    assert calls == 60
    assert events == ["scheduler_failed", "scheduler_recovered"]
    assert "50 failed attempts" in caplog.records[-1].getMessage()


async def test_an_unexpected_error_keeps_its_traceback_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shutdown = asyncio.Event()
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        shutdown.set()

    with caplog.at_level(logging.INFO, logger="services.queue.background"):
        await asyncio.wait_for(every("depth", 0.001, step, shutdown), timeout=10)

    failed = [r for r in caplog.records if getattr(r, "event", "") == "depth_failed"]
    assert calls == 2 and len(failed) == 1 and failed[0].exc_info is not None
