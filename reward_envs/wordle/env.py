"""Wordle as a multi-turn reward environment.

Reward, always in [0, 1], given on the last turn (earlier turns give 0; the episode reward is
the sum):

| outcome | reward |
|---|---|
| solved on guess n (1-6) | 0.5 + 0.5 * (6 - n) / 5: 1.0 on the first guess, 0.5 on the sixth |
| not solved in 6 guesses | 0.3 * best progress, progress = (greens + 0.5 * yellows) / 5 of a guess |
| each invalid turn | -0.05, and it uses up a guess |
| floor | 0.0 |

A turn is invalid when the reply holds no single guess, the guess is not five letters, is not
in the allowed-guess list, or repeats an earlier guess; the model is told why. A win always
outscores a loss unless the win came after invalid turns.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from reward_envs.interface import Environment, Episode, Message, Record, RewardRange, StepResult
from reward_envs.wordle import words
from reward_envs.wordle.rules import (
    FORMAT_HELP,
    GREEN,
    MAX_GUESSES,
    WIN,
    WORD_LENGTH,
    YELLOW,
    ReplyError,
    feedback,
    parse_guess,
)

WIN_BASE = 0.5
SPEED_BONUS = 0.5
PARTIAL_CREDIT = 0.3
INVALID_PENALTY = 0.05

RULES = (
    "Let's play Wordle. I have chosen a secret five-letter English word; you have "
    f"{MAX_GUESSES} guesses to find it. After each guess I answer with one mark per letter: "
    "G = right letter, right place; Y = in the word but in another place; X = not in the word "
    "(or no more copies of it). Guesses must be real five-letter words and may not repeat. "
    f"{FORMAT_HELP}"
)


# What a record shows before the rules (a dataset record needs a prompt: domain/dataset.py).
EXAMPLE_PROMPT = "You are playing Wordle. Think briefly, then guess."

_FEEDBACK_LINE = re.compile(r"^([A-Z]{5}): ([GYX](?: [GYX]){4})$", re.MULTILINE)


def feedback_line(guess: str, marks: str) -> str:
    """How the environment shows one guess's feedback: `CRANE: G X Y X X`."""
    return f"{guess.upper()}: {' '.join(marks)}"


def read_feedback(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """The (guess, marks) pairs shown so far in a conversation, in order (the inverse of
    `feedback_line` over the environment's messages)."""
    return [
        (guess.lower(), marks.replace(" ", ""))
        for message in messages
        if message["role"] == "user"
        for guess, marks in _FEEDBACK_LINE.findall(message["content"])
    ]


def win_reward(guesses_used: int) -> float:
    return WIN_BASE + SPEED_BONUS * (MAX_GUESSES - guesses_used) / (MAX_GUESSES - 1)


def progress(marks: str) -> float:
    return (marks.count(GREEN) + 0.5 * marks.count(YELLOW)) / WORD_LENGTH


@dataclass
class WordleEpisode(Episode):
    secret: str
    guesses: list[str] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)
    turns: int = 0
    invalid: int = 0
    done: bool = False

    def step(self, reply: str) -> StepResult:
        if self.done:
            return StepResult(messages=[], reward=0.0, done=True, info={"error": "episode is over"})
        self.turns += 1
        try:
            guess = self._valid_guess(reply)
        except ReplyError as problem:
            self.invalid += 1
            text = f"Invalid guess: {problem}"
            return self._after_turn(text, error=str(problem))
        marks = feedback(self.secret, guess)
        self.guesses.append(guess)
        self.marks.append(marks)
        text = feedback_line(guess, marks)
        return self._after_turn(text, won=marks == WIN)

    def reward(self, won: bool) -> float:
        if won:
            base = win_reward(self.turns)
        else:
            base = PARTIAL_CREDIT * max((progress(m) for m in self.marks), default=0.0)
        return max(0.0, base - INVALID_PENALTY * self.invalid)

    def _valid_guess(self, reply: str) -> str:
        guess = parse_guess(reply if isinstance(reply, str) else "")
        if len(guess) != WORD_LENGTH:
            shown = guess if len(guess) <= 20 else guess[:17] + "..."
            raise ReplyError(
                f"'{shown}' has {len(guess)} letters, not {WORD_LENGTH}. {FORMAT_HELP}"
            )
        if guess not in words.allowed_set():
            raise ReplyError(f"'{guess}' is not in the word list")
        if guess in self.guesses:
            raise ReplyError(f"'{guess}' was already guessed")
        return guess

    def _after_turn(self, text: str, *, won: bool = False, error: str | None = None) -> StepResult:
        left = MAX_GUESSES - self.turns
        info: dict = {"turn": self.turns, "invalid": self.invalid, "guesses": list(self.guesses)}
        if error:
            info["error"] = error
        if won or left == 0:
            self.done = True
            reward = self.reward(won)
            ending = (
                f"Solved in {self.turns} guess{'' if self.turns == 1 else 'es'}."
                if won
                else f"Out of guesses. The word was {self.secret.upper()}."
            )
            info |= {"won": won, "success": won, "secret": self.secret, "episode_reward": reward}
            return StepResult(
                messages=[{"role": "user", "content": f"{text}\n{ending}"}],
                reward=reward,
                done=True,
                info=info,
            )
        prompt = f"{text}\nGuess {self.turns + 1} of {MAX_GUESSES}:"
        return StepResult(
            messages=[{"role": "user", "content": prompt}], reward=0.0, done=False, info=info
        )


