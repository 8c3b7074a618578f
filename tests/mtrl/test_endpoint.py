"""`mtrl deploy RUN --to sagemaker`: an open-weights run's registered checkpoint served by a
SageMaker real-time endpoint with AWS's vLLM container — against moto's S3 and a SageMaker
hosting fake whose requests and answers botocore checks against SageMaker's model
(tests/service_fakes.py). The container's settings are those AWS's vLLM DLC documents
(aws/deep-learning-containers, docs/vllm/deployment/sagemaker.md, configuration.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from domain.checkpoints import CheckpointManifest, SavedCheckpoint
from mtrl.cli import app
from mtrl.commands import deploy
from mtrl.ops.deploy import DeployFailed, DeployRefused, Waiting
from mtrl.ops.deployment import Deployment
from mtrl.ops.endpoint import delete_from_sagemaker, deploy_to_sagemaker
from tests.service_fakes import ACCOUNT, FakeSageMakerHosting
from training_configs import load_training_config
from training_configs.schema import TrainingConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUCKET, RUN = "nova-mtrl-data", "letters-0a1b2c3d4e"
NAME = f"nova-mtrl-run-{RUN}"
FINAL = f"runs/{RUN}/checkpoints/final/"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/nova-mtrl-serving"
PACKAGE = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:model-package/nova-mtrl-models/4"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:server-sagemaker-cuda-v2.6"


def _deployment(region: str = "us-east-1") -> Deployment:
    return Deployment(
        prefix="nova-mtrl", region=region, account=ACCOUNT,
        outputs={"DataBucketName": BUCKET, "ServingRoleArn": ROLE},
    )  # fmt: skip


def _config(recipe: str = "rft_multiturn_lora", **changes: Any) -> dict[str, Any]:
    base = load_training_config(recipe).model_dump(mode="json")
    return TrainingConfig.model_validate({**base, "model": "qwen3-8b", **changes}).model_dump(
        mode="json"
    )


def _publish(s3: Any, config: dict[str, Any], base_model: str | None = "Qwen/Qwen3-8B") -> None:
    """What a run of llm_trainer leaves: its summary (Collect), manifest and final checkpoint."""
    best = {"name": "final", "uri": f"s3://{BUCKET}/{FINAL}", "why": "the last checkpoint"}
    summary = {"run_id": RUN, "config": config, "best_checkpoint": best, "model_package": PACKAGE}
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/summary.json", Body=json.dumps(summary))
    manifest = CheckpointManifest(
        model="qwen3-8b", base_model=base_model,
        checkpoints=[SavedCheckpoint(name="final", key=FINAL, step=12)],
    )  # fmt: skip
    s3.put_object(
        Bucket=BUCKET, Key=f"runs/{RUN}/checkpoints/manifest.json", Body=manifest.model_dump_json()
    )
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        s3.put_object(Bucket=BUCKET, Key=f"{FINAL}{name}", Body=b"{}")


@pytest.fixture
def world(aws: None) -> Iterator[dict[str, Any]]:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    _publish(s3, _config())
    read: list[list[str]] = []

    def load(model: dict[str, Any]) -> None:
        """SageMaker downloads the model data under its prefix before the container starts."""
        uri = model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"]
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        read.append(sorted(item["Key"].removeprefix(prefix) for item in listed))

    sagemaker = FakeSageMakerHosting(on_endpoint=load)
    with sagemaker.installed():
        yield {"s3": s3, "sagemaker": sagemaker, "read": read,
               "clients": {"s3": s3, "sagemaker": boto3.client("sagemaker")}}  # fmt: skip


def _waiting() -> tuple[Waiting, list[float]]:
    pauses: list[float] = []
    return Waiting(clock=lambda: 100.0 + 30.0 * len(pauses), pause=pauses.append), pauses


def test_a_lora_run_is_served_on_its_hub_base_model_with_its_adapter(world: dict) -> None:
    waiting, pauses = _waiting()
    lines: list[str] = []
    endpoint = deploy_to_sagemaker(
        world["clients"], _deployment(), RUN, waiting=waiting, on_progress=lines.append
    )
    sagemaker = world["sagemaker"]
    (model,) = sagemaker.operations("CreateModel")
    tags = [{"Key": "mtrl-run", "Value": RUN}, {"Key": "mtrl-deployment", "Value": "nova-mtrl"}]
    assert model == {
        "ModelName": NAME,
        "PrimaryContainer": {
            "Image": IMAGE,
            "ModelDataSource": {"S3DataSource": {
                "S3Uri": f"s3://{BUCKET}/{FINAL}", "S3DataType": "S3Prefix",
                "CompressionType": "None",
            }},
            "Environment": {
                "SM_VLLM_MODEL": "Qwen/Qwen3-8B", "SM_VLLM_ENABLE_LORA": "true",
                "SM_VLLM_LORA_MODULES": f"{NAME}=/opt/ml/model", "SM_VLLM_MAX_LORA_RANK": "32",
                "SM_VLLM_DTYPE": "bfloat16", "SM_VLLM_MAX_MODEL_LEN": "10240",
            },
        },
        "ExecutionRoleArn": ROLE,
        "EnableNetworkIsolation": False,  # the base model comes from the Hub
        "Tags": tags,
    }  # fmt: skip
    (config,) = sagemaker.operations("CreateEndpointConfig")
    assert config == {
        "EndpointConfigName": NAME,
        "ProductionVariants": [{
            "VariantName": "AllTraffic", "ModelName": NAME, "InstanceType": "ml.g6e.2xlarge",
            "InitialInstanceCount": 1, "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
            "ModelDataDownloadTimeoutInSeconds": 3600,
            "ContainerStartupHealthCheckTimeoutInSeconds": 1800,
        }],
        "Tags": tags,
    }  # fmt: skip
    assert sagemaker.operations("CreateEndpoint") == [
        {"EndpointName": NAME, "EndpointConfigName": NAME, "Tags": tags}
    ]
    # SageMaker read the adapter folder the trainer saved.
    assert world["read"] == [["adapter_config.json", "adapter_model.safetensors"]]
    assert endpoint.endpoint_name == NAME and endpoint.served_model == NAME
    assert endpoint.endpoint_arn == f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:endpoint/{NAME}"
    assert endpoint.model_package_arn == PACKAGE
    assert lines == [
        f"registered as {PACKAGE}", f"endpoint {NAME}: Creating (0 s)",
        f"endpoint {NAME}: Creating (30 s)", f"endpoint {NAME}: InService (60 s)",
    ]  # fmt: skip
    assert pauses == [30.0, 30.0]


def test_a_fully_trained_model_is_served_whole_and_isolated(world: dict) -> None:
    _publish(world["s3"], _config("rft_multiturn_full", max_length=4096))
    endpoint = deploy_to_sagemaker(
        world["clients"], _deployment(), RUN, waiting=_waiting()[0], instance_type="ml.g5.12xlarge"
    )
    (model,) = world["sagemaker"].operations("CreateModel")
    assert model["PrimaryContainer"]["Environment"] == {
        "SM_VLLM_MODEL": "/opt/ml/model", "SM_VLLM_SERVED_MODEL_NAME": NAME,
        "SM_VLLM_DTYPE": "bfloat16", "SM_VLLM_MAX_MODEL_LEN": "4096",
    }  # fmt: skip
    assert model["EnableNetworkIsolation"] is True
    (config,) = world["sagemaker"].operations("CreateEndpointConfig")
    assert (
        config["ProductionVariants"][0]["InstanceType"]
        == endpoint.instance_type
        == "ml.g5.12xlarge"
    )


def test_a_lora_rank_vllm_does_not_take_is_served_with_the_next_it_does(world: dict) -> None:
    _publish(world["s3"], _config(lora={"rank": 48, "alpha": 96}))
    deploy_to_sagemaker(world["clients"], _deployment(), RUN, waiting=_waiting()[0])
    (model,) = world["sagemaker"].operations("CreateModel")
    assert model["PrimaryContainer"]["Environment"]["SM_VLLM_MAX_LORA_RANK"] == "64"


def test_deploying_again_goes_on_from_what_is_there(world: dict) -> None:
    first = deploy_to_sagemaker(world["clients"], _deployment(), RUN, waiting=_waiting()[0])
    again = deploy_to_sagemaker(world["clients"], _deployment(), RUN, waiting=_waiting()[0])
    sagemaker = world["sagemaker"]
    for operation in ("CreateModel", "CreateEndpointConfig", "CreateEndpoint"):
        assert len(sagemaker.operations(operation)) == 1, operation
    assert again == first
    with pytest.raises(DeployRefused, match=rf"deployed on ml.g6e.2xlarge already .*`mtrl deploy "
                       rf"{RUN} --to sagemaker --delete` first to serve it on ml.p5.48xlarge"):  # fmt: skip
        deploy_to_sagemaker(
            world["clients"], _deployment(), RUN, instance_type="ml.p5.48xlarge",
            waiting=_waiting()[0],
        )  # fmt: skip


def test_a_failed_endpoint_says_why_and_the_next_try_makes_it_anew(world: dict) -> None:
    sagemaker = world["sagemaker"]
    sagemaker.fails = True
    with pytest.raises(DeployFailed, match=f"endpoint {NAME} failed: The primary container did "
                       "not pass the ping health check"):  # fmt: skip
        deploy_to_sagemaker(world["clients"], _deployment(), RUN, waiting=_waiting()[0])
    sagemaker.fails = False
    deploy_to_sagemaker(world["clients"], _deployment(), RUN, waiting=_waiting()[0])
    assert sagemaker.operations("DeleteEndpoint") == [{"EndpointName": NAME}]
    assert len(sagemaker.operations("CreateEndpoint")) == 2
    assert len(sagemaker.operations("CreateModel")) == 1


def test_waiting_is_bounded_and_says_how_to_go_on(world: dict) -> None:
    world["sagemaker"].polls = 1000
    waiting, pauses = _waiting()
    bounded = Waiting(clock=waiting.clock, pause=waiting.pause, limit_seconds=60)
    with pytest.raises(DeployFailed, match=r"still Creating after 60 s: run `mtrl deploy` again"):
        deploy_to_sagemaker(world["clients"], _deployment(), RUN, waiting=bounded)
    assert len(pauses) == 2


@pytest.mark.parametrize(
    ("config", "base_model", "expected"),
    [
        (_config(model="nova-lite-2"), "Qwen/Qwen3-8B",
         "trained nova-lite-2, a Nova model: deploy it with `mtrl deploy RUN --to bedrock`"),
        (_config(), "s3://elsewhere/qwen/", "trained a LoRA adapter on s3://elsewhere/qwen/: the "
         "endpoint serves an adapter on a base model it loads from the Hugging Face Hub"),
        (_config(), None, "trained a LoRA adapter on a model its checkpoint manifest does not "
         "name: .* train this model with RFT_MULTITURN_FULL to serve it whole"),
    ],
)  # fmt: skip
def test_what_the_endpoint_cannot_serve_is_refused_before_anything_is_made(
    world: dict, config: dict[str, Any], base_model: str | None, expected: str
) -> None:
    _publish(world["s3"], config, base_model)
    with pytest.raises(DeployRefused, match=expected):
        deploy_to_sagemaker(world["clients"], _deployment(), RUN, waiting=_waiting()[0])
    assert world["sagemaker"].requests == []


def test_a_managed_jobs_package_is_not_served_on_an_endpoint_of_ours(world: dict) -> None:
    """A serverless run of an open-weights hub model: its model is the package its job
    registered, not a checkpoint of ours the container could mount."""
    serverless = load_training_config(EXAMPLES / "wordle" / "serverless.yaml").model_dump(
        mode="json"
    )
    config = serverless | {"model": "huggingface-reasoning-qwen3-32b", "global_batch_size": 256}
    summary = {"run_id": RUN, "config": config, "best_checkpoint": None, "model_package": PACKAGE}
    world["s3"].put_object(Bucket=BUCKET, Key=f"runs/{RUN}/summary.json", Body=json.dumps(summary))
    with pytest.raises(DeployRefused, match=f"ran as SageMaker's managed job, which registered "
                       f"its model as {PACKAGE}; .* deploy it from the SageMaker console"):  # fmt: skip
        deploy_to_sagemaker(world["clients"], _deployment(), RUN, waiting=_waiting()[0])
    assert world["sagemaker"].requests == []


def test_a_region_without_aws_image_needs_one_given(world: dict) -> None:
    with pytest.raises(DeployRefused, match=r"AWS publishes its vLLM serving image "
                       r"\(server-sagemaker-cuda-v2.6\) in no registry of us-gov-west-1: pass --image"):  # fmt: skip
        deploy_to_sagemaker(
            world["clients"], _deployment("us-gov-west-1"), RUN, waiting=_waiting()[0]
        )
    mine = f"{ACCOUNT}.dkr.ecr.us-gov-west-1.amazonaws.com/vllm:mine"
    deploy_to_sagemaker(
        world["clients"], _deployment("us-gov-west-1"), RUN, image=mine, waiting=_waiting()[0]
    )
    (model,) = world["sagemaker"].operations("CreateModel")
    assert model["PrimaryContainer"]["Image"] == mine


def test_delete_removes_the_endpoint_its_config_and_the_model(world: dict) -> None:
    deploy_to_sagemaker(world["clients"], _deployment(), RUN, waiting=_waiting()[0])
    sagemaker = world["clients"]["sagemaker"]
    assert delete_from_sagemaker(sagemaker, _deployment(), RUN) == [
        f"endpoint {NAME}", f"endpoint config {NAME}", f"model {NAME}",
    ]  # fmt: skip
    fake = world["sagemaker"]
    assert fake.models == fake.configs == fake.endpoints == {}
    assert delete_from_sagemaker(sagemaker, _deployment(), RUN) == []


def test_the_cli_deploys_an_open_weights_run_on_sagemaker_unless_told(
    world: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deploy, "deployed", lambda *_: (boto3.Session(), _deployment()))
    monkeypatch.setattr(deploy, "Waiting", lambda **_: _waiting()[0])
    result = CliRunner().invoke(app, ["deploy", RUN])
    assert result.exit_code == 0, result.output
    assert f"run {RUN} deployed on SageMaker: endpoint {NAME} (ml.g6e.2xlarge)" in result.output
    assert f'--body \'{{"model": "{NAME}", "messages"' in result.output
    assert f"`mtrl deploy {RUN} --to sagemaker --delete`" in result.output
    deleted = CliRunner().invoke(app, ["deploy", RUN, "--delete", "--json"])
    assert json.loads(deleted.stdout) == {
        "deleted": [f"endpoint {NAME}", f"endpoint config {NAME}", f"model {NAME}"]
    }
