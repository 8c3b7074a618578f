"""The deployment configuration: one typed model, read from CDK context.

Values come from `cdk.json` ("context") and from `cdk deploy -c key=value`. The CDK CLI hands
`-c` values over as strings, so list and object fields also accept a JSON string, and numbers
and booleans are parsed from text. Any invalid value raises `ConfigError` whose message names
the key, the value given and what is allowed.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from difflib import get_close_matches
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from domain.naming import prefix_problem
from domain.nova_job import (
    IMAGE_ACCOUNTS,
    LAUNCHER_RECIPES,
    NO_IMAGES,
    NOVA_INSTANCE_TYPE,
    is_nova,
)
from domain.presets import JobKind, ModelPreset

CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"

# Kubernetes versions that SageMaker HyperPod accepts for its EKS orchestrator, from 1.30: the
# pipeline's access is fenced by a ValidatingAdmissionPolicy (domain/kubernetes_rbac.py).
# AWS's "Getting started with Amazon EKS support in SageMaker HyperPod" lists up to 1.34 as read
# here; 1.35 is accepted but unverified (docs/operators/configuration.md).
HYPERPOD_EKS_VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35")
UNVERIFIED_EKS_VERSIONS = ("1.35",)

# Fargate task sizes: CPU units -> allowed memory (MiB).
FARGATE_MEMORY_BY_CPU: dict[int, range] = {
    256: range(512, 2048 + 1, 512),
    512: range(1024, 4096 + 1, 1024),
    1024: range(2048, 8192 + 1, 1024),
    2048: range(4096, 16384 + 1, 1024),
    4096: range(8192, 30720 + 1, 1024),
    8192: range(16384, 61440 + 1, 4096),
    16384: range(32768, 122880 + 1, 8192),
}

_NAME = r"^[a-z][a-z0-9-]*[a-z0-9]$"
_HYPERPOD_GROUP_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
_ML_INSTANCE_TYPE = r"^ml\.[a-z0-9-]+\.[a-z0-9]+$"
_EC2_INSTANCE_TYPE = r"^[a-z][a-z0-9-]*\.[a-z0-9]+$"
_REGION = r"^[a-z]{2}(-[a-z]+)+-\d$"
_AZ = r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$"
_ROLE_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$"
_EMAIL = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"

Region = Annotated[str, Field(pattern=_REGION, description="an AWS region such as us-east-1")]
AvailabilityZone = Annotated[str, Field(pattern=_AZ, description="an AZ name such as us-east-1a")]


class ConfigError(ValueError):
    """An invalid deployment configuration, phrased for the person who wrote it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FsxLustre(_Strict):
    """A restricted instance group's service-managed FSx for Lustre (CloudFormation's
    AWS::SageMaker::Cluster FSxLustreConfig; botocore's CreateCluster gives the same bounds: size
    1200-100800 GiB, throughput 125-1000 MB/s/TiB — the range of FSx's PERSISTENT_2 SSD, whose
    valid values botocore's FSx model lists: 125, 250, 500, 1000)."""

    size_gib: int = Field(ge=1200, le=100800)
    per_unit_storage_throughput: Literal[125, 250, 500, 1000] = Field(description="MB/s per TiB")


class HyperPodInstanceGroup(_Strict):
    """One HyperPod instance group. `count` may be 0: the pipeline scales it up per run.
    `restricted`: a restricted instance group (RIG) for Nova: Nova images only, its own
    execution role, and a service-managed FSx for Lustre (`fsx`); no lifecycle scripts."""

    name: str = Field(pattern=_HYPERPOD_GROUP_NAME)
    instance_type: str = Field(pattern=_ML_INSTANCE_TYPE, description="e.g. ml.p5.48xlarge")
    count: int = Field(ge=0, le=1000)
    threads_per_core: Literal[1, 2] = 1
    ebs_volume_gb: int = Field(default=500, ge=1, le=16384)
    restricted: bool = False
    fsx: FsxLustre | None = None

    @model_validator(mode="after")
    def _fsx_on_restricted_groups_only(self) -> Self:
        if self.restricted and self.fsx is None:
            raise ValueError(
                f"restricted group {self.name!r} needs fsx: {{size_gib (1200-100800), "
                "per_unit_storage_throughput (125, 250, 500 or 1000)}, its service-managed FSx "
                "for Lustre"
            )
        if not self.restricted and self.fsx is not None:
            raise ValueError(
                f"group {self.name!r} has fsx but is not restricted: only a restricted group "
                "gets a service-managed FSx for Lustre (set restricted: true, or remove fsx)"
            )
        return self