class WordleEnvironment(Environment):
    """Secret from the record's `metadata.answer`, or drawn from the answer list by id and seed;
    a text `metadata.prompt` is shown before the rules."""

    name = "wordle"
    version = "1"
    reward_range = RewardRange(0.0, 1.0)
    max_turns = MAX_GUESSES

    def reset(self, record: Record, *, seed: int = 0) -> tuple[WordleEpisode, list[Message]]:
        secret = self._secret(record, seed)
        # The rules are always stated; a record's text prompt, if any, comes before them.
        preamble = record.metadata.get("prompt")
        text = (
            f"{preamble.strip()}\n\n{RULES}"
            if isinstance(preamble, str) and preamble.strip()
            else RULES
        )
        first: list[Message] = [{"role": "user", "content": f"{text}\nGuess 1 of {MAX_GUESSES}:"}]
        return WordleEpisode(secret=secret), first

    def example_records(self, count: int, *, seed: int = 0) -> list[Record]:
        rng = random.Random(seed)
        return [
            Record(
                id=f"wordle-{seed}-{index}",
                metadata={
                    "prompt": EXAMPLE_PROMPT,
                    "answer": rng.choice(words.answers()),
                    "task": "wordle",
                },
            )  # fmt: skip
            for index in range(count)
        ]

    def example_reply(self, messages: Sequence[Message], rng: random.Random) -> str:
        return f"[{rng.choice(words.allowed())}]"

    @staticmethod
    def _secret(record: Record, seed: int) -> str:
        answer = record.metadata.get("answer")
        if answer is None:
            digest = hashlib.sha256(f"{record.id}\0{seed}".encode()).digest()
            pool = words.answers()
            return pool[int.from_bytes(digest[:8], "big") % len(pool)]
        secret = str(answer).strip().lower()
        if len(secret) != WORD_LENGTH or not secret.isascii() or not secret.isalpha():
            raise ValueError(
                f"record {record.id!r}: metadata.answer must be a five-letter word, got {answer!r}"
            )
        return secret


def load_environment(**kwargs: object) -> WordleEnvironment:
    """The verifiers-style entry point."""
    if kwargs:
        raise TypeError(f"wordle takes no options, got {sorted(kwargs)}")
    return WordleEnvironment()
