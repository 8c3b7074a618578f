"""`mtrl deploy RUN --to bedrock`: a trained Nova model's way out (an open-weights model's is
`--to sagemaker`, mtrl/ops/endpoint.py, which shares the run's lookup and the waiting here).

1. Find the run's model: Collect registered its best checkpoint in the deployment's SageMaker
   Model Registry group (lambdas/pipeline/model_registry.py); the summary names both. A
   serverless run's managed job registered its model itself, as a package in the same group.
2. Import it into Amazon Bedrock as a custom model, and wait until it is Active: a checkpoint
   by its S3 URI (`CreateCustomModel`'s `modelSourceConfig`, with the deployment's import role);
   a managed job's package by its ARN (`customModelDataSource`, which Bedrock's API reference
   calls the preferred source for SageMaker AI training outputs: Bedrock reads it with its own
   credentials, the caller needing `sagemaker:DescribeModelPackage` and
   `sagemaker:AccessModelPackage` on the package).
3. Deploy it on demand (`CreateCustomModelDeployment`), wait until it is Active; its ARN is what
   to invoke.

The same calls and arguments the Nova Forge SDK makes (amzn-nova-forge 1.4.10,
deployer/forge_deployer.py `create_custom_model`, `deploy_to_bedrock` on demand). Each step
finds what an earlier try made (by name) and goes on from there. `delete_from_bedrock` removes
the deployment and the custom model; the registry keeps its record.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from domain.bucket import SUMMARY_OBJECT, object_exists, run_output_prefix
from domain.naming import DEPLOYMENT_TAG, RUN_TAG, StackOutput, run_prefix
from domain.nova_job import is_nova
from mtrl.ops.deployment import Deployment
from training_configs.schema import TrainingConfig

NAME_LIMIT = 63  # Bedrock's model and deployment names: ([0-9a-zA-Z][_-]?){1,63}
WAIT_SECONDS = 3 * 3600  # a Nova import takes tens of minutes; a deployment, minutes
POLL_SECONDS = 30.0


class DeployRefused(ValueError):
    """The run cannot be deployed (yet); the message says why and what to do."""


class DeployFailed(RuntimeError):
    """Bedrock answered that the import or the deployment failed, or it took too long."""


@dataclass(frozen=True)
class Released:
    model_package_arn: str
    model_arn: str
    deployment_arn: str


@dataclass(frozen=True)
class Waiting:
    """How to wait for Bedrock: the clock and the pause are injectable, the wait bounded."""

    clock: Callable[[], float] = time.monotonic
    pause: Callable[[float], None] = time.sleep
    limit_seconds: float = WAIT_SECONDS
    poll_seconds: float = POLL_SECONDS


def release_name(prefix: str, run_id: str) -> str:
    """The name of what a run's release makes (Bedrock's custom model and deployment,
    SageMaker's model, endpoint config and endpoint): `<prefix>-run-<run_id>` (domain/naming.py)
    in the alphabet both share (letters, digits, single hyphens), at most 63 characters."""
    name = re.sub(r"[^0-9A-Za-z]+", "-", f"{run_prefix(prefix)}{run_id}")[:NAME_LIMIT]
    return name.strip("-")


@dataclass(frozen=True)
class TrainedModel:
    # None: the model is the package alone (a managed job's, in AWS's storage).
    checkpoint: str | None
    model_package: str
    config: TrainingConfig


def trained_model(
    s3: Any, deployment: Deployment, run_id: str, *, refuse: Callable[[str], str | None]
) -> TrainedModel:
    """The run's registered best checkpoint (a serverless run's: the package its job
    registered): refused when the run has not succeeded, when `refuse` has a reason against its
    model, or when it has no model worth releasing."""
    bucket, key = deployment.data_bucket, f"{run_output_prefix(run_id)}{SUMMARY_OBJECT}"
    if not object_exists(s3, bucket=bucket, key=key):
        raise DeployRefused(
            f"run {run_id} has no results (no s3://{bucket}/{key}): only a run that succeeded can "
            "be deployed (`mtrl runs`)"
        )
    summary = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    try:
        config = TrainingConfig.model_validate(summary["config"])
    except (KeyError, ValidationError) as error:
        first = error.errors(include_url=False)[0] if isinstance(error, ValidationError) else None
        where = ".".join(str(part) for part in first["loc"]) if first else "config"
        why = f"{where}: {first['msg']}" if first else "no config"
        raise DeployRefused(
            f"run {run_id}: s3://{bucket}/{key} holds no training config this version of mtrl "
            f"reads ({why}); deploy it with the mtrl it was trained with"
        ) from None
    if (why := refuse(config.model)) is not None:
        raise DeployRefused(f"run {run_id} trained {config.model}, {why}")
    if config.plane == "serverless":
        if not summary.get("model_package"):
            raise DeployRefused(
                f"run {run_id}: nothing to deploy: its managed job registered no model package "
                f"(s3://{bucket}/{key} names none)"
            )
        return TrainedModel(None, summary["model_package"], config)
    best = summary.get("best_checkpoint") or {}
    if not best.get("uri"):
        why = best.get("why") or "the run recorded no checkpoint with a location"
        raise DeployRefused(f"run {run_id}: nothing to deploy: {why}")
    if not summary.get("model_package"):
        raise DeployRefused(
            f"run {run_id}: its model is not in the model registry (s3://{bucket}/{key} names "
            "no model_package); Collect registers every run's model: redeploy the platform"
        )
    return TrainedModel(best["uri"], summary["model_package"], config)


def target_of(s3: Any, deployment: Deployment, run_id: str) -> str:
    """Where a run's model goes unless told: "bedrock" for a Nova model, "sagemaker" for an
    open-weights one — by the run's summary ("bedrock" without one: deploying says why)."""
    bucket, key = deployment.data_bucket, f"{run_output_prefix(run_id)}{SUMMARY_OBJECT}"
    if not object_exists(s3, bucket=bucket, key=key):
        return "bedrock"
    summary = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    model = (summary.get("config") or {}).get("model", "")
    return "bedrock" if is_nova(model) else "sagemaker"


