"""The local trainer's policy and GRPO update: exact gradients, clipping, KL, and learning."""

from __future__ import annotations

import numpy as np
import pytest

from mtrl.local.trainer.direct import train
from mtrl.local.trainer.grpo import Adam, Episode, group_advantages, objective_and_gradient
from mtrl.local.trainer.policy import Decision, NoLocalPolicy, WordlePolicy, policy_for
from reward_envs.interface import Record
from reward_envs.wordle import feedback, load_environment, words
from reward_envs.wordle.env import feedback_line, read_feedback


@pytest.fixture(scope="module")
def policy() -> WordlePolicy:
    return WordlePolicy()


def _decisions(seed: int, count: int = 4, candidates: int = 7, features: int = 3) -> list[Decision]:
    rng = np.random.default_rng(seed)
    decisions = []
    for _ in range(count):
        matrix = rng.normal(size=(candidates, features)).astype(np.float32)
        decisions.append(
            Decision("x", matrix, int(rng.integers(candidates)), float(-np.log(candidates)))
        )
    return decisions


def test_advantages_are_relative_to_the_group_and_zero_when_flat() -> None:
    advantages = group_advantages([0.0, 1.0, 1.0, 0.0])
    assert np.allclose(advantages, [-1, 1, 1, -1], atol=1e-5)
    assert not group_advantages([0.3, 0.3, 0.3]).any()


def test_the_gradient_is_the_objectives_derivative() -> None:
    episodes = [Episode(_decisions(1), 1.3), Episode(_decisions(2, count=2), -0.7)]
    params = np.array([0.1, -0.2, 0.05])
    reference = np.array([0.3, 0.0, -0.1])
    kwargs = {"clip_ratio": 10.0, "kl_coefficient": 0.5, "reference": reference}
    _, gradient, _ = objective_and_gradient(params, episodes, **kwargs)
    numeric = np.zeros_like(params)
    for i in range(len(params)):
        step = np.zeros_like(params)
        step[i] = 1e-6
        upper, _, _ = objective_and_gradient(params + step, episodes, **kwargs)
        lower, _, _ = objective_and_gradient(params - step, episodes, **kwargs)
        numeric[i] = (upper - lower) / 2e-6
    assert np.allclose(gradient, numeric, atol=1e-5)


def test_a_ratio_past_the_clip_in_the_advantages_direction_stops_the_gradient() -> None:
    (decision,) = _decisions(3, count=1)
    params = np.zeros(3)
    now = float(np.log(1 / 7))
    moved = Decision("x", decision.features, decision.choice, now - 1.0)  # ratio e > 1.2
    _, gradient, stats = objective_and_gradient(params, [Episode([moved], 1.0)], clip_ratio=0.2)
    assert not gradient.any() and stats.clipped_fraction == 1.0
    # With a negative advantage the same ratio is not clipped: the update pushes it back.
    _, gradient, stats = objective_and_gradient(params, [Episode([moved], -1.0)], clip_ratio=0.2)
    assert gradient.any() and stats.clipped_fraction == 0.0


def test_adam_ascends() -> None:
    optimizer = Adam(0.1)
    params = np.zeros(2)
    for _ in range(50):
        params = optimizer.step(params, -2 * (params - np.array([1.0, -1.0])))
    assert np.allclose(params, [1.0, -1.0], atol=0.1)


def test_feedback_lines_are_read_back_from_the_conversation() -> None:
    messages = [
        {"role": "user", "content": "Rules...\nGuess 1 of 6:"},
        {"role": "assistant", "content": "[slate]"},
        {
            "role": "user",
            "content": f"{feedback_line('slate', feedback('crane', 'slate'))}\nGuess 2 of 6:",
        },
    ]
    assert read_feedback(messages) == [("slate", feedback("crane", "slate"))]


def test_the_wordle_features_follow_the_feedback(policy: WordlePolicy) -> None:
    history = [("slate", feedback("crane", "slate"))]
    messages = [{"role": "user", "content": feedback_line(*history[0])}]
    features = policy.features(messages)
    names = policy.feature_names
    consistent = features[:, names.index("consistent")]
    crane, slate = policy.words.index("crane"), policy.words.index("slate")
    assert consistent[crane] == 1.0 and consistent[slate] == 0.0
    assert features[slate, names.index("repeated")] == 1.0
    assert features[crane, names.index("violations")] == 0.0
    assert 0 < consistent.sum() < len(policy.words)


def test_a_policy_that_knows_nothing_is_uniform(policy: WordlePolicy) -> None:
    decision = policy.decide(
        policy.initial_params(),
        [{"role": "user", "content": "Guess 1 of 6:"}],
        np.random.default_rng(0),
    )
    assert decision.text.startswith("[") and np.isclose(
        decision.logprob, -np.log(len(policy.words))
    )


def test_grpo_learns_wordle(policy: WordlePolicy) -> None:
    """The update the trainer applies, on episodes played directly: the reward must rise."""
    records = [Record(f"r{i}", {"answer": word}) for i, word in enumerate(words.answers()[:200])]
    curve = [
        step.mean_reward
        for step in train(
            load_environment(), policy, records, steps=12, group_size=8, records_per_step=4,
            learning_rate=0.4,
        )
    ]  # fmt: skip
    assert np.mean(curve[-3:]) > np.mean(curve[:3]) + 0.3, curve


def test_an_environment_without_a_local_policy_is_named() -> None:
    with pytest.raises(NoLocalPolicy, match=r"'gsm8k' has no local policy .* --model-endpoint"):
        policy_for("gsm8k")
