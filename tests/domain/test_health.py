"""Run-health rules over a run's metrics lines (domain/health.py)."""

from __future__ import annotations

import pytest

from domain.health import findings, share
from training_configs.schema import DEFAULT_HEALTH, HealthRule, load_training_config

DEAD = HealthRule(metric="zero_variance_groups", at_least=1.0, steps=3, action="stop")
FLAKY = HealthRule(metric="env_error_rate", at_least=0.25, steps=2, action="warn")


def line(
    step: int, *, flat: float | None = 0.0, rollouts: int = 8, failed: int = 0, **counts
) -> dict:
    values = {
        "step": step, "rollouts": rollouts, "rollouts_asked": rollouts + failed,
        "failed_rollouts": failed, **counts,
    }  # fmt: skip
    if flat is not None:
        values["zero_variance_groups"] = flat
    return values


def test_a_rule_holds_on_its_last_steps_in_a_row_only() -> None:
    assert findings([line(1, flat=1.0), line(2, flat=1.0)], [DEAD]) == []
    dead = [line(1), line(2, flat=1.0), line(3, flat=1.0), line(4, flat=1.0)]
    (finding,) = findings(dead, [DEAD])
    assert (finding.first_step, finding.last_step, finding.value, finding.stops) == (
        2,
        4,
        1.0,
        True,
    )
    assert finding.reason() == (
        "run health: 100% of the GRPO groups had no reward variance (no learning signal) on "
        "steps 2-4 (zero_variance_groups >= 1 for 3 steps in a row: stop)"
    )
    recovered = [*dead, line(5, flat=0.5)]
    assert findings(recovered, [DEAD]) == []  # the last step had a signal again


def test_a_step_that_does_not_say_breaks_the_run() -> None:
    lines = [line(1, flat=1.0), line(2, flat=None), line(3, flat=1.0), line(4, flat=1.0)]
    assert findings(lines, [DEAD]) == []
    assert share({"step": 1, "rollouts": 8, "failed_rollouts": 0}, "failed_rollout_rate") is None
    assert share(line(1, rollouts=0, failed=0), "failed_rollout_rate") is None


def test_rates_are_shares_of_every_rollout_asked_for() -> None:
    step = line(1, rollouts=6, failed=2, env_error_rollouts=1, timeout_rollouts=1)
    assert share(step, "failed_rollout_rate") == 0.25
    assert share(step, "env_error_rate") == 0.125 and share(step, "timeout_rate") == 0.125
    assert share(line(1), "env_error_rate") is None  # not counted by this trainer
    flaky = [line(s, rollouts=6, failed=2, env_error_rollouts=2) for s in (1, 2)]
    (finding,) = findings(flaky, [DEAD, FLAKY])
    assert finding.rule is FLAKY and not finding.stops and finding.value == 0.25


def test_a_step_written_again_counts_once_as_last_written() -> None:
    """A resumed run writes its steps again: the rewritten step is the one that counts."""
    lines = [line(1, flat=1.0), line(2, flat=1.0), line(3, flat=1.0), line(3, flat=0.0)]
    assert findings(lines, [DEAD]) == []
    lines = [line(3, flat=0.0), line(1, flat=1.0), line(2, flat=1.0), line(3, flat=1.0)]
    assert [f.last_step for f in findings(lines, [DEAD])] == [3]


def test_every_config_gets_the_defaults_that_stop_a_dead_run() -> None:
    config = load_training_config("rft_multiturn_lora")
    assert tuple(config.health) == DEFAULT_HEALTH
    assert {(r.metric, r.action) for r in config.health} >= {
        ("zero_variance_groups", "stop"), ("failed_rollout_rate", "stop"),
    }  # fmt: skip
    never = config.model_copy(update={"health": []})
    assert findings([line(s, flat=1.0) for s in range(1, 50)], never.health) == []
    with pytest.raises(ValueError, match="at_least"):
        HealthRule(metric="timeout_rate", at_least=1.5, steps=1, action="warn")
