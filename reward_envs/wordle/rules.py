"""Wordle's rules: two-pass feedback and the reply format the model must use."""

from __future__ import annotations

import re
from collections import Counter

WORD_LENGTH = 5
MAX_GUESSES = 6
GREEN, YELLOW, GREY = "G", "Y", "X"
WIN = GREEN * WORD_LENGTH

_WORD = re.compile(r"[a-z]{5}")
_BRACKETED = re.compile(r"\[\s*([A-Za-z]+)\s*\]")
_THINKING = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL | re.IGNORECASE)
_LONE_WORD = re.compile(r"[^A-Za-z]*([A-Za-z]+)[^A-Za-z]*")

FORMAT_HELP = "Answer with your guess in square brackets, for example [crane]."


def feedback(secret: str, guess: str) -> str:
    """Five characters: G right letter right place, Y in the word elsewhere, X not there.

    Two passes, as Wordle does: greens first, then yellows from the letters of the secret
    that are left, left to right, so a letter is never marked more often than it occurs.
    Case-insensitive; both words must be five letters a-z.
    """
    secret, guess = secret.lower(), guess.lower()
    for name, word in (("secret", secret), ("guess", guess)):
        if not _WORD.fullmatch(word):
            raise ValueError(f"{name} must be {WORD_LENGTH} letters a-z, got {word!r}")
    marks = [GREY] * WORD_LENGTH
    unmatched: Counter[str] = Counter()
    for position, (wanted, given) in enumerate(zip(secret, guess, strict=True)):
        if wanted == given:
            marks[position] = GREEN
        else:
            unmatched[wanted] += 1
    for position, given in enumerate(guess):
        if marks[position] != GREEN and unmatched[given] > 0:
            marks[position] = YELLOW
            unmatched[given] -= 1
    return "".join(marks)


class ReplyError(ValueError):
    """A reply that holds no single guess; the message is shown to the model."""


def parse_guess(reply: str) -> str:
    """The guess in a reply, lower case, or ReplyError saying what is wrong.

    Lenient but unambiguous: reasoning inside <think>...</think> is ignored; the guess is the
    one word in square brackets (the same word repeated is fine, two different ones are not);
    a reply that is nothing but one word (punctuation aside) is taken as that word. The length
    is checked by the environment, not here, so the model hears "wrong length" rather than
    "cannot read".
    """
    text = _THINKING.sub(" ", reply or "")
    bracketed = {word.lower() for word in _BRACKETED.findall(text)}
    if len(bracketed) > 1:
        raise ReplyError(
            f"found several guesses {sorted(bracketed)}; give exactly one. {FORMAT_HELP}"
        )
    if bracketed:
        return bracketed.pop()
    lone = _LONE_WORD.fullmatch(text)
    if lone:
        return lone.group(1).lower()
    raise ReplyError(f"no guess found. {FORMAT_HELP}")
