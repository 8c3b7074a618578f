"""The solver oracle: its feedback matrix, its play from feedback alone, and its results."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest

from reward_envs.wordle import feedback, words
from reward_envs.wordle.rules import WIN
from reward_envs.wordle.solver import PATTERNS, Solver, default_solver, encode, pattern_matrix


def test_encode_is_base_three() -> None:
    assert encode("XXXXX") == 0 and encode("GGGGG") == PATTERNS - 1 and encode("XXXYG") == 1 * 3 + 2


def test_pattern_matrix_equals_feedback_pair_by_pair() -> None:
    rng = random.Random(5)
    guesses = rng.sample(words.allowed(), 300) + ["geese", "eerie", "llama", "ooooo", "speed"]
    answers = rng.sample(words.answers(), 200) + ["those", "abbey", "lapel", "robot", "apple"]
    matrix = pattern_matrix(guesses, answers, chunk=64)
    expected = np.array(
        [[encode(feedback(a, g)) for a in answers] for g in guesses], dtype=np.uint8
    )
    assert np.array_equal(matrix, expected)


@pytest.fixture(scope="module")
def solver() -> Solver:
    return default_solver()


def test_solver_wins_a_sample_of_answers_from_feedback_alone(solver: Solver) -> None:
    sample = random.Random(11).sample(words.answers(), 150)
    results = [solver.play(secret) for secret in sample]
    assert all(result.won for result in results)
    assert all(len(result.guesses) <= 6 for result in results)
    # The whole list measures 3.44 (bench/envs.py); a sample must stay clearly under 4.
    assert statistics.mean(len(result.guesses) for result in results) < 3.8


def test_every_guess_after_the_first_keeps_the_secret_possible(solver: Solver) -> None:
    secret = "lapel"
    history: list[tuple[str, str]] = []
    while not history or history[-1][1] != WIN:
        assert secret in solver.candidates(history)
        guess = solver.next_guess(history)
        history.append((guess, feedback(secret, guess)))
    assert history[-1][0] == secret


def test_contradictory_feedback_is_refused(solver: Solver) -> None:
    with pytest.raises(ValueError, match="no answer is consistent"):
        solver.next_guess([("crane", "GGGGX"), ("crane", "XXXXX")])
    with pytest.raises(ValueError, match="not an allowed guess"):
        solver.next_guess([("qqqqq", "XXXXX")])
