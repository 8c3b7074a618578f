"""Wordle feedback (two-pass, duplicate letters) and reply parsing."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reward_envs.wordle import feedback
from reward_envs.wordle.rules import ReplyError, parse_guess


@pytest.mark.parametrize(
    ("secret", "guess", "expected"),
    [
        ("crane", "crane", "GGGGG"),
        ("crane", "moist", "XXXXX"),
        # One E in the secret: only the first unmatched E of the guess is yellow.
        ("abbey", "keeps", "XYXXX"),
        # L green at 0; the second L takes the secret's other L; the second A finds none left.
        ("lapel", "llama", "GYYXX"),
        # Greens first: the final E is green, so the earlier Es get nothing.
        ("those", "geese", "XXXGG"),
        # Two Es in the secret, three in the guess: the first two are yellow.
        ("speed", "eerie", "YYXXX"),
        ("abide", "speed", "XXYXY"),
        # The green O is matched first; the other O then takes the secret's remaining O.
        ("robot", "floor", "XXYGY"),
        ("robot", "ooooo", "XGXGX"),
        ("apple", "paper", "YYGYX"),
        ("CRANE", "crAnE", "GGGGG"),
    ],
)
def test_feedback_by_hand(secret: str, guess: str, expected: str) -> None:
    assert feedback(secret, guess) == expected


@pytest.mark.parametrize(
    ("secret", "guess"), [("cran", "crane"), ("crane", "cr4ne"), ("crane", ""), ("craned", "crane")]
)
def test_feedback_rejects_non_words(secret: str, guess: str) -> None:
    with pytest.raises(ValueError):
        feedback(secret, guess)


def _reference(secret: str, guess: str) -> str:
    """Counting formulation: per letter, yellows = min(copies in secret, copies in guess) - greens,
    handed out left to right among the guess's non-green copies."""
    greens = [s == g for s, g in zip(secret, guess, strict=True)]
    marks = ["G" if green else "X" for green in greens]
    for letter in set(guess):
        green_count = sum(1 for s, g in zip(secret, guess, strict=True) if s == g == letter)
        budget = min(Counter(secret)[letter], Counter(guess)[letter]) - green_count
        for position, g in enumerate(guess):
            if g == letter and not greens[position] and budget > 0:
                marks[position] = "Y"
                budget -= 1
    return "".join(marks)


# A three-letter alphabet forces repeated letters in almost every pair.
_word = st.text(alphabet="abe", min_size=5, max_size=5)


@given(_word, _word)
def test_feedback_agrees_with_the_counting_formulation(secret: str, guess: str) -> None:
    assert feedback(secret, guess) == _reference(secret, guess)


@given(_word, _word)
def test_marks_never_exceed_the_letters_of_the_secret(secret: str, guess: str) -> None:
    marks = feedback(secret, guess)
    for letter in set(guess):
        marked = sum(1 for g, m in zip(guess, marks, strict=True) if g == letter and m != "X")
        assert marked == min(Counter(secret)[letter], Counter(guess)[letter])


@pytest.mark.parametrize(
    ("reply", "guess"),
    [
        ("[crane]", "crane"),
        ("[CRANE]", "crane"),
        ("I think the best guess is [ slate ] here.", "slate"),
        ("<think>maybe [adieu]? no.</think> Final answer: [crane]", "crane"),
        ("[crane] -- yes, [crane]", "crane"),
        ("crane", "crane"),
        ("  Crane.  ", "crane"),
        ("[cranes]", "cranes"),  # parsed; the environment reports the wrong length
    ],
)
def test_parse_guess_is_lenient(reply: str, guess: str) -> None:
    assert parse_guess(reply) == guess


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("[crane] or [slate]", "several guesses"),
        ("my guess is crane", "no guess found"),
        ("", "no guess found"),
        ("<think>[crane]</think>", "no guess found"),
        ("12345", "no guess found"),
    ],
)
def test_parse_guess_is_unambiguous(reply: str, reason: str) -> None:
    with pytest.raises(ReplyError, match=reason):
        parse_guess(reply)
