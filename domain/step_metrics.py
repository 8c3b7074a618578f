"""What a run's metrics object says (`metrics.jsonl`, a line per training step: our trainer's,
or the router's windows of a Nova run), read the one way every reader reads it. Light on
purpose: the reward workers' image carries it (domain/trajectories.py)."""

from __future__ import annotations

import json
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
