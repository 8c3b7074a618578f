"""`mtrl deploy RUN --to sagemaker`: an open-weights model's way out, a SageMaker real-time endpoint
serving the run's checkpoint with AWS's vLLM container (mtrl/ops/serving_image.py).

1. Find the run's model as for Bedrock (mtrl/ops/deploy.py): its registered best checkpoint. A
   whole model (RFT_MULTITURN_FULL) is served from it; a LoRA adapter is served on the model
   training started from, which the run's checkpoint manifest names (a Hugging Face Hub id).
2. A SageMaker model: the image, the checkpoint mounted at /opt/ml/model (`ModelDataSource`, an
   uncompressed S3 prefix), vLLM's settings as `SM_VLLM_*` variables, the deployment's serving
   role. A whole model needs nothing from outside: its container runs network-isolated; a LoRA
   adapter's base model comes from the Hub, so that one is not.
3. An endpoint config (one GPU instance, the host AMI the image's CUDA needs) and the endpoint;
   wait until it is InService. The served model is called by the endpoint's name.

Each step finds what an earlier try made (by name) and goes on from there; a failed endpoint is
made again. `delete_from_sagemaker` removes the endpoint, its config and the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from botocore.exceptions import ClientError

from domain.bucket import object_exists, run_output_prefix
from domain.checkpoints import MANIFEST_OBJECT, CheckpointManifest
from domain.naming import DEPLOYMENT_TAG, RUN_TAG, StackOutput
from domain.nova_job import is_nova
from domain.vllm import vllm_lora_rank
from mtrl.ops.deploy import (
    DeployRefused,
    TrainedModel,
    Waiting,
    release_name,
    trained_model,
    wait_until,
)
from mtrl.ops.deployment import Deployment
from mtrl.ops.serving_image import HOST_AMI, TAG, serving_image

MODEL_DIR = "/opt/ml/model"  # where SageMaker puts the model data in the container
DEFAULT_INSTANCE_TYPE = "ml.g6e.2xlarge"  # one L40S (48 GB): an 8B model in bfloat16 and its cache
DOWNLOAD_SECONDS = 3600  # the longest ModelDataDownloadTimeoutInSeconds allows: large checkpoints
STARTUP_SECONDS = 1800  # loading the weights, compiling CUDA graphs
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Endpoint:
    model_package_arn: str
    endpoint_name: str
    endpoint_arn: str
    served_model: str
    instance_type: str


@dataclass(frozen=True)
class Serving:
    """How the container serves the run's checkpoint."""

    environment: dict[str, str]
    isolated: bool  # nothing to fetch from outside the model data


def _open_weights(model: str) -> str | None:
    if not is_nova(model):
        return None
    return "a Nova model: deploy it with `mtrl deploy RUN --to bedrock`"


def serving(trained: TrainedModel, base_model: str | None, name: str, run_id: str) -> Serving:
    """The vLLM settings that serve `trained` under `name` (AWS's vLLM container turns each
    `SM_VLLM_X_Y` into `--x-y`)."""
    config = trained.config
    common = {"SM_VLLM_DTYPE": "bfloat16", "SM_VLLM_MAX_MODEL_LEN": str(config.max_length)}
    if config.lora is None:
        return Serving(
            {"SM_VLLM_MODEL": MODEL_DIR, "SM_VLLM_SERVED_MODEL_NAME": name, **common}, True
        )
    if base_model is None or not _HUB_ID.match(base_model):
        source = base_model or "a model its checkpoint manifest does not name"
        raise DeployRefused(
            f"run {run_id} trained a LoRA adapter on {source}: the endpoint serves an adapter on "
            "a base model it loads from the Hugging Face Hub (an id such as Qwen/Qwen3-8B); "
            "train this model with RFT_MULTITURN_FULL to serve it whole"
        )
    rank = vllm_lora_rank(config.lora.rank)
    return Serving(
        {
            "SM_VLLM_MODEL": base_model,
            "SM_VLLM_ENABLE_LORA": "true",
            "SM_VLLM_LORA_MODULES": f"{name}={MODEL_DIR}",
            "SM_VLLM_MAX_LORA_RANK": str(rank),
            **common,
        },
        False,
    )


def _base_model(s3: Any, deployment: Deployment, run_id: str) -> str | None:
    key = f"{run_output_prefix(run_id)}{MANIFEST_OBJECT}"
    if not object_exists(s3, bucket=deployment.data_bucket, key=key):
        return None
    body = s3.get_object(Bucket=deployment.data_bucket, Key=key)["Body"].read()
    return CheckpointManifest.model_validate_json(body).base_model


