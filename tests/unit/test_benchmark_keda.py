"""The simulation's controller applies KEDA's and the HPA's documented rules to the worker
ScaledObject of the production overlay (pure logic: values in, replica counts out)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmark.autoscale import TRACE, arrivals_until
from benchmark.keda import Controller, Policy, Scaling
from infra.kubernetes import render


@pytest.fixture(scope="module")
def worker() -> dict[str, Any]:
    return next(
        o
        for o in render("production")
        if o["kind"] == "ScaledObject" and o["metadata"]["name"] == "jobq-worker"
    )


def test_scaling_reads_the_scaled_object(worker: dict[str, Any]) -> None:
    scaling = Scaling.from_scaled_object(worker)
    assert (scaling.minimum, scaling.maximum) == (0, 20)
    assert (scaling.polling, scaling.cooldown, scaling.down_window) == (15, 300, 120)
    assert Policy("Percent", 100, 15) in scaling.up_policies
    assert {t.name: t.threshold for t in scaling.triggers} == {
        "demand": 64,
        "oldest-pending-age": 30,
    }
    faster = Scaling.from_scaled_object(worker, time_scale=10, slots=4)
    assert (faster.polling, faster.cooldown, faster.down_window) == (1.5, 30, 12)
    assert {t.name: t.threshold for t in faster.triggers} == {
        "demand": 4,
        "oldest-pending-age": 3,
    }


def test_activation_scale_up_limits_stabilisation_and_cooldown(worker: dict[str, Any]) -> None:
    controller = Controller(Scaling.from_scaled_object(worker))
    idle = {"demand": 0.0, "oldest-pending-age": 0.0}
    assert controller.decide(0, idle, 0) == 0, "nothing waits: stays at zero"
    # One job activates: 0 -> 1 (KEDA), whatever the HPA would ask.
    assert controller.decide(15, {"demand": 1.0, "oldest-pending-age": 0.0}, 0) == 1
    # 5,000 jobs ask for 79, but one period may only double or add 4: 1 -> 5.
    busy = {"demand": 5000.0, "oldest-pending-age": 2.0}
    assert controller.decide(30, busy, 1) == 5
    assert controller.decide(45, busy, 5) == 10
    assert controller.decide(60, busy, 10) == 20, "capped at maxReplicaCount"
    # The backlog is gone: the highest recommendation of the last 120 s holds the fleet.
    draining = {"demand": 32.0, "oldest-pending-age": 0.0}
    assert controller.decide(75, draining, 20) == 20
    assert controller.decide(200, draining, 20) == 10, "then at most half a minute"
    assert controller.decide(215, draining, 10) == 10, "one halving per 60 s"
    assert controller.decide(290, draining, 10) == 5
    # Idle, but within the cooldown (300 s) of the last activity: the HPA's minimum of 1,
    # reached at half the replicas a minute; past the cooldown, KEDA goes to zero.
    assert controller.decide(400, idle, 5) == 3
    assert controller.decide(589, idle, 3) == 2
    assert controller.decide(591, idle, 2) == 0


def test_the_age_trigger_scales_in_proportion(worker: dict[str, Any]) -> None:
    controller = Controller(Scaling.from_scaled_object(worker))
    # Few jobs (demand 1 replica) but the oldest has waited 90 s against 30: 2 -> 6.
    assert controller.decide(0, {"demand": 10.0, "oldest-pending-age": 90.0}, 2) == 6


def test_the_trace_submits_its_integral() -> None:
    assert arrivals_until(0) == 0
    assert arrivals_until(TRACE[1][0]) == TRACE[0][2] * (TRACE[0][1] - TRACE[0][0])
    total = sum(rate * (end - start) for start, end, rate in TRACE)
    assert arrivals_until(TRACE[-1][1] + 100) == total
