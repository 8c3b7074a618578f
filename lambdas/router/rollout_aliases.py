"""A run's alias of the rollout forwarder (lambdas/router/rollout_forwarder.py): its
`rollout_request_arn`, created with the run's queues and deleted with them.

The alias is named after the run, so the forwarder knows the run from the ARN it was invoked
by. Both directions are idempotent: an alias that exists is reused (one execution per run makes
the pipeline the only writer of a run's alias), one that is gone is not an error. It points at
`$LATEST`, as the router's other functions serve every run with their latest code.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

# Lambda's alias names (botocore's lambda model, shape Alias): 1-128 of these, not all digits.
_ALIAS = re.compile(r"(?!^[0-9]+$)[a-zA-Z0-9_-]{1,128}")


def alias_name(run_id: str) -> str:
    if not _ALIAS.fullmatch(run_id):
        raise ValueError(
            f"run id {run_id!r} cannot name a Lambda alias (1-128 letters, digits, - and _)"
        )
    return run_id


def run_of(invoked_function_arn: str) -> str | None:
    """The run an invocation came through (`arn:aws:lambda:<region>:<account>:function:<name>:
    <alias>`), or None for the bare function or `$LATEST`."""
    parts = invoked_function_arn.split(":")
    if len(parts) != 8 or not _ALIAS.fullmatch(parts[7]):
        return None
    return parts[7]


def create_rollout_alias(lambda_client: Any, *, function: str, run_id: str) -> str:
    """The run's alias of the forwarder (created once); returns its ARN."""
    existing = _alias_arn(lambda_client, function=function, run_id=run_id)
    if existing is not None:
        return existing
    return lambda_client.create_alias(
        FunctionName=function,
        Name=alias_name(run_id),
        FunctionVersion="$LATEST",
        Description=f"nova-mtrl run {run_id}: its rollout_request_arn",
    )["AliasArn"]


def delete_rollout_alias(lambda_client: Any, *, function: str, run_id: str) -> None:
    """Delete the run's alias, if it is there."""
    with contextlib.suppress(lambda_client.exceptions.ResourceNotFoundException):
        lambda_client.delete_alias(FunctionName=function, Name=alias_name(run_id))


def rollout_alias_exists(lambda_client: Any, *, function: str, run_id: str) -> bool:
    return _alias_arn(lambda_client, function=function, run_id=run_id) is not None


def _alias_arn(lambda_client: Any, *, function: str, run_id: str) -> str | None:
    try:
        return lambda_client.get_alias(FunctionName=function, Name=alias_name(run_id))["AliasArn"]
    except lambda_client.exceptions.ResourceNotFoundException:
        return None
