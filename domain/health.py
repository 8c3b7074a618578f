"""Run health: the config's rules (training_configs/schema.py `HealthRule`) over the metrics a
run writes a line of per training step (`runs/<run_id>/metrics.jsonl`: our trainer's own, or
the router's windows for a Nova job).

A rule holds when its metric was at least its threshold on each of the last `steps` steps. The
metrics, the first five shares in [0, 1]:

| metric | of a step |
|---|---|
| zero_variance_groups | GRPO groups whose rollouts all scored the same: no learning signal |
| failed_rollout_rate | rollouts without a score (environment error, timeout, no answer) |
| env_error_rate | rollouts that ended in an environment error |
| timeout_rate | rollouts that timed out or never came back |
| truncation_rate | rollouts with a model turn cut at the token limit (finish_reason "length") |
| reward_hacking | the rise of the mean reward over the last `HACKING_WINDOW` steps, when the
  environment's success rate did not rise with it (0 when it did): a reward that climbs
  while the task is no better done |
| mean_reward | the mean episode reward (a rule `at_most`: a reward that collapsed) |
| reward_spread | the standard deviation of the episode rewards (`at_most`: no signal left) |
| mean_turns | turns per episode (`at_least` near max_turns: episodes that never end) |
| sampler_mismatch | the open-weights trainer's KL per token between the log-probabilities its
  generator reported and its own for the same tokens, at the update's start (`mismatch_kl`) |

Rates are shares of the rollouts a step asked for (`rollouts_asked`: our trainer's and the
router's lines write it). A step whose line does not say (a trainer that does not count it) breaks the run of steps, so
a rule never fires on what was not measured. A step written twice (a resumed run) counts once,
as last written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

from domain.step_metrics import first_step_error, number
from training_configs.schema import SHARES, HealthMetric, HealthRule

# What each metric means, for the reason a finding gives.
MEANING: Mapping[HealthMetric, str] = {
    "zero_variance_groups": "of the GRPO groups had no reward variance (no learning signal)",
    "failed_rollout_rate": "of the rollouts failed (no score)",
    "env_error_rate": "of the rollouts ended in an environment error",
    "timeout_rate": "of the rollouts timed out",
    "truncation_rate": "of the rollouts were cut at the token limit (max_new_tokens)",
    "reward_hacking": "mean reward over the last {window} steps while the success rate did not "
    "rise (possible reward hacking)",
    "mean_reward": "mean reward",
    "reward_spread": "reward spread (standard deviation)",
    "mean_turns": "mean turns per episode",
    "sampler_mismatch": "sampler/trainer KL per sampled token",
}
# Where a metrics line says each figure that is not counted from rollouts (our trainer's name
# first, then the router's windows').
FIGURE_KEYS: Mapping[str, tuple[str, ...]] = {
    "zero_variance_groups": ("zero_variance_groups",),
    "mean_reward": ("mean_reward",),
    "reward_spread": ("reward_std",),
    "mean_turns": ("turns_per_episode",),
    "sampler_mismatch": ("mismatch_kl",),
}
# The rules about failed rollouts: their findings say the first failure's error.
FAILURES: frozenset[HealthMetric] = frozenset(
    {"failed_rollout_rate", "env_error_rate", "timeout_rate"}
)
# Steps the reward-hacking heuristic compares: the mean of the first and last three of them.
HACKING_WINDOW, HACKING_ENDS = 10, 3


def share(line: Mapping[str, Any], metric: HealthMetric) -> float | None:
    """`metric` of one step's metrics line, or None when the line does not say (every metric
    but `reward_hacking`, which needs the steps before: `value`)."""
    if metric in FIGURE_KEYS:
        found = [line[key] for key in FIGURE_KEYS[metric] if key in line]
        return number(found[0]) if found else None
    asked, failed = line.get("rollouts_asked"), line.get("failed_rollouts")
    if not isinstance(asked, int) or not isinstance(failed, int) or asked == 0:
        return None
    counted = {
        "failed_rollout_rate": failed,
        "env_error_rate": line.get("env_error_rollouts"),
        "timeout_rate": line.get("timeout_rollouts"),
        "truncation_rate": line.get("truncated_rollouts"),
    }[metric]
    return counted / asked if isinstance(counted, int) else None


def value(lines: Sequence[Mapping[str, Any]], metric: HealthMetric) -> float | None:
    """`metric` of the last of `lines` (one per step, in order), or None when not measured."""
    if metric != "reward_hacking":
        return share(lines[-1], metric)
    window = lines[-HACKING_WINDOW:]
    rewards = [line.get("mean_reward") for line in window]
    successes = [success_rate(line) for line in window]
    if len(window) < HACKING_WINDOW or any(
        not isinstance(x, int | float) for x in (*rewards, *successes)
    ):
        return None
    rise = _ends_apart(rewards)  # type: ignore[arg-type]
    return max(rise, 0.0) if _ends_apart(successes) <= 0 else 0.0  # type: ignore[arg-type]


def measured(lines: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Every run-health metric the last of `lines` (one per step, in order) measures."""
    found = {metric: value(lines, metric) for metric in get_args(HealthMetric)}
    return {metric: figure for metric, figure in found.items() if figure is not None}


