"""`mtrl deploy RUN --to bedrock`: a run's trained Nova model registered in the deployment's
model registry (by Collect), imported as a Bedrock custom model and deployed on demand —
against moto's S3 and a Bedrock fake whose requests and answers botocore checks against Bedrock's
model (tests/service_fakes.py); the calls as the Nova Forge SDK makes them (amzn-nova-forge
1.4.10, deployer/forge_deployer.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from mtrl.ops.deploy import (
    DeployFailed,
    DeployRefused,
    Waiting,
    delete_from_bedrock,
    deploy_to_bedrock,
    release_name,
)
from mtrl.ops.deployment import Deployment
from tests.service_fakes import ACCOUNT, FakeBedrock
from training_configs import load_training_config

BUCKET, RUN = "nova-mtrl-data", "wordle-0a1b2c3d4e"
CHECKPOINT = f"s3://customer-escrow-{ACCOUNT}-abc/job-abcde/step_10"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/nova-mtrl-bedrock-import"
DEPLOYMENT = Deployment(
    prefix="nova-mtrl", region="us-east-1", account=ACCOUNT,
    outputs={
        "DataBucketName": BUCKET, "ModelPackageGroupName": "nova-mtrl-models",
        "BedrockImportRoleArn": ROLE,
        "StateMachineArn": f"arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:nova-mtrl-pipeline",
    },
)  # fmt: skip
PACKAGE = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:model-package/nova-mtrl-models/3"
SERVERLESS = Path(__file__).resolve().parents[2] / "examples" / "wordle" / "serverless.yaml"


def _summary(
    model: str = "nova-lite-2", best: dict | None = None, package: str | None = PACKAGE
) -> dict[str, Any]:
    best = best if best is not None else {"name": "job-abcde", "uri": CHECKPOINT, "why": "last"}
    config = {**load_training_config("rft_multiturn_lora").model_dump(mode="json"), "model": model}
    return {"run_id": RUN, "config": config, "best_checkpoint": best,
            "model_package": package}  # fmt: skip


def _serverless_summary(package: str | None = PACKAGE) -> dict[str, Any]:
    """A serverless run's: no checkpoint of ours, the package its managed job registered."""
    config = load_training_config(SERVERLESS).model_dump(mode="json")
    return {"run_id": RUN, "config": config, "best_checkpoint": None, "model_package": package}


@pytest.fixture
def world(aws: None) -> Iterator[dict[str, Any]]:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/summary.json", Body=json.dumps(_summary()))
    bedrock = FakeBedrock()
    with bedrock.installed():
        yield {"s3": s3, "bedrock": bedrock,
               "clients": {"s3": s3, "bedrock": boto3.client("bedrock")}}  # fmt: skip


def _waiting() -> tuple[Waiting, list[float]]:
    """A clock that moves by each pause (of 30 s), and the pauses taken."""
    pauses: list[float] = []
    return Waiting(clock=lambda: 5000.0 + 30.0 * len(pauses), pause=pauses.append), pauses


def test_a_run_is_registered_imported_and_deployed_on_demand(world: dict) -> None:
    waiting, pauses = _waiting()
    lines: list[str] = []
    released = deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=waiting,
                                 on_progress=lines.append)  # fmt: skip
    bedrock, name = world["bedrock"], release_name("nova-mtrl", RUN)
    assert name == "nova-mtrl-run-wordle-0a1b2c3d4e"
    (created,) = bedrock.operations("CreateCustomModel")
    assert created == {
        "modelName": name,
        "modelSourceConfig": {"s3DataSource": {"s3Uri": CHECKPOINT}},
        "roleArn": ROLE,
        "modelTags": [{"key": "mtrl-run", "value": RUN},
                      {"key": "mtrl-deployment", "value": "nova-mtrl"}],
    }  # fmt: skip
    (deployed,) = bedrock.operations("CreateCustomModelDeployment")
    assert deployed == {
        "modelDeploymentName": name, "modelArn": released.model_arn,
        "description": f"nova-mtrl run {RUN}", "tags": created["modelTags"],
    }  # fmt: skip
    assert lines[-1] == f"deployment {name}: Active (60 s)"
    assert released.deployment_arn == bedrock.deployments[name]["arn"]
    # Each waited through two Creating answers, a pause after each.
    assert pauses == [30.0] * 4
    assert lines[1:4] == [
        f"custom model {name}: Creating (0 s)", f"custom model {name}: Creating (30 s)",
        f"custom model {name}: Active (60 s)",
    ]  # fmt: skip
    assert released.model_package_arn == PACKAGE and lines[0] == f"registered as {PACKAGE}"


