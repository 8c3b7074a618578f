"""Rebuilds answers.txt and allowed.txt from SCOWL (Debian package `scowl`).

Run by a maintainer, not at build or test time: `apt-get install scowl` then
`python reward_envs/wordle/data/build_wordlists.py`. The filters are documented in SOURCE.md.
"""

from __future__ import annotations

import re
from pathlib import Path

SCOWL = Path("/usr/share/dict/scowl")
HERE = Path(__file__).resolve().parent
ANSWER_LEVELS = (10, 20, 35)
ALLOWED_LEVELS = (10, 20, 35, 40, 50, 55, 60, 70, 80)
SPELLINGS = ("english", "american", "british", "canadian", "australian")


def read(kinds: tuple[str, ...], levels: tuple[int, ...], pattern: str) -> set[str]:
    words: set[str] = set()
    for kind in kinds:
        for level in levels:
            path = SCOWL / f"{kind}-words.{level}"
            if path.exists():
                text = path.read_text(encoding="utf-8", errors="replace")
                words |= {word for word in text.split() if re.fullmatch(pattern, word)}
    return words


def is_inflection(word: str, stems: set[str]) -> bool:
    """Plurals and past tenses of shorter words ('boats', 'baked') are left out of the answers."""
    if word.endswith("s") and (word[:-1] in stems or (word.endswith("es") and word[:-2] in stems)):
        return True
    return word.endswith("ed") and (word[:-2] in stems or word[:-1] in stems)


def main() -> None:
    stems = read(("english", "american"), ALLOWED_LEVELS[:-1], r"[a-z]{3,5}")
    common = read(("english", "american"), ANSWER_LEVELS, r"[a-z]{5}")
    answers = sorted(word for word in common if not is_inflection(word, stems))
    allowed = sorted(read(SPELLINGS, ALLOWED_LEVELS, r"[a-z]{5}") | set(answers))
    (HERE / "answers.txt").write_text("\n".join(answers) + "\n")
    (HERE / "allowed.txt").write_text("\n".join(allowed) + "\n")
    print(f"{len(answers)} answers, {len(allowed)} allowed guesses")


if __name__ == "__main__":
    main()
