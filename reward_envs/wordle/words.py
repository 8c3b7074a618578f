"""The shipped word lists (see data/SOURCE.md for their source and licence)."""

from __future__ import annotations

from functools import cache
from importlib import resources


def _read(name: str) -> tuple[str, ...]:
    text = (
        resources.files("reward_envs.wordle")
        .joinpath("data")
        .joinpath(name)
        .read_text(encoding="utf-8")
    )
    return tuple(word for word in text.split() if word)


@cache
def answers() -> tuple[str, ...]:
    """Secret words, sorted."""
    return _read("answers.txt")


@cache
def allowed() -> tuple[str, ...]:
    """Every accepted guess (a superset of the answers), sorted."""
    return _read("allowed.txt")


@cache
def allowed_set() -> frozenset[str]:
    return frozenset(allowed())
