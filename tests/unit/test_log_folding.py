"""Repetitive log lines are folded (`common.logging.FailureRun`, `RepeatedEvents`): the first
occurrence is always written, repeats within the interval are counted, and the count is told."""

from __future__ import annotations

import logging

import pytest

from common.logging import FailureRun, RepeatedEvents


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


LOGGER = logging.getLogger("tests.folding")


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(str(getattr(r, "event", "")), r.getMessage()) for r in caplog.records]


def test_a_run_of_failures_is_its_first_one_line_per_interval_and_its_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    run = FailureRun(LOGGER, "listen", interval=30, clock=clock)
    caplog.set_level(logging.INFO, logger="tests.folding")
    for _ in range(47):  # one refusal a second, 47 s
        run.failed("LISTEN connection failed: %s", "too many connections")
        clock.now += 1
    run.succeeded()
    run.succeeded()  # nothing to end: no line

    assert lines(caplog) == [
        ("listen_failed", "LISTEN connection failed: too many connections (1 in a row)"),
        ("listen_failed", "LISTEN connection failed: too many connections (31 in a row)"),
        ("listen_recovered", "listen recovered after 47 failed attempts in 47.0s"),
    ]
    assert caplog.records[-1].down_seconds == 47.0


def test_an_unexpected_failure_is_an_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = FailureRun(LOGGER, "depth", clock=Clock())
    caplog.set_level(logging.INFO, logger="tests.folding")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        run.failed("depth crashed: %s", "boom", exc_info=True)
    [record] = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None


def test_repeats_of_one_kind_are_folded_and_counted_and_another_kind_still_shows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    events = RepeatedEvents(interval=30, clock=clock)
    caplog.set_level(logging.INFO, logger="tests.folding")
    extra = {"event": "job_dead_letter"}

    def dead_letter(task_type: str) -> bool:
        return events.log(
            LOGGER, logging.ERROR, task_type, "job dead-lettered: %s", task_type, extra=extra
        )

    written = [dead_letter("junk") for _ in range(650)]
    assert written.count(True) == 1
    assert dead_letter("email"), "a new kind's first occurrence is never hidden"
    clock.now += 31
    assert dead_letter("junk")
    assert lines(caplog) == [
        ("job_dead_letter", "job dead-lettered: junk"),
        ("job_dead_letter", "job dead-lettered: email"),
        ("job_dead_letter", "job dead-lettered: junk (and 649 more like it in the last 30s)"),
    ]
    assert caplog.records[-1].repeated == 649


def test_many_kinds_share_one_group_past_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    events = RepeatedEvents(interval=30, max_groups=4, clock=clock)
    caplog.set_level(logging.INFO, logger="tests.folding")
    for n in range(650):
        events.log(LOGGER, logging.ERROR, f"junk-{n}", "unknown %s", n, extra={"event": "e"})
    assert len(caplog.records) == 5  # four kinds of their own, then one line for all the rest
    clock.now += 61  # quiet groups are forgotten after two intervals; the folded one is told
    events.log(LOGGER, logging.ERROR, "junk-9999", "unknown %s", 9999, extra={"event": "e"})
    assert [r.getMessage() for r in caplog.records[5:]] == [
        "unknown 649 (and 644 more like it in the last 30s)",
        "unknown 9999",
    ]
