"""The Wordle environment: the reward table, invalid moves, turn limit, records, word lists."""

from __future__ import annotations

import re

import pytest

from reward_envs.interface import Record
from reward_envs.wordle import load_environment, words
from reward_envs.wordle.env import INVALID_PENALTY, WordleEpisode

ENV = load_environment()


def _play(secret: str, replies: list[str]) -> tuple[WordleEpisode, list]:
    episode, _ = ENV.reset(Record(id="t", metadata={"answer": secret}))
    return episode, [episode.step(reply) for reply in replies]


@pytest.mark.parametrize(
    ("replies", "reward"),
    [
        (["[crane]"], 1.0),
        (["[slate]", "[crane]"], 0.9),
        (["[slate]", "[moist]", "[crane]"], 0.8),
        (["[slate]", "[moist]", "[pudgy]", "[whack]", "[fjord]", "[crane]"], 0.5),
        # Two invalid turns before the win: each costs 0.05 and uses up a guess.
        (["hello there", "[zzzzz]", "[crane]"], 0.8 - 2 * INVALID_PENALTY),
    ],
)
def test_win_rewards_speed(replies: list[str], reward: float) -> None:
    _, results = _play("crane", replies)
    assert results[-1].done and results[-1].info["won"] is True
    assert results[-1].reward == pytest.approx(reward)
    assert all(r.reward == 0.0 for r in results[:-1])


def test_loss_gives_partial_credit_for_the_best_guess() -> None:
    # Against "crane": TRACE has R, A, C in... T X, R G, A G, C Y, E G -> 3 greens, 1 yellow.
    _, results = _play("crane", ["[moist]", "[trace]", "[pudgy]", "[whack]", "[fjord]", "[blimp]"])
    last = results[-1]
    assert last.done and last.info["won"] is False and last.info["secret"] == "crane"
    assert last.reward == pytest.approx(0.3 * (3 + 0.5 * 1) / 5)
    assert "The word was CRANE" in last.messages[0]["content"]


def test_reward_never_drops_below_zero() -> None:
    _, results = _play("crane", ["?"] * 6)
    assert results[-1].done and results[-1].reward == 0.0


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("[cran]", "has 4 letters"),
        ("[abcde]", "not in the word list"),
        ("[crane] [slate]", "several guesses"),
        ("no idea", "no guess found"),
        ("x" * 100_000, "has 100000 letters"),
    ],
)
def test_invalid_moves_are_explained_and_use_a_turn(reply: str, reason: str) -> None:
    episode, (result,) = _play("lapel", [reply])
    assert not result.done and reason in result.info["error"]
    assert (
        reason in result.messages[0]["content"] and "Guess 2 of 6" in result.messages[0]["content"]
    )
    assert len(result.messages[0]["content"]) < 300
    assert episode.turns == 1 and episode.invalid == 1


def test_repeating_a_guess_is_invalid() -> None:
    _, results = _play("lapel", ["[crane]", "crane"])
    assert "already guessed" in results[1].info["error"]


def test_feedback_message_shows_the_marks() -> None:
    _, (result,) = _play("lapel", ["[llama]"])
    assert result.messages[0]["content"].startswith("LLAMA: G Y Y X X")


def test_episode_ends_after_six_turns_and_then_stays_over() -> None:
    episode, results = _play("crane", ["[slate]"] + ["??"] * 5)
    assert [r.done for r in results] == [False] * 5 + [True]
    after = episode.step("[crane]")
    assert after.done and after.reward == 0.0 and not after.messages


def test_a_record_prompt_comes_before_the_rules() -> None:
    _, first = ENV.reset(
        Record(id="x", metadata={"prompt": "You are a careful player.", "answer": "crane"})
    )
    text = first[0]["content"]
    assert text.startswith("You are a careful player.\n\nLet's play Wordle.") and "[crane]" in text


def test_secret_comes_from_the_record_or_id_and_seed() -> None:
    episode, first = ENV.reset(Record(id="x", metadata={"answer": " Crane "}))
    assert (
        episode.secret == "crane"
        and "Guess 1 of 6" in first[0]["content"]
        and "[crane]" in first[0]["content"]
    )
    drawn = {ENV.reset(Record(id=f"r{i}"), seed=7)[0].secret for i in range(50)}
    assert drawn <= set(words.answers()) and len(drawn) > 30
    assert (
        ENV.reset(Record(id="r1"), seed=7)[0].secret == ENV.reset(Record(id="r1"), seed=7)[0].secret
    )


@pytest.mark.parametrize("answer", ["cat", "cr4ne", "", "crânes"])
def test_bad_answers_in_a_record_are_rejected_with_the_record_id(answer: str) -> None:
    with pytest.raises(
        ValueError, match=r"record 'bad-1': metadata.answer must be a five-letter word"
    ):
        ENV.reset(Record(id="bad-1", metadata={"answer": answer}))


def test_shipped_word_lists_are_clean() -> None:
    answers, allowed = words.answers(), words.allowed()
    for word_list in (answers, allowed):
        assert list(word_list) == sorted(set(word_list))
        assert all(re.fullmatch(r"[a-z]{5}", word) for word in word_list)
    assert set(answers) <= set(allowed)
    assert 2000 <= len(answers) <= 2500 and len(allowed) > 10_000


def test_word_lists_state_source_and_licence() -> None:
    from importlib import resources

    data = resources.files("reward_envs.wordle").joinpath("data")
    source = data.joinpath("SOURCE.md").read_text()
    assert "SCOWL" in source and "Permission to use, copy, modify" in source
    assert "Kevin Atkinson" in data.joinpath("SCOWL-COPYRIGHT").read_text()