# The held-out check: a training reward that rose by this much while pass@1 on records never
# trained on did not rise.
HELD_OUT_RISE = 0.1


def held_out_caution(
    lines: Sequence[Mapping[str, Any]], pass_at_1_change: float | None
) -> str | None:
    """The reward-hacking heuristic against the held-out evaluation, once the run ends: the
    mean reward's rise over training (its last three steps' mean less its first three's) when
    pass@1 on the held-out records did not rise. None when it did, or either is unknown."""
    rewards = [reward for line in lines if (reward := number(line.get("mean_reward"))) is not None]
    if len(rewards) < 2 or pass_at_1_change is None:
        return None
    ends = min(HACKING_ENDS, len(rewards) // 2)
    rise = sum(rewards[-ends:]) / ends - sum(rewards[:ends]) / ends
    if rise < HELD_OUT_RISE or pass_at_1_change > 0:
        return None
    return (
        f"run health: the training reward rose by {rise:+.2f} but held-out pass@1 did not "
        f"({pass_at_1_change:+.2f}): possible reward hacking or memorised prompts"
    )


def success_rate(line: Mapping[str, Any]) -> float | None:
    """The share of a step's rollouts the environment called a success (our trainer's
    `win_rate`, the router's `pass_rate`)."""
    return number(line.get("win_rate", line.get("pass_rate")))


def _ends_apart(series: Sequence[float]) -> float:
    return sum(series[-HACKING_ENDS:]) / HACKING_ENDS - sum(series[:HACKING_ENDS]) / HACKING_ENDS


@dataclass(frozen=True)
class Finding:
    rule: HealthRule
    first_step: int
    last_step: int
    value: float  # the metric on the last step
    error: str | None = None  # a failure rule's: the first failed rollout's error of the steps

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
        if rule.metric == "reward_hacking":
            measured = f"+{self.value:.2f} {MEANING[rule.metric].format(window=HACKING_WINDOW)}"
        elif rule.metric in SHARES:
            measured = f"{self.value:.0%} {MEANING[rule.metric]}"
        else:
            measured = f"{MEANING[rule.metric]} {self.value:.3g}"
        told = f"; the first failure: {self.error}" if self.error else ""
        return (
            f"run health: {measured} on {steps} "
            f"({rule.metric} {rule.bound} for {rule.steps} steps in a row: {rule.action}){told}"
        )


def findings(lines: Iterable[Mapping[str, Any]], rules: Sequence[HealthRule]) -> list[Finding]:
    """The rules that hold on the last steps of `lines` (metrics lines, in the order written)."""
    by_step: dict[int, Mapping[str, Any]] = {}
    for line in lines:
        if isinstance(line.get("step"), int):
            by_step.pop(line["step"], None)  # rewritten: it moves to where it was last written
            by_step[line["step"]] = line
    steps = list(by_step.keys())
    ordered = list(by_step.values())
    found = []
    for rule in rules:
        streak: list[tuple[int, float]] = []
        for index in range(len(ordered) - 1, -1, -1):
            measured = value(ordered[: index + 1], rule.metric)
            if measured is None or not rule.holds(measured) or len(streak) == rule.steps:
                break
            streak.append((steps[index], measured))
        if len(streak) == rule.steps:
            held = [by_step[step] for step, _ in reversed(streak)]
            error = _first_error(held) if rule.metric in FAILURES else None
            found.append(Finding(rule, streak[-1][0], streak[0][0], streak[0][1], error))
    return found


def _first_error(lines: Sequence[Mapping[str, Any]]) -> str | None:
    """The first failed rollout's error the steps' lines name, in their order."""
    found = first_step_error(lines)
    return found[1] if found else None


# A run's steps as CloudWatch metrics (the dashboard's graphs; Monitor publishes them).
TRAINING_METRICS_NAMESPACE = "nova-mtrl/Training"
TRAINING_METRICS_SERVICE = "monitor"
# Each graphed figure: its CloudWatch name, and how a step's line (with those before) gives it:
# the success rate, and every run-health metric (MeanReward, ZeroVarianceGroups, ...).
TRAINING_FIGURES: Mapping[str, str] = {
    "SuccessRate": "success_rate",
    **{
        "".join(part.title() for part in metric.split("_")): metric
        for metric in get_args(HealthMetric)
    },
}


def step_figures(lines: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The figures of the last of `lines` (one per step, in order) that it measures."""
    health = measured(lines)
    success = success_rate(lines[-1])
    if success is not None:
        health["success_rate"] = success
    return {name: health[source] for name, source in TRAINING_FIGURES.items() if source in health}
