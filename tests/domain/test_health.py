"""Run-health rules over a run's metrics lines (domain/health.py)."""

from __future__ import annotations

import re

import pytest

from domain.health import findings, held_out_caution, share
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


def test_a_failure_rules_finding_says_the_first_failed_rollouts_error() -> None:
    """The first error of the steps the rule held on, whatever the steps before said; a rule
    about something else says none."""
    errors = ["step 1: OpenEnvError: before the streak", None, "step 4: KeyError: 'answer'"]
    flaky = [
        line(step, flat=1.0, rollouts=6, failed=2, env_error_rollouts=2, first_error=error)
        for step, error in zip((1, 3, 4), errors, strict=True)
    ]
    flaky[0] |= {"env_error_rollouts": 0}  # the streak is steps 3-4
    found = {finding.rule.metric: finding for finding in findings(flaky, [DEAD, FLAKY])}
    assert found["env_error_rate"].error == "step 4: KeyError: 'answer'"
    assert (
        found["env_error_rate"]
        .reason()
        .endswith(
            "(env_error_rate >= 0.25 for 2 steps in a row: warn); the first failure: step 4: "
            "KeyError: 'answer'"
        )
    )
    assert found["zero_variance_groups"].error is None


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


CUT = HealthRule(metric="truncation_rate", at_least=0.25, steps=2, action="warn")
HACKED = HealthRule(metric="reward_hacking", at_least=0.1, steps=3, action="warn")


def test_truncation_is_the_share_of_asked_rollouts_cut_at_the_token_limit() -> None:
    cut = [line(1, truncated_rollouts=1), line(2, truncated_rollouts=2), line(3, truncated_rollouts=3)]  # fmt: skip
    assert [share(step, "truncation_rate") for step in cut] == [0.125, 0.25, 0.375]
    (finding,) = findings(cut, [CUT])
    assert (finding.first_step, finding.last_step) == (2, 3)
    assert "38% of the rollouts were cut at the token limit (max_new_tokens)" in finding.reason()
    assert share(line(1), "truncation_rate") is None  # a line that does not count them


def curve(rewards: list[float], successes: list[float | None], key: str = "win_rate") -> list:
    return [
        {**line(step), "mean_reward": reward, key: success}
        for step, (reward, success) in enumerate(zip(rewards, successes, strict=True), start=1)
    ]


def test_a_reward_that_climbs_while_successes_do_not_is_flagged() -> None:
    rising = [0.1 + 0.05 * step for step in range(12)]
    flat = [0.2] * 12
    (finding,) = findings(curve(rising, flat), [HACKED])
    assert (finding.first_step, finding.last_step) == (10, 12)
    assert finding.value == pytest.approx(0.35)  # the last three steps' mean less the first three's
    assert finding.reason().startswith(
        "run health: +0.35 mean reward over the last 10 steps while the success rate did not rise "
        "(possible reward hacking) on steps 10-12"
    )
    # Nova's windows say `pass_rate`: the same heuristic.
    assert findings(curve(rising, flat, key="pass_rate"), [HACKED])
    # Learning: the successes rise with the reward.
    assert findings(curve(rising, [0.05 * step for step in range(12)]), [HACKED]) == []
    # Too few steps to tell, or an environment that reports no success flag: never fires.
    assert findings(curve(rising[:9], flat[:9]), [HACKED]) == []
    assert findings(curve(rising, [None] * 12), [HACKED]) == []
    # A reward that does not rise is no hacking, whatever the successes do.
    assert findings(curve([0.5] * 12, flat), [HACKED]) == []


