"""`mtrl doctor`: is this account and deployment ready for a run, and if not, what to fix.

Each check says what it found and, when it fails, the fix: credentials, region, the stacks and
their outputs, the EKS cluster (active, private endpoint — the nodes reach it inside the VPC),
the HyperPod cluster (in service, a GPU group of the config's instance type), the account's
HyperPod quota for that type against the config's instance count (for Nova, the job's nodes as
AWS's chart counts them), for a Nova config what its run needs (region, restricted group, the
Forge recipes readable), and the reward-worker image in ECR. A check that cannot tell (an API the account does not allow) says so rather than
failing, and one whose prerequisite failed (no region, no stacks) is still a row saying what it
waits for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from domain.naming import StackOutput
from domain.nova_job import (
    FORGE_RECIPE_PATHS,
    FORGE_RECIPE_SOURCE,
    IMAGE_ACCOUNTS,
    NO_IMAGES,
    is_nova,
)
from mtrl.ops.deployment import Deployment, DeploymentError, aws_session, find_deployment
from training_configs import TrainingConfig

# The account-wide HyperPod quota (SageMaker docs, "SageMaker HyperPod prerequisites").
TOTAL_INSTANCES = "Total number of instances allowed across SageMaker HyperPod clusters"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: could not tell
    detail: str
    fix: str = ""


def diagnose(
    *,
    profile: str | None,
    region: str | None,
    prefix: str,
    config: TrainingConfig,
    clients: dict[str, Any] | None = None,
) -> list[Check]:
    """Every check, in the order of CHECKS, always all of them: one whose prerequisite failed
    says what it waits for rather than disappearing."""
    try:
        session = aws_session(profile=profile, region=region)
    except DeploymentError:
        found = Check("credentials", False, f"profile {profile!r} is not configured",
                      f"aws configure --profile {profile}, or a profile from ~/.aws/config")  # fmt: skip
        return _unchecked([found], "needs a configured profile")
    client: Callable[[str], Any] = lambda name: (clients or {}).get(name) or session.client(name)  # noqa: E731
    checks = [_credentials(session, client), _region(session)]
    if not all(check.ok for check in checks):
        return _unchecked(checks, "needs credentials and a region")
    try:
        deployment = find_deployment(session, prefix)
    except DeploymentError as error:
        found = Check("stacks", False, str(error), "make deploy, or the right --region/--prefix")
        return _unchecked([*checks, found], "needs the stacks")
    checks.append(
        Check(
            "stacks",
            True,
            f"{prefix}-storage, -pipeline, -compute ({len(deployment.outputs)} outputs)",
        )
    )
    for name, check in DEPLOYMENT_CHECKS:
        if name in CLUSTER_CHECKS and config.plane == "serverless":
            checks.append(Check(name, True, "a serverless run takes no HyperPod capacity"))
            continue
        try:
            checks.append(check(client, deployment, config))
        except DeploymentError as error:
            checks.append(Check(name, False, str(error), "make deploy"))
        except (ClientError, BotoCoreError) as error:
            checks.append(Check(name, None, f"could not check: {error}"))
    return checks


def _credentials(session: boto3.Session, client: Callable[[str], Any]) -> Check:
    fix = "aws configure (or aws sso login), or --profile"
    if session.get_credentials() is None:
        return Check("credentials", False, "none found", fix)
    if not session.region_name:
        return Check("credentials", None, "found; not verified without a region")
    try:
        who = client("sts").get_caller_identity()
    except NoCredentialsError:
        return Check("credentials", False, "none found", fix)
    except ClientError as error:
        code = error.response["Error"]["Code"]
        return Check("credentials", False, f"rejected ({code})",
                     "refresh them (aws sso login) or pass --profile")  # fmt: skip
    return Check("credentials", True, who["Arn"])


def _region(session: boto3.Session) -> Check:
    if session.region_name:
        return Check("region", True, session.region_name)
    return Check("region", False, "none set", "--region, AWS_REGION, or a region in the profile")


def _unchecked(checks: list[Check], reason: str) -> list[Check]:
    """`checks` followed by the rest of CHECKS, each saying it was not checked and why."""
    done = {check.name for check in checks}
    return [
        *checks,
        *(Check(name, None, f"not checked: {reason}") for name in CHECKS if name not in done),
    ]


def _eks(client: Callable[[str], Any], deployment: Deployment, config: TrainingConfig) -> Check:
    name = deployment.output(StackOutput.EKS_CLUSTER_NAME)
    cluster = client("eks").describe_cluster(name=name)["cluster"]
    if cluster["status"] != "ACTIVE":
        return Check(
            "eks", False, f"{name} is {cluster['status']}", "wait for it, or see the EKS console"
        )
    if not cluster.get("resourcesVpcConfig", {}).get("endpointPrivateAccess", False):
        return Check("eks", False, f"{name} has no private endpoint",
                     "the nodes and the platform's functions reach the API server inside the VPC: "
                     "enable private endpoint access")  # fmt: skip
    return Check("eks", True, f"{name} active, Kubernetes {cluster.get('version', '?')}")


def _hyperpod(
    client: Callable[[str], Any], deployment: Deployment, config: TrainingConfig
) -> Check:
    name = deployment.output(StackOutput.HYPER_POD_CLUSTER_NAME)
    cluster = client("sagemaker").describe_cluster(ClusterName=name)
    if cluster["ClusterStatus"] != "InService":
        return Check("hyperpod", False, f"{name} is {cluster['ClusterStatus']}",
                     "wait for it; if Failed, its FailureMessage says why (aws sagemaker describe-cluster)")  # fmt: skip
    types = {group["InstanceType"] for group in cluster.get("InstanceGroups", [])}
    if config.instance_type not in types:
        return Check("hyperpod", False, f"{name} has no {config.instance_type} group ({', '.join(sorted(types))})",
                     "set the config's instance_type to the training group's, or add the group in cdk.json")  # fmt: skip
    return Check("hyperpod", True, f"{name} in service with a {config.instance_type} group")


def _quota(client: Callable[[str], Any], deployment: Deployment, config: TrainingConfig) -> Check:
    """The quotas AWS lists for HyperPod capacity (SageMaker docs, "SageMaker HyperPod
    prerequisites"): the instance type's, and the total across the account's HyperPod clusters.
    A quota never raised has no applied value: its AWS default counts."""
    needed = config.instance_count
    names = [f"{config.instance_type} for cluster usage", TOTAL_INSTANCES]
    found = _quota_values(client("service-quotas"), names)
    parts, short = [], []
    for name in names:
        value, source = found.get(name, (0, "no such quota"))
        parts.append(f"{name}: {value}" + ("" if source == "applied" else f" ({source})"))
        if value < needed:
            short.append(repr(name))
    detail = f"{'; '.join(parts)} (the config needs {needed})"
    if short:
        return Check("quota", False, detail,
                     f"request an increase: Service Quotas → Amazon SageMaker → {' and '.join(short)}")  # fmt: skip
    return Check("quota", True, detail)


def _quota_values(quotas: Any, names: list[str]) -> dict[str, tuple[int, str]]:
    """name -> (value, "applied" or "AWS default") for the SageMaker quotas named."""
    found: dict[str, tuple[int, str]] = {}
    for operation, source in (
        ("list_service_quotas", "applied"),
        ("list_aws_default_service_quotas", "AWS default"),
    ):
        if len(found) == len(names):
            break
        for page in quotas.get_paginator(operation).paginate(ServiceCode="sagemaker"):
            for quota in page["Quotas"]:
                if quota["QuotaName"] in names and quota["QuotaName"] not in found:
                    found[quota["QuotaName"]] = (int(quota["Value"]), source)
    return found


def _nova(client: Callable[[str], Any], deployment: Deployment, config: TrainingConfig) -> Check:
    """What a Nova run needs of the account before any GPU is paid for: a region where AWS's
    launcher (as deployed) has Nova's images, a restricted group of the config's instance type,
    and the config's Forge recipe readable (a Nova Forge subscription's bucket). The GPU quota
    for the job's nodes (AWS's chart counted, domain/nova_capacity.py) is the quota check's."""
    if not is_nova(config.model):
        return Check("nova", True, f"model {config.model} is not Nova: nothing to check")
    if deployment.region not in IMAGE_ACCOUNTS:
        return Check("nova", False, f"{deployment.region} {NO_IMAGES}",
                     f"deploy to one of {', '.join(IMAGE_ACCOUNTS)}")  # fmt: skip
    name = deployment.output(StackOutput.HYPER_POD_CLUSTER_NAME)
    cluster = client("sagemaker").describe_cluster(ClusterName=name)
    restricted = {g["InstanceType"] for g in cluster.get("RestrictedInstanceGroups", [])}
    if config.instance_type not in restricted:
        return Check("nova", False, f"{name} has no restricted {config.instance_type} group",
                     "deploy with nova_restricted_group (the default) or a restricted group in "
                     "hyperpod_instance_groups (docs/operators/nova-on-aws.md)")  # fmt: skip
    for recipe in FORGE_RECIPE_PATHS:
        source = FORGE_RECIPE_SOURCE.format(recipe=recipe)
        bucket, _, key = source.removeprefix("s3://").partition("/")
        try:
            client("s3").head_object(Bucket=bucket, Key=key)
        except ClientError as error:
            code = error.response["Error"]["Code"]
            return Check("nova", False, f"the Forge recipe {source} cannot be read ({code})",
                         "Nova Forge's recipes are for subscribers: subscribe in the SageMaker AI "
                         "console (Nova Forge), from a role tagged forge-subscription: true")  # fmt: skip
    return Check("nova", True, f"{deployment.region}, restricted {config.instance_type} group, "
                 f"the {len(FORGE_RECIPE_PATHS)} Forge recipes readable")  # fmt: skip