# The restricted group a Nova-ready deployment gets when it names none: at 0 nodes until a run
# scales it, with the FSx for Lustre AWS's own Nova multi-turn sample gives its restricted group
# (aws-samples/sample-nova-multi-turn-rl-infra, stacks/nova_rl_stack.py: 9,600 GiB at
# 250 MB/s/TiB).
DEFAULT_NOVA_GROUP = HyperPodInstanceGroup(
    name="nova",
    instance_type=NOVA_INSTANCE_TYPE,
    count=0,
    restricted=True,
    fsx=FsxLustre(size_gib=9600, per_unit_storage_throughput=250),
)


class ForgeCliBundle(_Strict):
    """AWS's HyperPod CLI with Forge support, which Forge customers are told to use (aws/nova-forge-
    sdk's README, "For Forge Customers": `aws s3 cp s3://nova-forge-…/v1/ ./ --recursive`): the
    launcher image is built with it instead of the public `release_v2`. `mtrl forge-cli`
    (run by `make deploy`) downloads it with the deployer's credentials; a bundle whose files do
    not hash to `sha256` is never built."""

    uri: str = Field(
        pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([^\s]+/)?$",
        description="the bundle's S3 folder, s3://<bucket>/<prefix>/ (the Forge subscription's)",
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="the digest of its files that `mtrl forge-cli` prints, once reviewed",
    )


class SystemNodeGroup(_Strict):
    """The small EC2 node group that runs cluster services (CoreDNS, operators)."""

    instance_type: str = Field(default="m6i.large", pattern=_EC2_INSTANCE_TYPE)
    min_size: int = Field(default=1, ge=1, le=20)
    desired_size: int = Field(default=2, ge=1, le=20)
    max_size: int = Field(default=3, ge=1, le=20)

    @model_validator(mode="after")
    def _sizes_ordered(self) -> Self:
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError(
                f"needs min_size <= desired_size <= max_size, got "
                f"{self.min_size} / {self.desired_size} / {self.max_size}"
            )
        return self


class ExistingVpc(_Strict):
    """An already-existing VPC to deploy into instead of creating one."""

    vpc_id: str = Field(pattern=r"^vpc-[0-9a-f]{8,17}$")
    availability_zones: list[AvailabilityZone] = Field(min_length=1)
    private_subnet_ids: list[Annotated[str, Field(pattern=r"^subnet-[0-9a-f]{8,17}$")]]
    public_subnet_ids: list[Annotated[str, Field(pattern=r"^subnet-[0-9a-f]{8,17}$")]] = []

    @model_validator(mode="after")
    def _one_subnet_per_az(self) -> Self:
        zones = len(self.availability_zones)
        for field in ("private_subnet_ids", "public_subnet_ids"):
            ids = getattr(self, field)
            if ids and len(ids) != zones:
                raise ValueError(
                    f"{field} must list one subnet per availability zone "
                    f"({zones} zones, {len(ids)} subnets)"
                )
        if not self.private_subnet_ids:
            raise ValueError("private_subnet_ids must list one subnet per availability zone")
        return self


