"""`mtrl teardown`: ask the deployment's reaper to tear a run down now, or to release idle GPU
nodes. The reaper already holds the rights and the code to reach every plane (ECS, HyperPod,
the Kubernetes API), so the CLI needs only to invoke it."""

from __future__ import annotations

import json
from typing import Any

from domain.naming import StackOutput
from domain.run_state import Reaped, ReapRequest, ReapResult
from mtrl.ops.deployment import Deployment


class TeardownFailed(RuntimeError):
    """The reaper could not (yet) do what was asked; the message says what happened."""


def invoke_reaper(lambda_client: Any, deployment: Deployment, request: ReapRequest) -> ReapResult:
    response = lambda_client.invoke(
        FunctionName=deployment.output(StackOutput.REAPER_FUNCTION_NAME),
        InvocationType="RequestResponse",
        Payload=request.model_dump_json(exclude_defaults=True).encode(),
    )
    payload = json.loads(response["Payload"].read() or b"{}")
    if response.get("FunctionError"):
        raise TeardownFailed(
            f"the reaper failed: {payload.get('errorType', 'Error')}: {payload.get('errorMessage', '')}"
        )
    return ReapResult.model_validate(payload)


def teardown_run(lambda_client: Any, deployment: Deployment, run_id: str) -> Reaped:
    """Stop the run (if running) and tear it down; idempotent."""
    result = invoke_reaper(lambda_client, deployment, ReapRequest(run_id=run_id))
    if result.unknown:
        raise TeardownFailed(
            f"no run {run_id} in deployment {deployment.prefix}: `mtrl runs` lists them"
        )
    if result.retry:
        raise TeardownFailed(
            f"run {run_id}: compute not released yet ({result.retry[0].error}); run "
            f"`mtrl teardown {run_id}` again, or let the reaper retry within 15 minutes"
        )
    (entry,) = result.reaped
    return entry


def release_idle_nodes(lambda_client: Any, deployment: Deployment) -> bool:
    return bool(
        invoke_reaper(lambda_client, deployment, ReapRequest(release_idle=True)).released_idle
    )