def _described(call: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """The answer, None for a resource that is not there (SageMaker says so with a
    ValidationException "Could not find …")."""
    try:
        return call()
    except ClientError as error:
        found = error.response["Error"]
        if found["Code"] == "ValidationException" and "Could not find" in found.get("Message", ""):
            return None
        raise


def deploy_to_sagemaker(
    clients: dict[str, Any],
    deployment: Deployment,
    run_id: str,
    *,
    instance_type: str = DEFAULT_INSTANCE_TYPE,
    image: str | None = None,
    waiting: Waiting | None = None,
    on_progress: Callable[[str], None] = lambda line: None,
) -> Endpoint:
    """`clients`: boto3 clients of s3 and sagemaker. `image`: another serving image than AWS's
    vLLM container of this region."""
    s3, sagemaker = clients["s3"], clients["sagemaker"]
    trained = trained_model(s3, deployment, run_id, refuse=_open_weights)
    if trained.checkpoint is None:
        raise DeployRefused(
            f"run {run_id} ran as SageMaker's managed job, which registered its model as "
            f"{trained.model_package}; mtrl deploy serves a checkpoint of ours on SageMaker, not "
            "a managed job's package: deploy it from the SageMaker console or the SDK"
        )
    image = image or serving_image(deployment.region)
    if image is None:
        raise DeployRefused(
            f"AWS publishes its vLLM serving image ({TAG}) in no registry of {deployment.region}: "
            "pass --image with the URI of a vLLM image for SageMaker there"
        )
    name = release_name(deployment.prefix, run_id).lower()
    how = serving(trained, _base_model(s3, deployment, run_id), name, run_id)
    on_progress(f"registered as {trained.model_package}")
    tags = [{"Key": RUN_TAG, "Value": run_id}, {"Key": DEPLOYMENT_TAG, "Value": deployment.prefix}]  # fmt: skip
    if _described(lambda: sagemaker.describe_model(ModelName=name)) is None:
        sagemaker.create_model(
            ModelName=name,
            PrimaryContainer={
                "Image": image,
                "ModelDataSource": {
                    "S3DataSource": {
                        "S3Uri": trained.checkpoint if trained.checkpoint.endswith("/")
                        else f"{trained.checkpoint}/",
                        "S3DataType": "S3Prefix",
                        "CompressionType": "None",
                    }
                },
                "Environment": how.environment,
            },
            ExecutionRoleArn=deployment.output(StackOutput.SERVING_ROLE_ARN),
            EnableNetworkIsolation=how.isolated,
            Tags=tags,
        )  # fmt: skip
    config = _described(lambda: sagemaker.describe_endpoint_config(EndpointConfigName=name))
    if config is None:
        sagemaker.create_endpoint_config(
            EndpointConfigName=name,
            ProductionVariants=[
                {
                    "VariantName": "AllTraffic",
                    "ModelName": name,
                    "InstanceType": instance_type,
                    "InitialInstanceCount": 1,
                    "InferenceAmiVersion": HOST_AMI,
                    "ModelDataDownloadTimeoutInSeconds": DOWNLOAD_SECONDS,
                    "ContainerStartupHealthCheckTimeoutInSeconds": STARTUP_SECONDS,
                }
            ],
            Tags=tags,
        )
    else:
        serving_on = config["ProductionVariants"][0].get("InstanceType")
        if serving_on != instance_type:
            raise DeployRefused(
                f"run {run_id} is deployed on {serving_on} already (endpoint config {name}): "
                f"`mtrl deploy {run_id} --to sagemaker --delete` first to serve it on "
                f"{instance_type}"
            )
    found = _described(lambda: sagemaker.describe_endpoint(EndpointName=name))
    if found is not None and found["EndpointStatus"] == "Deleting":
        raise DeployRefused(
            f"endpoint {name} is being deleted: deploy run {run_id} again once it is gone"
        )
    if found is not None and found["EndpointStatus"] == "Failed":
        # A failed endpoint keeps its name until it is deleted; the next try makes it anew.
        sagemaker.delete_endpoint(EndpointName=name)
        found = None
    if found is None:
        sagemaker.create_endpoint(EndpointName=name, EndpointConfigName=name, Tags=tags)
    ready = wait_until(
        lambda: sagemaker.describe_endpoint(EndpointName=name),
        lambda answer: answer["EndpointStatus"],
        f"endpoint {name}",
        waiting or Waiting(),
        on_progress,
        ready="InService",
        failure_of=lambda answer: answer.get("FailureReason"),
    )
    return Endpoint(trained.model_package, name, ready["EndpointArn"], name, instance_type)


def delete_from_sagemaker(sagemaker: Any, deployment: Deployment, run_id: str) -> list[str]:
    """Delete the run's endpoint, its config and its model; what was deleted (none: nothing was
    there). The registry keeps the model's record."""
    name, deleted = release_name(deployment.prefix, run_id).lower(), []
    for kind, key, describe, delete in (
        ("endpoint", "EndpointName", sagemaker.describe_endpoint, sagemaker.delete_endpoint),
        ("endpoint config", "EndpointConfigName", sagemaker.describe_endpoint_config,
         sagemaker.delete_endpoint_config),
        ("model", "ModelName", sagemaker.describe_model, sagemaker.delete_model),
    ):  # fmt: skip
        if _described(partial(describe, **{key: name})) is not None:
            delete(**{key: name})
            deleted.append(f"{kind} {name}")
    return deleted
