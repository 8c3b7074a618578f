"""The data bucket's layout: where datasets, configs and a run's outputs go (one home for the
prefixes the stacks grant on, the pipeline writes to and the CLI uploads to)."""

from __future__ import annotations

TRAINING_DATA_PREFIX = "training-data/"  # a .jsonl uploaded here starts a run
CONFIGS_PREFIX = "configs/"  # training configs named by a dataset's metadata
RUNS_PREFIX = "runs/"  # runs/<run id>/: checkpoints, metrics, summary


def run_output_prefix(run_id: str) -> str:
    return f"{RUNS_PREFIX}{run_id}/"
