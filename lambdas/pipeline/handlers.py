"""The pipeline's Lambda entry points, one per step of the step table (lambdas/pipeline/steps.py):
`handlers.<step>` hands its event to that step, composed once per container from the function's
environment (lambdas/pipeline/composition.py). Lambda's runtime finds a handler by its name
in this module, so a step declared in the table has its entry here without another line."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lambdas.clients import lambda_entries
from lambdas.pipeline.composition import compose
from lambdas.pipeline.steps import STEP

_entry = lambda_entries(compose, os.environ)
_ENTRIES = {name: _entry(name) for name in STEP}


def __getattr__(name: str) -> Callable[[dict[str, Any], Any], Any]:
    if name in _ENTRIES:
        return _ENTRIES[name]
    raise AttributeError(f"{__name__} has no step {name!r} (lambdas/pipeline/steps.py lists them)")
