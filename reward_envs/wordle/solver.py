"""The Wordle solver oracle: greedy information maximisation over the allowed guesses.

It plays from feedback alone (it never sees the secret): it keeps the answers consistent with
the feedback so far and guesses the allowed word whose feedback splits them most evenly
(highest entropy), with a bonus for guesses that could win at once. Feedback for every
(guess, answer) pair is computed once, vectorised, as base-3 codes, so each decision is a
histogram; decisions are memoised by history, which makes playing every answer cheap.
Its win rate and mean guesses over the answer list are the reward ceiling to compare with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from reward_envs.wordle import words
from reward_envs.wordle.rules import GREEN, MAX_GUESSES, WIN, WORD_LENGTH, YELLOW, feedback

PATTERNS = 3**WORD_LENGTH
_CODE_OF_MARK = {"X": 0, YELLOW: 1, GREEN: 2}


def encode(marks: str) -> int:
    """A feedback string as its base-3 code (G=2, Y=1, X=0, first letter most significant)."""
    code = 0
    for mark in marks:
        code = code * 3 + _CODE_OF_MARK[mark]
    return code


def _letters(word_list: Sequence[str]) -> np.ndarray:
    return np.frombuffer("".join(word_list).encode("ascii"), dtype=np.uint8).reshape(
        -1, WORD_LENGTH
    )


def pattern_matrix(guesses: Sequence[str], answers: Sequence[str], chunk: int = 256) -> np.ndarray:
    """Feedback codes, shape (len(guesses), len(answers)), the same as `feedback` pair by pair."""
    guess_letters, answer_letters = _letters(guesses), _letters(answers)
    result = np.empty((len(guesses), len(answers)), dtype=np.uint8)
    powers = 3 ** np.arange(WORD_LENGTH - 1, -1, -1)
    for start in range(0, len(guesses), chunk):
        g = guess_letters[start : start + chunk]
        green = g[:, None, :] == answer_letters[None, :, :]
        codes = np.zeros(green.shape[:2], dtype=np.int32)
        for i in range(WORD_LENGTH):
            letter = g[:, i][:, None]
            # Copies of this letter in the secret that are not already matched green ...
            available = np.zeros(green.shape[:2], dtype=np.int8)
            for k in range(WORD_LENGTH):
                available += (answer_letters[None, :, k] == letter) & ~green[:, :, k]
            # ... minus those taken by the same letter earlier in the guess (left to right).
            taken = np.zeros(green.shape[:2], dtype=np.int8)
            for j in range(i):
                taken += (g[:, j][:, None] == letter) & ~green[:, :, j]
            yellow = ~green[:, :, i] & (taken < available)
            codes += powers[i] * np.where(green[:, :, i], 2, yellow.astype(np.int32))
        result[start : start + chunk] = codes
    return result


@dataclass(frozen=True)
class GameResult:
    secret: str
    guesses: tuple[str, ...]

    @property
    def won(self) -> bool:
        return bool(self.guesses) and self.guesses[-1] == self.secret


class Solver:
    """Chooses guesses from feedback alone. Deterministic; safe to share between games."""

    def __init__(self, answers: Sequence[str] | None = None, allowed: Sequence[str] | None = None):
        self.answers = tuple(answers or words.answers())
        self.allowed = tuple(allowed or words.allowed())
        self._answer_index = {word: i for i, word in enumerate(self.answers)}
        self._guess_index = {word: i for i, word in enumerate(self.allowed)}
        self._is_answer = np.array([word in self._answer_index for word in self.allowed])
        self._matrix = pattern_matrix(self.allowed, self.answers)
        self._decisions: dict[tuple[tuple[int, int], ...], int] = {}

    def candidates(self, history: Sequence[tuple[str, str]]) -> list[str]:
        """The answers consistent with every (guess, feedback) so far."""
        return [self.answers[i] for i in self._candidate_indices(history)]

    def next_guess(self, history: Sequence[tuple[str, str]]) -> str:
        """The guess to play after `history`, a list of (guess, feedback string) pairs."""
        key = tuple((self._row(guess), encode(marks)) for guess, marks in history)
        if key not in self._decisions:
            self._decisions[key] = self._choose(self._candidate_indices(history))
        return self.allowed[self._decisions[key]]

    def play(self, secret: str, max_guesses: int = MAX_GUESSES) -> GameResult:
        history: list[tuple[str, str]] = []
        while len(history) < max_guesses:
            guess = self.next_guess(history)
            history.append((guess, feedback(secret, guess)))
            if history[-1][1] == WIN:
                break
        return GameResult(secret=secret, guesses=tuple(guess for guess, _ in history))

    def _candidate_indices(self, history: Sequence[tuple[str, str]]) -> np.ndarray:
        alive = np.ones(len(self.answers), dtype=bool)
        for guess, marks in history:
            alive &= self._matrix[self._row(guess)] == encode(marks)
        indices = np.flatnonzero(alive)
        if not len(indices):
            raise ValueError("no answer is consistent with this feedback")
        return indices

    def _row(self, guess: str) -> int:
        row = self._guess_index.get(guess.lower())
        if row is None:
            raise ValueError(f"{guess!r} is not an allowed guess")
        return row

    def _choose(self, candidates: np.ndarray) -> int:
        if len(candidates) <= 2:
            return self._guess_index[self.answers[candidates[0]]]
        columns = self._matrix[:, candidates].astype(np.int32)
        offsets = (np.arange(len(self.allowed), dtype=np.int32) * PATTERNS)[:, None]
        counts = np.bincount((columns + offsets).ravel(), minlength=len(self.allowed) * PATTERNS)
        probabilities = counts.reshape(len(self.allowed), PATTERNS) / len(candidates)
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -np.nansum(
                np.where(probabilities > 0, probabilities * np.log2(probabilities), 0.0), axis=1
            )
        candidate_mask = np.zeros(len(self.allowed), dtype=bool)
        candidate_mask[[self._guess_index[self.answers[i]] for i in candidates]] = True
        # A guess that may be the answer wins outright with probability 1/len(candidates).
        score = entropy + candidate_mask / len(candidates)
        return int(np.argmax(score))


@cache
def default_solver() -> Solver:
    return Solver()