def _worker_image(
    client: Callable[[str], Any], deployment: Deployment, config: TrainingConfig
) -> Check:
    family = deployment.output(StackOutput.REWARD_WORKER_TASK_FAMILY)
    definition = client("ecs").describe_task_definition(taskDefinition=family)["taskDefinition"]
    image = definition["containerDefinitions"][0]["image"]
    registry, _, reference = image.partition("/")
    if ".dkr.ecr." not in registry:
        return Check("worker image", True, image)
    repository, _, tag = reference.partition(":")
    try:
        client("ecr").describe_images(
            repositoryName=repository, imageIds=[{"imageTag": tag or "latest"}]
        )
    except ClientError as error:
        if error.response["Error"]["Code"] in (
            "ImageNotFoundException",
            "RepositoryNotFoundException",
        ):
            return Check(
                "worker image", False, f"{image} is not in ECR", "make deploy builds and pushes it"
            )
        raise
    return Check("worker image", True, image)


DEPLOYMENT_CHECKS = (
    ("eks", _eks),
    ("hyperpod", _hyperpod),
    ("quota", _quota),
    ("nova", _nova),
    ("worker image", _worker_image),
)
# What only a run on the deployment's own cluster needs.
CLUSTER_CHECKS = ("hyperpod", "quota", "nova")
CHECKS = ("credentials", "region", "stacks", *(name for name, _ in DEPLOYMENT_CHECKS))
