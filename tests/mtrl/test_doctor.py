"""`mtrl doctor` against moto and recorded fakes (moto has no HyperPod clusters and no Service
Quotas): every check's finding and fix, and the exit code."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from domain.nova_job import FORGE_RECIPE_PATHS, FORGE_RECIPE_SOURCE, FORGE_RECIPES
from mtrl.cli import app
from mtrl.commands import platform
from mtrl.ops.doctor import CHECKS, TOTAL_INSTANCES, diagnose
from tests.mtrl.test_ops_commands import _stack
from tests.service_fakes import FakeSageMaker, FakeServiceQuotas
from training_configs import load_training_config

REPOSITORY = "cdk-hnb659fds-container-assets-123456789012-us-east-1"
IMAGE = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{REPOSITORY}:abc123"
LORA = load_training_config("rft_multiturn_lora")  # 8 x ml.p5.48xlarge
FORGE_RECIPE = FORGE_RECIPE_SOURCE.format(recipe=FORGE_RECIPES["RFT_MULTITURN_LORA"])


def quotas(defaults: dict[str, float] | None = None, **applied: float) -> Any:
    return FakeServiceQuotas(defaults, **applied).client()


@pytest.fixture
def sagemaker(aws: None) -> FakeSageMaker:
    return FakeSageMaker()


@pytest.fixture
def healthy(sagemaker: FakeSageMaker) -> dict[str, Any]:
    """A deployment whose every check passes (the rest of the account in moto)."""
    boto3.client("eks").create_cluster(
        name="nova-mtrl-eks", roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": [], "endpointPublicAccess": True,
                            "endpointPrivateAccess": True},
    )  # fmt: skip
    ecr = boto3.client("ecr")
    ecr.create_repository(repositoryName=REPOSITORY)
    ecr.put_image(repositoryName=REPOSITORY, imageTag="abc123", imageManifest=json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
         "config": {}, "layers": []}))  # fmt: skip
    boto3.client("ecs").register_task_definition(
        family="nova-mtrl-reward-worker",
        containerDefinitions=[{"name": "reward-worker", "image": IMAGE, "memory": 2048}],
    )
    _stack("nova-mtrl-storage", {"DataBucketName": "data"})
    _stack("nova-mtrl-pipeline", {"StateMachineArn": "arn", "RunsTableName": "runs"})
    _stack("nova-mtrl-compute", {"EksClusterName": "nova-mtrl-eks", "HyperPodClusterName": "nova-mtrl",
                                 "RewardWorkerTaskFamily": "nova-mtrl-reward-worker"})  # fmt: skip
    # The Forge recipes the deployment's runs read, where a subscriber's account reads them.
    for recipe in FORGE_RECIPE_PATHS:
        bucket, _, key = FORGE_RECIPE_SOURCE.format(recipe=recipe)[5:].partition("/")
        boto3.client("s3").create_bucket(Bucket=bucket)
        boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=b"run: {}\n")
    return {
        "sagemaker": sagemaker.client(),
        "service-quotas": quotas(**{"ml.p5.48xlarge for cluster usage": 8, TOTAL_INSTANCES: 16}),
    }


def _diagnose(clients: dict[str, Any]) -> dict[str, Any]:
    checks = diagnose(
        profile=None, region="us-east-1", prefix="nova-mtrl", config=LORA, clients=clients
    )
    return {check.name: check for check in checks}


def test_a_ready_deployment_passes_every_check(healthy: dict) -> None:
    checks = _diagnose(healthy)
    assert (
        tuple(checks)
        == CHECKS
        == (
            "credentials",
            "region",
            "stacks",
            "eks",
            "hyperpod",
            "quota",
            "nova",
            "worker image",
        )
    )
    assert all(check.ok for check in checks.values()), checks
    assert checks["quota"].detail == (
        "ml.p5.48xlarge for cluster usage: 8; "
        "Total number of instances allowed across SageMaker HyperPod clusters: 16 "
        "(the config needs 8)"
    )
    assert checks["worker image"].detail == IMAGE


def test_what_is_missing_says_how_to_fix_it(healthy: dict, sagemaker: FakeSageMaker) -> None:
    healthy["service-quotas"] = quotas(
        **{"ml.p5.48xlarge for cluster usage": 6, TOTAL_INSTANCES: 16}
    )
    boto3.client("ecr").batch_delete_image(
        repositoryName=REPOSITORY, imageIds=[{"imageTag": "abc123"}]
    )
    checks = _diagnose(healthy)
    assert (checks["quota"].ok, checks["quota"].fix) == (
        False, "request an increase: Service Quotas → Amazon SageMaker → 'ml.p5.48xlarge for cluster usage'",
    )  # fmt: skip
    assert (checks["worker image"].ok, checks["worker image"].fix) == (
        False,
        "make deploy builds and pushes it",
    )
    sagemaker.groups[1]["InstanceType"] = "ml.g5.48xlarge"
    assert "has no ml.p5.48xlarge group" in _diagnose(healthy)["hyperpod"].detail


def test_a_nova_run_needs_its_region_its_restricted_group_and_the_forge_recipe(
    healthy: dict, sagemaker: FakeSageMaker
) -> None:
    check = _diagnose(healthy)["nova"]
    assert (check.ok, check.detail) == (
        True,
        "us-east-1, restricted ml.p5.48xlarge group, the 3 Forge recipes readable",
    )
    bucket, _, key = FORGE_RECIPE.removeprefix("s3://").partition("/")
    boto3.client("s3").delete_object(Bucket=bucket, Key=key)
    check = _diagnose(healthy)["nova"]
    assert (check.ok, check.detail) == (
        False,
        f"the Forge recipe {FORGE_RECIPE} cannot be read (404)",
    )
    assert check.fix.startswith("Nova Forge's recipes are for subscribers: subscribe")
    sagemaker.restricted.clear()
    check = _diagnose(healthy)["nova"]
    assert (check.ok, check.detail) == (False, "nova-mtrl has no restricted ml.p5.48xlarge group")
    open_weights = LORA.model_copy(update={"model": "qwen3-8b"})
    checks = diagnose(profile=None, region="us-east-1", prefix="nova-mtrl", config=open_weights,
                      clients=healthy)  # fmt: skip
    assert [c.ok for c in checks if c.name == "nova"] == [True]


def test_a_quota_never_raised_counts_at_its_aws_default(healthy: dict) -> None:
    # Applied values exist only for quotas raised for the account; the rest are AWS's defaults
    # (botocore's service-quotas model: ListServiceQuotas, ListAWSDefaultServiceQuotas). The
    # quota names are those of SageMaker docs, "SageMaker HyperPod prerequisites".
    healthy["service-quotas"] = quotas(
        {TOTAL_INSTANCES: 30, "ml.p5.48xlarge for cluster usage": 0},
        **{"ml.p5.48xlarge for cluster usage": 8},
    )
    check = _diagnose(healthy)["quota"]
    assert check.ok, check
    assert f"{TOTAL_INSTANCES}: 30 (AWS default)" in check.detail
    healthy["service-quotas"] = quotas({TOTAL_INSTANCES: 0, "ml.p5.48xlarge for cluster usage": 0})
    check = _diagnose(healthy)["quota"]
    assert check.ok is False
    assert check.detail == (
        "ml.p5.48xlarge for cluster usage: 0 (AWS default); "
        f"{TOTAL_INSTANCES}: 0 (AWS default) (the config needs 8)"
    )
    assert check.fix == (
        "request an increase: Service Quotas → Amazon SageMaker → "
        f"'ml.p5.48xlarge for cluster usage' and {TOTAL_INSTANCES!r}"
    )


def test_the_cli_exits_1_on_a_failed_check_and_0_when_ready(
    healthy: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(platform, "diagnose", functools.partial(diagnose, clients=healthy))
    ready = CliRunner().invoke(app, ["doctor", "--region", "us-east-1", "--json"])
    assert ready.exit_code == 0, ready.output
    assert [c["ok"] for c in json.loads(ready.output)] == [True] * 8
    healthy["service-quotas"] = quotas()
    missing = CliRunner().invoke(app, ["doctor", "--region", "us-east-1"])
    assert missing.exit_code == 1 and "FAIL" in missing.output


def test_no_stacks_leaves_the_rest_unchecked_and_says_why(aws: None) -> None:
    checks = _diagnose({})
    assert tuple(checks) == CHECKS
    assert checks["stacks"].ok is False and "not found in us-east-1" in checks["stacks"].detail
    for name in ("eks", "hyperpod", "quota", "nova", "worker image"):
        assert (checks[name].ok, checks[name].detail) == (None, "not checked: needs the stacks")


def _bare(**session: str | None) -> dict[str, Any]:
    checks = diagnose(
        prefix="nova-mtrl", config=LORA, **{"profile": None, "region": None, **session}
    )
    assert tuple(check.name for check in checks) == CHECKS
    return {check.name: check for check in checks}


def test_no_region_and_no_credentials_are_rows_with_their_fixes(no_aws_setup: None) -> None:
    checks = _bare()
    assert (checks["credentials"].ok, checks["credentials"].detail, checks["credentials"].fix) == (
        False, "none found", "aws configure (or aws sso login), or --profile")  # fmt: skip
    assert (checks["region"].ok, checks["region"].detail, checks["region"].fix) == (
        False, "none set", "--region, AWS_REGION, or a region in the profile")  # fmt: skip
    for name in ("stacks", "eks", "hyperpod", "quota", "nova", "worker image"):
        assert (checks[name].ok, checks[name].detail) == (
            None, "not checked: needs credentials and a region")  # fmt: skip


def test_credentials_without_a_region_are_found_but_not_verified(
    no_aws_setup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    checks = _bare()
    assert (checks["credentials"].ok, checks["credentials"].detail) == (
        None, "found; not verified without a region")  # fmt: skip
    assert checks["region"].ok is False
    assert checks["stacks"].detail == "not checked: needs credentials and a region"


def test_an_unknown_profile_is_the_credentials_row(no_aws_setup: None) -> None:
    checks = _bare(profile="nope", region="us-east-1")
    assert (checks["credentials"].ok, checks["credentials"].detail) == (
        False, "profile 'nope' is not configured")  # fmt: skip
    assert "aws configure --profile nope" in checks["credentials"].fix
    assert checks["region"].detail == "not checked: needs a configured profile"


def test_doctor_without_a_region_prints_its_whole_table(no_aws_setup: None) -> None:
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 1, result.output
    rows = json.loads(result.output)
    assert [row["name"] for row in rows] == list(CHECKS)
    assert [row["ok"] for row in rows] == [False, False, None, None, None, None, None, None]
    table = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert table.exit_code == 1
    assert "error" not in table.output and "Traceback" not in table.output
    for name in CHECKS:
        assert name in table.output


def test_an_eks_cluster_without_its_private_endpoint_is_named_with_the_fix(healthy: dict) -> None:
    eks = boto3.client("eks")
    eks.delete_cluster(name="nova-mtrl-eks")
    eks.create_cluster(
        name="nova-mtrl-eks", roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": [], "endpointPublicAccess": True,
                            "endpointPrivateAccess": False},
    )  # fmt: skip
    check = _diagnose(healthy)["eks"]
    assert (check.ok, check.detail) == (False, "nova-mtrl-eks has no private endpoint")
    assert "enable private endpoint access" in check.fix


def test_a_serverless_run_needs_no_cluster_capacity(healthy: dict) -> None:
    """Its job runs on SageMaker's own capacity: no HyperPod group, quota or restricted group
    is asked of the account (a quota of zero and no cluster pass)."""
    serverless = load_training_config(
        Path(__file__).resolve().parents[2] / "examples" / "wordle" / "serverless.yaml"
    )
    healthy["service-quotas"] = quotas(**{TOTAL_INSTANCES: 0})
    healthy["sagemaker"] = None  # never asked
    checks = {
        check.name: check
        for check in diagnose(
            profile=None, region="us-east-1", prefix="nova-mtrl", config=serverless, clients=healthy
        )
    }
    for name in ("hyperpod", "quota", "nova"):
        assert (checks[name].ok, checks[name].detail) == (
            True, "a serverless run takes no HyperPod capacity",
        ), name  # fmt: skip
    assert checks["eks"].ok and checks["worker image"].ok
