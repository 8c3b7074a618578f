"""A run's aliases of the rollout forwarder (lambdas/router/rollout_forwarder.py): its
`rollout_request_arn`, created with the run's queues and deleted with them.

The training job's alias is named after the run, so the forwarder knows the run from the ARN
it was invoked by; each held-out evaluation gets its own, `<run id>_<stage>` (run ids have no
`_`, domain/runs.py), so the forwarder also knows which phase of the run a rollout is asked for
in, and a training curve never mixes with an evaluation. Both directions are idempotent: an alias that exists is reused (one execution per run makes
the pipeline the only writer of a run's alias), one that is gone is not an error. It points at
`$LATEST`, as the router's other functions serve every run with their latest code.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

from domain.episodes import EvaluationStage

# Lambda's alias names (botocore's lambda model, shape Alias): 1-128 of these, not all digits.
_ALIAS = re.compile(r"(?!^[0-9]+$)[a-zA-Z0-9_-]{1,128}")
STAGE_MARK = "_"
# A run's phases, each with its alias: training (None), then each evaluation.
PHASES: tuple[EvaluationStage | None, ...] = (None, *EvaluationStage)


@dataclass(frozen=True)
class Invoked:
    """Whom an invocation of the forwarder is for: a run, and the evaluation (None: training)."""

    run_id: str
    stage: EvaluationStage | None = None


def alias_name(run_id: str, stage: EvaluationStage | None = None) -> str:
    name = run_id if stage is None else f"{run_id}{STAGE_MARK}{stage}"
    if STAGE_MARK in run_id or not _ALIAS.fullmatch(name):
        raise ValueError(
            f"run id {run_id!r} cannot name a Lambda alias (letters, digits and -, 128 at most "
            f"with {STAGE_MARK}<evaluation>)"
        )
    return name


def evaluation_alias_arn(rollout_request_arn: str, stage: EvaluationStage) -> str:
    """The ARN of a run's evaluation alias, from its training alias's."""
    head, _, run_id = rollout_request_arn.rpartition(":")
    return f"{head}:{alias_name(run_id, stage)}"


def run_of(invoked_function_arn: str) -> Invoked | None:
    """The run (and evaluation) an invocation came through (`arn:aws:lambda:<region>:<account>:
    function:<name>:<alias>`), or None for the bare function, `$LATEST` or an alias that is not a
    run's."""
    parts = invoked_function_arn.split(":")
    if len(parts) != 8 or not _ALIAS.fullmatch(parts[7]):
        return None
    run_id, marked, stage = parts[7].partition(STAGE_MARK)
    if not marked:
        return Invoked(run_id)
    if stage not in set(EvaluationStage):
        return None
    return Invoked(run_id, EvaluationStage(stage))


def create_rollout_aliases(lambda_client: Any, *, function: str, run_id: str) -> str:
    """The run's aliases of the forwarder, one per phase (each created once); returns the
    training alias's ARN."""
    arns = []
    for stage in PHASES:
        existing = _alias_arn(lambda_client, function=function, name=alias_name(run_id, stage))
        arns.append(
            existing
            or lambda_client.create_alias(
                FunctionName=function,
                Name=alias_name(run_id, stage),
                FunctionVersion="$LATEST",
                Description=f"nova-mtrl run {run_id}: its rollout_request_arn"
                + (f" for its {stage} evaluation" if stage else ""),
            )["AliasArn"]
        )
    return arns[0]


def delete_rollout_aliases(lambda_client: Any, *, function: str, run_id: str) -> None:
    """Delete the run's aliases, those that are there."""
    for stage in PHASES:
        with contextlib.suppress(lambda_client.exceptions.ResourceNotFoundException):
            lambda_client.delete_alias(FunctionName=function, Name=alias_name(run_id, stage))


def rollout_aliases_left(lambda_client: Any, *, function: str, run_id: str) -> int:
    """How many of the run's aliases exist."""
    return sum(
        _alias_arn(lambda_client, function=function, name=alias_name(run_id, stage)) is not None
        for stage in PHASES
    )


def _alias_arn(lambda_client: Any, *, function: str, name: str) -> str | None:
    try:
        return lambda_client.get_alias(FunctionName=function, Name=name)["AliasArn"]
    except lambda_client.exceptions.ResourceNotFoundException:
        return None
