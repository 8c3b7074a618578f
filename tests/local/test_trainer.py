"""The local trainer's Wordle policy, and GRPO learning Wordle with it."""

from __future__ import annotations

import numpy as np
import pytest

from local_trainer.direct import train
from local_trainer.policy import (
    NoLocalPolicy,
    SupportDeskPolicy,
    WordlePolicy,
    policy_for,
)
from reward_envs.interface import Record
from reward_envs.support_desk import SupportDeskEnvironment
from reward_envs.wordle import WordleEnvironment, feedback, load_environment, words
from reward_envs.wordle.env import feedback_line, read_feedback


@pytest.fixture(scope="module")
def policy() -> WordlePolicy:
    return WordlePolicy()


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
    class Arithmetic(WordleEnvironment):
        name = "gsm8k"

    with pytest.raises(NoLocalPolicy) as missing:
        policy_for(Arithmetic())
    # The exact install and command that train it here, then the other way.
    assert "'gsm8k' has no local policy" in str(missing.value)
    assert "`pip install -e '.[llm]'`, then `mtrl local FILE --trainer llm --model tiny`" in str(
        missing.value
    )
    assert str(missing.value).endswith("`mtrl local FILE --model-endpoint URL`")


def test_the_local_policy_is_chosen_by_the_environments_name() -> None:
    class SameRewardWordle(WordleEnvironment):
        def aggregate(self, turn_rewards):
            return 0.5

    assert isinstance(policy_for(SameRewardWordle()), WordlePolicy)
    assert isinstance(policy_for(SupportDeskEnvironment()), SupportDeskPolicy)
