"""Run health: the config's rules (training_configs/schema.py `HealthRule`) over the metrics a
run writes a line of per training step (`runs/<run_id>/metrics.jsonl`: our trainer's own, or
the router's windows for a Nova job).

A rule holds when its metric was at least its threshold on each of the last `steps` steps. The
metrics, each a share in [0, 1]:

| metric | of a step |
|---|---|
| zero_variance_groups | GRPO groups whose rollouts all scored the same: no learning signal |
| failed_rollout_rate | rollouts without a score (environment error, timeout, no answer) |
| env_error_rate | rollouts that ended in an environment error |
| timeout_rate | rollouts that timed out or never came back |

Rates are shares of the rollouts a step asked for (`rollouts_asked`: our trainer's and the
router's lines write it). A step whose line does not say (a trainer that does not count it) breaks the run of steps, so
a rule never fires on what was not measured. A step written twice (a resumed run) counts once,
as last written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training_configs.schema import HealthMetric, HealthRule

# What each metric means, for the reason a finding gives.
MEANING: Mapping[HealthMetric, str] = {
    "zero_variance_groups": "of the GRPO groups had no reward variance (no learning signal)",
    "failed_rollout_rate": "of the rollouts failed (no score)",
    "env_error_rate": "of the rollouts ended in an environment error",
    "timeout_rate": "of the rollouts timed out",
}


def share(line: Mapping[str, Any], metric: HealthMetric) -> float | None:
    """`metric` of one step's metrics line, or None when the line does not say."""
    if metric == "zero_variance_groups":
        value = line.get("zero_variance_groups")
        return float(value) if isinstance(value, int | float) else None
    asked, failed = line.get("rollouts_asked"), line.get("failed_rollouts")
    if not isinstance(asked, int) or not isinstance(failed, int) or asked == 0:
        return None
    counted = {
        "failed_rollout_rate": failed,
        "env_error_rate": line.get("env_error_rollouts"),
        "timeout_rate": line.get("timeout_rollouts"),
    }[metric]
    return counted / asked if isinstance(counted, int) else None


@dataclass(frozen=True)
class Finding:
    rule: HealthRule
    first_step: int
    last_step: int
    value: float  # the metric on the last step

    @property
    def stops(self) -> bool:
        return self.rule.action == "stop"

    def reason(self) -> str:
        rule = self.rule
        steps = (
            f"step {self.last_step}"
            if self.first_step == self.last_step
            else f"steps {self.first_step}-{self.last_step}"
        )
        return (
            f"run health: {self.value:.0%} {MEANING[rule.metric]} on {steps} "
            f"({rule.metric} >= {rule.at_least:g} for {rule.steps} steps in a row: {rule.action})"
        )


def findings(lines: Iterable[Mapping[str, Any]], rules: Sequence[HealthRule]) -> list[Finding]:
    """The rules that hold on the last steps of `lines` (metrics lines, in the order written)."""
    by_step: dict[int, Mapping[str, Any]] = {}
    for line in lines:
        if isinstance(line.get("step"), int):
            by_step.pop(line["step"], None)  # rewritten: it moves to where it was last written
            by_step[line["step"]] = line
    steps = list(by_step.items())
    found = []
    for rule in rules:
        streak: list[tuple[int, float]] = []
        for step, line in reversed(steps):
            value = share(line, rule.metric)
            if value is None or value < rule.at_least or len(streak) == rule.steps:
                break
            streak.append((step, value))
        if len(streak) == rule.steps:
            found.append(Finding(rule, streak[-1][0], streak[0][0], streak[0][1]))
    return found