def test_a_managed_jobs_package_is_imported_by_its_arn_without_the_import_role(
    world: dict,
) -> None:
    """A serverless run's model is the package its job registered (in AWS's storage, no
    checkpoint of ours): Bedrock takes it as `customModelDataSource` and reads it itself (its
    API reference: no role with a model package ARN); then deployed as any other."""
    world["s3"].put_object(
        Bucket=BUCKET, Key=f"runs/{RUN}/summary.json", Body=json.dumps(_serverless_summary())
    )
    released = deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=_waiting()[0])
    bedrock = world["bedrock"]
    (created,) = bedrock.operations("CreateCustomModel")
    assert created == {
        "modelName": release_name("nova-mtrl", RUN),
        "customModelDataSource": {"modelPackageArnDataSource": {"modelPackageArn": PACKAGE}},
        "modelTags": [{"key": "mtrl-run", "value": RUN},
                      {"key": "mtrl-deployment", "value": "nova-mtrl"}],
    }  # fmt: skip
    assert released.model_package_arn == PACKAGE
    assert released.deployment_arn == next(iter(bedrock.deployments.values()))["arn"]


def test_deploying_again_goes_on_from_what_is_there(world: dict) -> None:
    deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=_waiting()[0])
    again = deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=_waiting()[0])
    bedrock = world["bedrock"]
    assert len(bedrock.operations("CreateCustomModel")) == 1
    assert len(bedrock.operations("CreateCustomModelDeployment")) == 1
    assert again.deployment_arn == next(iter(bedrock.deployments.values()))["arn"]


def test_a_failed_import_says_why_and_the_next_try_starts_it_again(world: dict) -> None:
    world["bedrock"].import_fails = True
    with pytest.raises(DeployFailed, match="custom model .* failed: bad checkpoint"):
        deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=_waiting()[0])
    world["bedrock"].failure = None
    world["bedrock"].models.clear()
    with pytest.raises(DeployFailed, match="custom model .* failed: no reason given"):
        deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=_waiting()[0])
    world["bedrock"].import_fails = False
    deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=_waiting()[0])
    bedrock = world["bedrock"]
    assert len(bedrock.operations("DeleteCustomModel")) == 1
    assert len(bedrock.operations("CreateCustomModel")) == 3


def test_waiting_is_bounded_and_says_how_to_go_on(world: dict) -> None:
    world["bedrock"].polls = 1000
    waiting, pauses = _waiting()
    bounded = Waiting(clock=waiting.clock, pause=waiting.pause, limit_seconds=90)
    assert waiting.clock() == 5000.0  # the bound counts from the start, not from zero
    with pytest.raises(DeployFailed, match=r"still Creating after 90 s: run `mtrl deploy` again"):
        deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=bounded)
    assert len(pauses) == 3


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        (None, rf"run {RUN} has no results \(no s3://{BUCKET}/runs/{RUN}/summary.json\): only a "
               r"run that succeeded can be deployed \(`mtrl runs`\)"),
        (_summary(model="qwen3-8b"), "trained qwen3-8b, not a Nova model: Bedrock imports Nova "
         "checkpoints; serve an open-weights model with `mtrl deploy RUN --to sagemaker`"),
        ({"run_id": RUN, "config": {"model": "nova-lite-2"}}, r"summary.json holds no training "
         r"config this version of mtrl reads \(name: Field required\); deploy it with the mtrl "
         r"it was trained with"),
        (_summary(best={"name": "j", "uri": None}),
         "nothing to deploy: the run recorded no checkpoint with a location"),
        (_summary(best={"name": None, "uri": None, "why": "the starting model did better"}),
         "nothing to deploy: the starting model did better"),
        (_summary(package=None), r"its model is not in the model registry \(s3://.*summary.json "
         r"names no model_package\); Collect registers every run's model: redeploy the platform"),
        (_serverless_summary(package=None), "nothing to deploy: its managed job registered no "
         r"model package \(s3://.*summary.json names none\)"),
    ],
)  # fmt: skip
def test_a_run_without_a_nova_checkpoint_worth_deploying_is_refused(
    world: dict, summary: dict | None, expected: str
) -> None:
    key = f"runs/{RUN}/summary.json"
    if summary is None:
        world["s3"].delete_object(Bucket=BUCKET, Key=key)
    else:
        world["s3"].put_object(Bucket=BUCKET, Key=key, Body=json.dumps(summary))
    with pytest.raises(DeployRefused, match=expected):
        deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=_waiting()[0])
    assert world["bedrock"].requests == []


def test_delete_removes_the_deployment_then_the_model(world: dict) -> None:
    released = deploy_to_bedrock(world["clients"], DEPLOYMENT, RUN, waiting=_waiting()[0])
    bedrock = world["clients"]["bedrock"]
    assert delete_from_bedrock(bedrock, DEPLOYMENT, RUN) == [
        released.deployment_arn, released.model_arn,
    ]  # fmt: skip
    assert world["bedrock"].models == {} and world["bedrock"].deployments == {}
    assert delete_from_bedrock(bedrock, DEPLOYMENT, RUN) == []


def test_names_are_in_bedrocks_alphabet_and_never_end_in_a_separator() -> None:
    assert release_name("Nova", "x--y_z") == "Nova-run-x-y-z"
    assert release_name("nova", "runX") == "nova-run-runX"
    long = release_name("nova-mtrl", "a" * 48 + "-b")  # the 63rd character is the separator
    assert len(long) == 62 and long.endswith("a")