class ExistingEksCluster(_Strict):
    """An already-existing EKS cluster (in `existing_vpc`) to orchestrate HyperPod."""

    cluster_name: str = Field(pattern=r"^[0-9A-Za-z][A-Za-z0-9\-_]{0,99}$")
    security_group_id: str = Field(
        pattern=r"^sg-[0-9a-f]{8,17}$",
        description="the cluster security group, shared with the HyperPod nodes",
    )


class ExistingHyperPodCluster(_Strict):
    """An already-existing HyperPod cluster (orchestrated by `existing_eks_cluster`)."""

    cluster_name: str = Field(pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
    execution_role_arn: str | None = Field(
        default=None,
        pattern=_ROLE_ARN,
        description="its instance groups' execution role: scaling them passes it to SageMaker",
    )


class PlatformConfig(_Strict):
    """Everything `cdk deploy` needs to know. Field names are the context keys."""

    name_prefix: str = Field(default="nova-mtrl", min_length=3, max_length=20, pattern=_NAME)
    account: str | None = Field(default=None, pattern=r"^\d{12}$")
    region: Region | None = Field(default=None, description="an AWS region such as us-east-1")
    availability_zones: list[AvailabilityZone] | None = None
    vpc_cidr: str = "10.64.0.0/16"
    az_count: int = Field(default=2, ge=2, le=6)
    eks_version: str = "1.33"
    system_node_group: SystemNodeGroup = SystemNodeGroup()
    hyperpod_instance_groups: list[HyperPodInstanceGroup] = Field(
        default=[HyperPodInstanceGroup(name="gpu", instance_type="ml.p5.48xlarge", count=0)],
        min_length=1,
    )
    eks_admin_role_arns: list[Annotated[str, Field(pattern=_ROLE_ARN)]] = Field(
        default=[], description="IAM roles that get cluster-admin access entries"
    )
    eks_public_access_cidrs: list[str] = Field(
        default=[],
        description="IPv4 CIDR blocks the EKS API's public endpoint admits (operators' kubectl "
        "from outside the VPC); none: no public endpoint. Nodes and the platform's functions use "
        "the private endpoint",
    )
    install_training_operator: bool = True
    install_hyperpod_chart: bool = Field(
        default=True,
        description="install AWS's HyperPod Helm chart before creating the HyperPod cluster "
        "(off only for an EKS cluster that has it already; an existing HyperPod cluster's "
        "owner installed it)",
    )
    nova_restricted_group: bool = Field(
        default=True,
        description="Nova-ready: add a restricted instance group 'nova' (0 nodes, ml.p5.48xlarge, "
        "FSx for Lustre 9,600 GiB at 250 MB/s/TiB, billed while it exists) where "
        "hyperpod_instance_groups has none and the region has Nova's images (not on an "
        "existing HyperPod cluster, whose groups its owner lists); false for open-weights-only "
        "deployments",
    )
    serverless_training: bool = Field(
        default=True,
        description="the serverless plane: training configs with `plane: serverless` run as "
        "SageMaker's managed multi-turn RL job (its agent Lambda, job role and checkpoint model "
        "package group; nothing billed while no run uses it); false leaves it out",
    )
    forge_cli_bundle: ForgeCliBundle | None = Field(
        default=None,
        description="{uri, sha256}: build the Nova launcher with the Forge HyperPod CLI bundle "
        "from the subscription's bucket (unset: the public release_v2 and its recipes)",
    )
    training_instance_group: str | None = Field(
        default=None,
        description="the HyperPod instance group runs scale up and down (default: the first)",
    )
    training_job_kind: JobKind = "HyperPodPyTorchJob"
    keep_warm_minutes: int = Field(
        default=0,
        ge=0,
        le=24 * 60,
        description="minutes GPU nodes stay up after the last run before scaling to zero",
    )
    model_presets: dict[str, ModelPreset] = Field(
        default={},
        description="the weights and trainer image per open-weights training-config model",
    )
    mlflow_server_size: Literal["Small", "Medium", "Large"] | None = Field(
        default=None,
        description="a SageMaker managed MLflow tracking server of this size for the deployment "
        "(every run logged there, Nova's recipes pointed at it); unset: none (it bills hourly)",
    )
    router_reserved_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="concurrent executions reserved for each of the rollout router's functions "
        "(proxy, consumer, rollout forwarder, agent Lambda): they always have it, and a runaway caller cannot "
        "take more from the account; Lambda keeps 100 of the account's quota unreserved",
    )
    reward_worker_cpu: int = 1024
    reward_worker_memory_mib: int = 2048
    alert_email: str | None = Field(default=None, pattern=_EMAIL, description="an e-mail address")
    run_artifact_retention_days: int = Field(default=180, ge=1, le=3650)
    existing_vpc: ExistingVpc | None = None
    existing_eks_cluster: ExistingEksCluster | None = None
    existing_hyperpod_cluster: ExistingHyperPodCluster | None = None

    @model_validator(mode="before")
    @classmethod
    def _nova_ready(cls, data: Any) -> Any:
        """The default restricted group, added where `nova_restricted_group` asks for it."""
        if not isinstance(data, dict):
            return data
        try:  # as the field reads it (`-c nova_restricted_group=false` arrives as text)
            wanted = TypeAdapter(bool).validate_python(data.get("nova_restricted_group", True))
        except ValidationError:
            return data  # the field's own validation names the value
        if not wanted or data.get("existing_hyperpod_cluster"):
            return data  # an existing cluster's groups are its owner's to list
        groups = data.get("hyperpod_instance_groups", cls.model_fields[
            "hyperpod_instance_groups"].default)  # fmt: skip
        if not isinstance(groups, list) or not groups or any(map(_restricted, groups)):
            return data  # the groups' own validation, or a restricted group of the user's
        if data.get("region") and data["region"] not in IMAGE_ACCOUNTS:
            return data  # `nova_notice` says why
        return {**data, "hyperpod_instance_groups": [*groups, DEFAULT_NOVA_GROUP]}

    @field_validator("vpc_cidr")
    @classmethod
    def _vpc_cidr(cls, value: str) -> str:
        network = _ipv4_block(value, "10.64.0.0/16")
        if not 16 <= network.prefixlen <= 20:
            raise ValueError("must have a prefix length between /16 and /20")
        return str(network)

    @field_validator("name_prefix")
    @classmethod
    def _name_prefix(cls, value: str) -> str:
        problem = prefix_problem(value)
        if problem:
            raise ValueError(f"{value!r} {problem}")
        return value

    @field_validator("eks_public_access_cidrs")
    @classmethod
    def _public_access_cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            _ipv4_block(cidr, "203.0.113.0/24")
        return value

    @field_validator("eks_version")
    @classmethod
    def _eks_version(cls, value: str) -> str:
        if value not in HYPERPOD_EKS_VERSIONS:
            raise ValueError(f"must be one of {', '.join(HYPERPOD_EKS_VERSIONS)}")
        return value

    @field_validator("reward_worker_cpu")
    @classmethod
    def _fargate_cpu(cls, value: int) -> int:
        if value not in FARGATE_MEMORY_BY_CPU:
            raise ValueError(f"must be one of {', '.join(map(str, FARGATE_MEMORY_BY_CPU))}")
        return value

    @field_validator("hyperpod_instance_groups")
    @classmethod
    def _unique_group_names(
        cls, groups: list[HyperPodInstanceGroup]
    ) -> list[HyperPodInstanceGroup]:
        names = [group.name for group in groups]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"instance group names must be unique, repeated: {duplicates}")
        return groups

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        memory = FARGATE_MEMORY_BY_CPU[self.reward_worker_cpu]
        if self.reward_worker_memory_mib not in memory:
            raise _key_problem(
                "reward_worker_memory_mib",
                self.reward_worker_memory_mib,
                f"with reward_worker_cpu={self.reward_worker_cpu} it must be between "
                f"{memory.start} and {memory.stop - 1} in steps of {memory.step}",
            )
        if self.availability_zones is not None:
            if len(self.availability_zones) != self.az_count:
                raise _key_problem(
                    "availability_zones",
                    self.availability_zones,
                    f"must list az_count={self.az_count} zones",
                )
            if self.region and any(
                not az.startswith(self.region) for az in self.availability_zones
            ):
                raise _key_problem(
                    "availability_zones",
                    self.availability_zones,
                    f"must be in region {self.region}",
                )
        groups = [group.name for group in self.hyperpod_instance_groups]
        if self.training_instance_group is not None and self.training_instance_group not in groups:
            raise _key_problem(
                "training_instance_group",
                self.training_instance_group,
                f"must name one of hyperpod_instance_groups ({', '.join(groups)})",
            )
        if self.training_group.restricted:
            standard = [g.name for g in self.hyperpod_instance_groups if not g.restricted]
            raise _key_problem(
                "training_instance_group",
                self.training_group.name,
                "names a restricted group, which runs Nova's images only, not this pipeline's "
                f"training job; name a standard group ({', '.join(standard) or 'add one'})",
            )
        for model in self.model_presets:
            if is_nova(model):
                raise _key_problem(
                    "model_presets",
                    model,
                    "is a Nova model: Nova trains on a restricted instance group with AWS's "
                    "launcher and Forge recipe, not a preset; remove it and add a group with "
                    "restricted: true (docs/operators/nova-on-aws.md)",
                )
        if self.nova_group is not None and self.region and self.region not in IMAGE_ACCOUNTS:
            raise _key_problem(
                "hyperpod_instance_groups",
                self.nova_group.name,
                f"is a restricted (Nova) group, and region {self.region} {NO_IMAGES}; deploy to "
                f"one of {', '.join(IMAGE_ACCOUNTS)}",
            )
        if self.existing_eks_cluster and not self.existing_vpc:
            raise _key_problem(
                "existing_eks_cluster",
                self.existing_eks_cluster.cluster_name,
                "also set existing_vpc to the cluster's VPC: HyperPod nodes and the reward "
                "workers must share it",
            )
        if self.existing_hyperpod_cluster and not self.existing_eks_cluster:
            raise _key_problem(
                "existing_hyperpod_cluster",
                self.existing_hyperpod_cluster.cluster_name,
                "also set existing_eks_cluster to the EKS cluster that orchestrates it",
            )
        return self

    @property
    def zones(self) -> list[str] | None:
        """The configured availability zones, or None to let CloudFormation pick (Fn::GetAZs)."""
        if self.existing_vpc:
            return list(self.existing_vpc.availability_zones)
        if self.availability_zones:
            return list(self.availability_zones)
        return None

    @property
    def training_group(self) -> HyperPodInstanceGroup:
        """The instance group that runs training (scaled per run)."""
        name = self.training_instance_group or self.hyperpod_instance_groups[0].name
        return next(group for group in self.hyperpod_instance_groups if group.name == name)

    @property
    def nova_notice(self) -> str | None:
        """Why a Nova-ready deployment has no restricted group (None: it has one, or was not
        asked for one)."""
        if (
            not self.nova_restricted_group
            or self.nova_group is not None
            or self.existing_hyperpod_cluster
        ):
            return None
        return (
            f"no restricted instance group for Nova: AWS's launcher as deployed (recipes "
            f"{LAUNCHER_RECIPES}) publishes Nova's RFT images in {', '.join(IMAGE_ACCOUNTS)} "
            f"only, not {self.region}; this deployment trains open-weights models (set "
            "nova_restricted_group: false to say so)"
        )

    @property
    def nova_group(self) -> HyperPodInstanceGroup | None:
        """The restricted instance group Nova runs use (the first, if there are several)."""
        return next((group for group in self.hyperpod_instance_groups if group.restricted), None)

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> PlatformConfig:
        """Build the config from CDK context, ignoring the CDK's own keys (they contain ':')."""
        ours = {key: value for key, value in context.items() if _is_config_key(key)}
        unknown = sorted(set(ours) - set(cls.model_fields))
        if unknown:
            key = unknown[0]
            hint = get_close_matches(key, list(cls.model_fields), n=1)
            suggestion = (
                f"did you mean '{hint[0]}'?" if hint else "see docs/operators/configuration.md"
            )
            raise ConfigError(f"config key '{key}' is not known: {suggestion}")
        values = {
            key: _decode(key, value, cls.model_fields[key].annotation)
            for key, value in ours.items()
        }
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise ConfigError(_describe(err, values)) from None


