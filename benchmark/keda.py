"""KEDA's and the HPA's documented scaling algorithm, as a small controller the autoscaling
simulation (`benchmark.autoscale`) drives real worker processes with.

`Scaling.from_scaled_object` reads everything from a rendered ScaledObject of `infra/k8s`
(polling interval, cooldown, replica bounds, the HPA behavior's stabilisation windows and
policies, the triggers), optionally compressed in time. `Controller.decide` applies, per
polling interval:

- KEDA (keda.sh, "Scaling Deployments": activation and cooldown): a trigger is active while
  its value exceeds its activation threshold; from 0 replicas, any active trigger scales to 1;
  with `minReplicaCount` 0, once no trigger has been active for `cooldownPeriod`, to 0.
- The HPA (kubernetes.io, "Horizontal Pod Autoscaling": algorithm details, stabilization
  window, scaling policies): each trigger's recommendation (`infra.kubernetes.hpa_desired`),
  the largest wins; a scale-down takes the highest recommendation of the stabilisation
  window; the change per period is bounded by the policies (`selectPolicy: Max` picks the
  policy allowing the largest change), counted from the replicas at the period's start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from infra.kubernetes import Trigger, hpa_desired, keda_triggers


@dataclass(frozen=True)
class Policy:
    """An HPA scaling policy: `Pods` (a count) or `Percent` of the replicas at the start of
    each `period` seconds."""

    type: str
    value: int
    period: float

    def limit(self, start: int, up: bool) -> int:
        """The most (`up`) or fewest replicas this policy allows from `start` replicas."""
        if self.type == "Pods":
            return start + self.value if up else max(0, start - self.value)
        if up:
            return math.ceil(start * (1 + self.value / 100))
        return math.ceil(start * (1 - self.value / 100))


@dataclass(frozen=True)
class Scaling:
    """What a ScaledObject asks of KEDA and the HPA; every duration in seconds."""

    triggers: tuple[Trigger, ...]
    minimum: int
    maximum: int
    polling: float
    cooldown: float
    up_window: float
    down_window: float
    up_policies: tuple[Policy, ...]
    down_policies: tuple[Policy, ...]

    @classmethod
    def from_scaled_object(
        cls, item: dict[str, Any], time_scale: float = 1.0, slots: int | None = None
    ) -> Scaling:
        """The scaling of ScaledObject `item` (rendered YAML), every duration divided by
        `time_scale` (the age trigger's threshold, in seconds, too); with `slots`, the demand
        trigger's threshold (the slots of one replica) replaced by it."""
        spec = item["spec"]
        behavior = (
            spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
        )

        def policies(direction: str) -> tuple[Policy, ...]:
            rules = behavior.get(direction, {}).get("policies", [])
            return tuple(
                Policy(p["type"], p["value"], p["periodSeconds"] / time_scale) for p in rules
            )

        def window(direction: str, default: float) -> float:
            seconds = behavior.get(direction, {}).get("stabilizationWindowSeconds", default)
            return float(seconds) / time_scale

        triggers = []
        for trigger in keda_triggers([item]).values():
            if trigger.metric_type == "Value":
                trigger = replace(trigger, threshold=trigger.threshold / time_scale)
            elif slots is not None:
                trigger = replace(trigger, threshold=float(slots))
            triggers.append(trigger)
        return cls(
            triggers=tuple(triggers),
            minimum=spec.get("minReplicaCount", 0),
            maximum=spec.get("maxReplicaCount", 100),
            polling=spec.get("pollingInterval", 30) / time_scale,
            cooldown=spec.get("cooldownPeriod", 300) / time_scale,
            up_window=window("scaleUp", 0),
            down_window=window("scaleDown", 300),
            up_policies=policies("scaleUp"),
            down_policies=policies("scaleDown"),
        )


@dataclass
class Controller:
    """The replica count KEDA and the HPA would set, decided once per polling interval."""

    scaling: Scaling
    last_active: float = -math.inf
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    changes: list[tuple[float, int]] = field(default_factory=list)

    def _bounded(self, now: float, current: int, desired: int) -> int:
        """`desired` within the policies' limits for this period."""
        scaling = self.scaling
        if desired > current and scaling.up_policies:
            limits = []
            for policy in scaling.up_policies:
                added = sum(d for t, d in self.changes if t > now - policy.period and d > 0)
                limits.append(policy.limit(current - added, up=True))
            desired = min(desired, max(limits))
        elif desired < current and scaling.down_policies:
            limits = []
            for policy in scaling.down_policies:
                removed = sum(-d for t, d in self.changes if t > now - policy.period and d < 0)
                limits.append(policy.limit(current + removed, up=False))
            desired = max(desired, min(limits))
        return desired

    def decide(self, now: float, values: dict[str, float], current: int) -> int:
        """Replicas to run from `now` (seconds on any monotonic clock), given each trigger's
        query `values` (by trigger name) and the `current` replica count. KeyError for a
        trigger without a value."""
        scaling = self.scaling
        active = any(values[t.name] > t.activation for t in scaling.triggers)
        if active:
            self.last_active = now
        if current == 0:
            desired = max(scaling.minimum, 1) if active else scaling.minimum
        elif scaling.minimum == 0 and now - self.last_active >= scaling.cooldown:
            desired = 0
        else:
            raw = max(
                hpa_desired(t, values[t.name], current, scaling.minimum, scaling.maximum)
                for t in scaling.triggers
            )
            self.recommendations.append((now, raw))
            horizon = now - max(scaling.down_window, scaling.up_window)
            self.recommendations = [(t, r) for t, r in self.recommendations if t >= horizon]
            if raw < current:
                recent = [r for t, r in self.recommendations if t >= now - scaling.down_window]
                desired = min(current, max(recent))
            else:
                recent = [r for t, r in self.recommendations if t >= now - scaling.up_window]
                desired = max(current, min(recent))
            desired = self._bounded(now, current, desired)
        if desired != current:
            self.changes.append((now, desired - current))
        return desired