def test_a_rule_may_bound_a_figure_from_below_too() -> None:
    collapsed = HealthRule(metric="reward_spread", at_most=0.01, steps=2, action="warn")
    long = HealthRule(metric="mean_turns", at_least=9, steps=2, action="stop")
    low = HealthRule(metric="mean_reward", at_most=0.05, steps=2, action="warn")
    steps = [
        {**line(1), "reward_std": 0.2, "turns_per_episode": 9.5, "mean_reward": 0.3},
        {**line(2), "reward_std": 0.0, "turns_per_episode": 10, "mean_reward": 0.01},
        {**line(3), "reward_std": 0.005, "turns_per_episode": 9, "mean_reward": 0.02},
    ]
    found = {f.rule.metric: f for f in findings(steps, [collapsed, long, low])}
    assert found["reward_spread"].reason() == (
        "run health: reward spread (standard deviation) 0.005 on steps 2-3 "
        "(reward_spread <= 0.01 for 2 steps in a row: warn)"
    )
    assert (found["mean_turns"].first_step, found["mean_turns"].stops) == (2, True)
    assert "mean reward 0.02 on steps 2-3 (mean_reward <= 0.05" in found["mean_reward"].reason()
    assert findings(steps[:2], [collapsed]) == []  # step 1 spread: 0.2


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"metric": "env_error_rate", "steps": 2, "action": "warn"}, "give one of at_least or at_most"),
        ({"metric": "env_error_rate", "at_least": 0.1, "at_most": 0.2, "steps": 2, "action": "warn"},
         "give one of at_least or at_most"),
        ({"metric": "env_error_rate", "at_least": 2, "steps": 2, "action": "warn"},
         "at_least 2 is not a share (0 to 1)"),
        ({"metric": "mean_turns", "at_least": -1, "steps": 2, "action": "warn"},
         "at_least -1: turns are not negative"),
    ],
)  # fmt: skip
def test_a_rule_that_cannot_hold_is_refused_with_the_fix(rule: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        HealthRule.model_validate(rule)


def test_a_training_reward_that_rose_without_held_out_gain_is_cautioned() -> None:
    rising = [{"step": step, "mean_reward": 0.1 * step} for step in range(1, 7)]
    caution = held_out_caution(rising, pass_at_1_change=0.0)
    assert caution == (
        "run health: the training reward rose by +0.30 but held-out pass@1 did not (+0.00): "
        "possible reward hacking or memorised prompts"
    )
    assert held_out_caution(rising, pass_at_1_change=0.05) is None  # it learned
    assert held_out_caution(rising, pass_at_1_change=None) is None  # not evaluated
    assert held_out_caution(rising[:1], pass_at_1_change=-0.2) is None  # one step: no trend
    flat = [{"step": step, "mean_reward": 0.5} for step in range(1, 7)]
    assert held_out_caution(flat, pass_at_1_change=-0.2) is None  # the reward did not rise
    # Two steps: each end is one step.
    assert "+0.40" in held_out_caution([{"mean_reward": 0.1}, {"mean_reward": 0.5}], -0.1)


def test_the_held_out_check_compares_the_ends_of_training_from_a_rise_of_a_tenth() -> None:
    seven = [{"mean_reward": reward} for reward in (0.0, 0.0, 0.0, 0.9, 0.0, 0.3, 0.3)]
    assert "rose by +0.20 " in held_out_caution(seven, pass_at_1_change=0.0)  # last 3 vs first 3
    assert held_out_caution([{"mean_reward": 0.0}, {"mean_reward": 0.1}], 0.0) is not None
    assert held_out_caution([{"mean_reward": 0.0}, {"mean_reward": 0.09}], 0.0) is None


def test_a_sampler_that_is_not_the_policy_is_warned_of_by_default() -> None:
    """The open-weights trainer's mismatch_kl over three steps past 0.01: the default rules
    warn and say the figure; a trainer that does not measure it never trips the rule."""
    lines = [{"step": step, "mismatch_kl": 0.05} for step in (1, 2, 3)]
    (finding,) = findings(lines, DEFAULT_HEALTH)
    assert not finding.stops
    assert "sampler/trainer KL per sampled token 0.05 on steps 1-3" in finding.reason()
    assert findings([{"step": s, "mismatch_kl": None} for s in (1, 2, 3)], DEFAULT_HEALTH) == []
