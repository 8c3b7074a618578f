"""What a run's metrics object says (`metrics.jsonl`, a line per training step: our trainer's,
or the router's windows of a Nova run), read the one way every reader reads it. Light on
purpose: the reward workers' image carries it (domain/trajectories.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def metrics_lines(text: str) -> list[dict[str, Any]]:
    """The steps' lines of a metrics object's text, in order; what is not a step's line (the
    first line of a tail read mid-line) is left out."""
    lines = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            lines.append(record)
    return lines


def number(value: Any) -> float | None:
    """A metrics line's figure as a float: a JSON number (not a bool), else None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# A step's first failed rollout's error, as the rollout reported it, in its metrics line: what
# a run that failed says first (the whole text is in the trajectories and the workers' logs).
FIRST_ERROR = "first_error"
ERROR_CHARACTERS = 300


def first_error(errors: Iterable[str | None]) -> str | None:
    """The first of `errors` that says something, cut to ERROR_CHARACTERS."""
    for error in errors:
        if error:
            return error if len(error) <= ERROR_CHARACTERS else error[: ERROR_CHARACTERS - 1] + "…"
    return None


def first_step_error(lines: Iterable[Mapping[str, Any]]) -> tuple[int, str] | None:
    """(step, error) of the first of a run's metrics lines that names a failed rollout's error."""
    for line in lines:
        error = line.get(FIRST_ERROR)
        if isinstance(error, str) and error and isinstance(line.get("step"), int):
            return line["step"], error
    return None