def _not_nova(model: str) -> str | None:
    if is_nova(model):
        return None
    return (
        "not a Nova model: Bedrock imports Nova checkpoints; serve an open-weights model with "
        "`mtrl deploy RUN --to sagemaker`"
    )


def _find(call: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return call()
    except ClientError as error:
        if error.response["Error"]["Code"] == "ResourceNotFoundException":
            return None
        raise


def wait_until(
    describe: Callable[[], dict[str, Any]],
    status_of: Callable[[dict[str, Any]], str],
    what: str,
    waiting: Waiting,
    on_progress: Callable[[str], None],
    *,
    ready: str = "Active",
    failure_of: Callable[[dict[str, Any]], str | None] = lambda answer: answer.get(
        "failureMessage"
    ),
) -> dict[str, Any]:
    """Describe until the status is `ready` (its answer), "Failed" (DeployFailed with the
    reason) or the wait's limit passed (DeployFailed saying how to go on), reporting each."""
    started = waiting.clock()
    while True:
        answer = describe()
        status = status_of(answer)
        on_progress(f"{what}: {status} ({waiting.clock() - started:.0f} s)")
        if status == ready:
            return answer
        if status == "Failed":
            raise DeployFailed(f"{what} failed: {failure_of(answer) or 'no reason given'}")
        if waiting.clock() - started >= waiting.limit_seconds:
            raise DeployFailed(
                f"{what} still {status} after {waiting.limit_seconds:.0f} s: run `mtrl deploy` "
                "again to go on waiting"
            )
        waiting.pause(waiting.poll_seconds)


def deploy_to_bedrock(
    clients: dict[str, Any],
    deployment: Deployment,
    run_id: str,
    *,
    waiting: Waiting = Waiting(),
    on_progress: Callable[[str], None] = lambda line: None,
) -> Released:
    """`clients`: boto3 clients of s3 and bedrock."""
    bedrock = clients["bedrock"]
    trained = trained_model(clients["s3"], deployment, run_id, refuse=_not_nova)
    on_progress(f"registered as {trained.model_package}")
    name = release_name(deployment.prefix, run_id)
    tags = [
        {"key": RUN_TAG, "value": run_id},
        {"key": DEPLOYMENT_TAG, "value": deployment.prefix},
    ]
    model = _find(lambda: bedrock.get_custom_model(modelIdentifier=name))
    if model is None or model.get("modelStatus") == "Failed":
        if model is not None:  # a failed import of an earlier try: its name is taken
            bedrock.delete_custom_model(modelIdentifier=model["modelArn"])
        bedrock.create_custom_model(modelName=name, **_source(trained, deployment), modelTags=tags)
    model = wait_until(
        lambda: bedrock.get_custom_model(modelIdentifier=name),
        lambda answer: answer.get("modelStatus", "Creating"),
        f"custom model {name}",
        waiting,
        on_progress,
    )
    if (
        _find(lambda: bedrock.get_custom_model_deployment(customModelDeploymentIdentifier=name))
        is None
    ):
        bedrock.create_custom_model_deployment(
            modelDeploymentName=name,
            modelArn=model["modelArn"],
            description=f"nova-mtrl run {run_id}",
            tags=tags,
        )
    deployed = wait_until(
        lambda: bedrock.get_custom_model_deployment(customModelDeploymentIdentifier=name),
        lambda answer: answer["status"],
        f"deployment {name}",
        waiting,
        on_progress,
    )
    return Released(trained.model_package, model["modelArn"], deployed["customModelDeploymentArn"])


def _source(trained: TrainedModel, deployment: Deployment) -> dict[str, Any]:
    """Where Bedrock imports the model from: the checkpoint, read with the import role; or the
    package, which Bedrock reads itself."""
    if trained.checkpoint is None:
        package = {"modelPackageArn": trained.model_package}
        return {"customModelDataSource": {"modelPackageArnDataSource": package}}
    return {
        "modelSourceConfig": {"s3DataSource": {"s3Uri": trained.checkpoint}},
        "roleArn": deployment.output(StackOutput.BEDROCK_IMPORT_ROLE_ARN),
    }


def delete_from_bedrock(bedrock: Any, deployment: Deployment, run_id: str) -> list[str]:
    """Delete the run's deployment, then its custom model; what was deleted (none: nothing
    was there). The registry keeps the model's record."""
    name, deleted = release_name(deployment.prefix, run_id), []
    found = _find(lambda: bedrock.get_custom_model_deployment(customModelDeploymentIdentifier=name))
    if found is not None:
        bedrock.delete_custom_model_deployment(
            customModelDeploymentIdentifier=found["customModelDeploymentArn"]
        )
        deleted.append(found["customModelDeploymentArn"])
    model = _find(lambda: bedrock.get_custom_model(modelIdentifier=name))
    if model is not None:
        bedrock.delete_custom_model(modelIdentifier=model["modelArn"])
        deleted.append(model["modelArn"])
    return deleted