def _restricted(group: Any) -> bool:
    """Whether a group, as given or validated, is restricted."""
    if isinstance(group, HyperPodInstanceGroup):
        return group.restricted
    return isinstance(group, dict) and group.get("restricted") in (True, "true", "True")


def _key_problem(key: str, value: Any, allowed: str) -> ValueError:
    """A cross-field problem that still belongs to one key (pydantic reports it at the root)."""
    return ValueError(f"config key '{key}' has invalid value {_show(value)}: {allowed}")


def _is_config_key(key: str) -> bool:
    return ":" not in key and not key.startswith("@")


def _decode(key: str, value: Any, annotation: Any) -> Any:
    """`-c key=value` arrives as text: lists and objects are written as JSON."""
    if not isinstance(value, str) or annotation in (str, str | None):
        return value
    text = value.strip()
    if text in ("", "null", "none", "None") and "None" in str(annotation):
        return None
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"config key '{key}' has invalid value {value!r}: not valid JSON ({err.msg} at "
                f"character {err.pos}); write lists and objects as JSON, e.g. -c {key}='[...]'"
            ) from None
    return value


def _describe(error: ValidationError, values: Mapping[str, Any]) -> str:
    """The first problem as one line: key (with its path inside), value given, what is allowed."""
    problem = error.errors(include_url=False)[0]
    location = problem["loc"]
    message = problem["msg"].removeprefix("Value error, ")
    if not location:
        return message
    key = str(location[0]) if location else "?"
    path = key + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in location[1:]
    )
    given = problem.get("input", values.get(key))
    if problem["type"] == "string_pattern_mismatch":
        description = _field_description(location)
        message = f"must match {problem['ctx']['pattern']}" + (
            f" ({description})" if description else ""
        )
    elif problem["type"] == "extra_forbidden":
        return f"config key '{path}' is not known: remove it or check its spelling"
    return f"config key '{path}' has invalid value {_show(given)}: {message}"


def _field_description(location: tuple[Any, ...]) -> str | None:
    model: Any = PlatformConfig
    field = None
    for part in location:
        if isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return None
        field = fields[part]
        annotation = field.annotation
        inner = [a for a in getattr(annotation, "__args__", ()) if isinstance(a, type)]
        model = next((a for a in inner if issubclass(a, BaseModel)), annotation)
    return field.description if field else None


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except TypeError:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def deployment_context(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The context the CDK CLI would give the app: cdk.json, then `-c` values, then overrides.

    Under the CLI, CDK_CONTEXT_JSON already holds cdk.json merged with `-c`; run directly
    (`make synth`, tests, `mtrl config`), cdk.json is read here so all see the same values.
    """
    from_cli = os.environ.get("CDK_CONTEXT_JSON")
    context = json.loads(from_cli) if from_cli else json.loads(CDK_JSON.read_text())["context"]
    return {**context, **(overrides or {})}


def _ipv4_block(value: str, example: str) -> ipaddress.IPv4Network:
    """`value` as an IPv4 CIDR block (no host bits set), or a ValueError naming it."""
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except ValueError as err:
        raise ValueError(f"{value!r} is not an IPv4 CIDR block such as {example} ({err})") from None
