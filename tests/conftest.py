"""Shared synthesized apps: synth is slow the first time in a process, so each variant is built once.

Every synth here runs with no AWS credentials and no Docker engine reachable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from moto import mock_aws

os.environ["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = "20"
for _name in [name for name in os.environ if name.startswith("AWS_") or name.startswith("CDK_")]:
    del os.environ[_name]
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent/credentials"
os.environ["AWS_CONFIG_FILE"] = "/nonexistent/config"
os.environ["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"

import aws_cdk as cdk  # noqa: E402

from stacks.app_builder import build_app  # noqa: E402
from stacks.config import CDK_JSON, PlatformConfig  # noqa: E402
from tests.kubernetes.fake_api import FakeKubernetes, serving  # noqa: E402

NO_BUNDLING = {"aws:cdk:bundling-stacks": []}

# Property tests draw the same examples on every run (a seed fixed by the test's name), so a
# result never depends on the day: an unseeded run once drew a generator's verdict share just
# outside its bounds.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.load_profile("deterministic")

# The deployed world's open-weights preset reads its Hub token from this secret (nova_app).
HUB_TOKEN_SECRET = "nova-mtrl/hugging-face-token"
# An account-pinned deployment with a Nova restricted instance group beside the GPU group.
NOVA_GROUP = {
    "name": "nova", "instance_type": "ml.p5.48xlarge", "count": 0, "restricted": True,
    "fsx": {"size_gib": 2400, "per_unit_storage_throughput": 250},
}  # fmt: skip
PINNED = {
    "region": "us-east-1",
    "account": "111122223333",
    "az_count": 3,
    "hyperpod_instance_groups": json.dumps(
        [{"name": "gpu", "instance_type": "ml.p5.48xlarge", "count": 0}, NOVA_GROUP]
    ),
    "training_instance_group": "gpu",
}

EXISTING = {
    "region": "us-west-2",
    "account": "111122223333",
    "existing_vpc": {
        "vpc_id": "vpc-0123456789abcdef0",
        "availability_zones": ["us-west-2a", "us-west-2b"],
        "private_subnet_ids": ["subnet-0aaaaaaaaaaaaaaa1", "subnet-0aaaaaaaaaaaaaaa2"],
        "public_subnet_ids": ["subnet-0bbbbbbbbbbbbbbb1", "subnet-0bbbbbbbbbbbbbbb2"],
    },
    "existing_eks_cluster": {
        "cluster_name": "team-eks",
        "security_group_id": "sg-0123456789abcdef0",
    },
}

EXISTING_HYPERPOD = {**EXISTING, "existing_hyperpod_cluster": {"cluster_name": "team-hyperpod"}}

ADMIN_ROLE = "arn:aws:iam::111122223333:role/platform-admins"


@dataclass
class Synthesized:
    config: PlatformConfig
    templates: dict[str, dict[str, Any]]
    outdir: Path
    # (construct path, cdk-nag finding, reason) for every acknowledgment in the app.
    acknowledgments: list[tuple[str, str, str]]

    def has(self, part: str) -> bool:
        return f"{self.config.name_prefix}-{part}" in self.templates

    def template(self, part: str) -> dict[str, Any]:
        return self.templates[f"{self.config.name_prefix}-{part}"]

    def resources(self, part: str, resource_type: str) -> dict[str, dict[str, Any]]:
        return {
            logical_id: resource
            for logical_id, resource in self.template(part)["Resources"].items()
            if resource["Type"] == resource_type
        }

    def one(self, part: str, resource_type: str) -> tuple[str, dict[str, Any]]:
        found = self.resources(part, resource_type)
        assert len(found) == 1, f"expected one {resource_type} in {part}, found {sorted(found)}"
        return next(iter(found.items()))


def handler_of(function: dict[str, Any]) -> str:
    """A function's handler: its Handler, or an image function's command (the Nova launcher)."""
    properties = function["Properties"]
    return properties.get("Handler") or properties["ImageConfig"]["Command"][0]


def synthesize(context: dict[str, Any], outdir: Path) -> Synthesized:
    app, config = build_app({**NO_BUNDLING, **context}, outdir=str(outdir))
    assembly = app.synth()
    templates = {stack.stack_name: stack.template for stack in assembly.stacks}
    return Synthesized(
        config=config, templates=templates, outdir=outdir, acknowledgments=acknowledgments(app)
    )


def acknowledgments(app: cdk.App) -> list[tuple[str, str, str]]:
    key = cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY
    return [
        (construct.node.path, finding.removeprefix("AwsSolutions::"), reason)
        for construct in app.node.find_all()
        for entry in construct.node.metadata
        if entry.type == key
        for finding, reason in entry.data.items()
        if finding.startswith("AwsSolutions::")
    ]


@pytest.fixture(scope="session")
def default_app(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The app exactly as cdk.json configures it (environment-agnostic)."""
    return synthesize({}, tmp_path_factory.mktemp("default"))


@pytest.fixture(scope="session")
def open_weights_app(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """cdk.json's deployment without the Nova-ready restricted group (nova_restricted_group
    false): open-weights models only."""
    return synthesize({"nova_restricted_group": False}, tmp_path_factory.mktemp("open-weights"))


@pytest.fixture(scope="session")
def nova_app(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """cdk.json's deployment with a Nova restricted group beside its GPU group, a managed
    MLflow tracking server, and its open-weights preset's Hub token in a secret (as a gated
    model's is; environment-agnostic): the deployed world's (tests/iam/)."""
    shipped = json.loads(CDK_JSON.read_text())["context"]
    presets = {
        name: {**preset, "hub_token_secret": HUB_TOKEN_SECRET}
        for name, preset in shipped["model_presets"].items()
    }
    context = {
        "hyperpod_instance_groups": json.dumps([*shipped["hyperpod_instance_groups"], NOVA_GROUP]),
        "mlflow_server_size": "Small",
        "model_presets": json.dumps(presets),
    }
    return synthesize(context, tmp_path_factory.mktemp("nova"))


@pytest.fixture(scope="session")
def pinned_app(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """An environment-specific deployment: account, region, three zones, an admin role, GPU
    nodes kept warm for half an hour."""
    return synthesize(
        {**PINNED, "eks_admin_role_arns": [ADMIN_ROLE], "keep_warm_minutes": 30},
        tmp_path_factory.mktemp("pinned"),
    )


@pytest.fixture(scope="session")
def existing_app(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """Deployed into an existing VPC and EKS cluster; HyperPod created by us."""
    return synthesize(EXISTING, tmp_path_factory.mktemp("existing"))


@pytest.fixture(scope="session")
def existing_hyperpod_app(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """Everything expensive already exists: VPC, EKS and HyperPod are referenced, not created."""
    return synthesize(EXISTING_HYPERPOD, tmp_path_factory.mktemp("existing-hyperpod"))


@pytest.fixture(scope="session")
def every_app(
    default_app: Synthesized,
    pinned_app: Synthesized,
    existing_app: Synthesized,
    existing_hyperpod_app: Synthesized,
) -> dict[str, Synthesized]:
    return {
        "default": default_app,
        "pinned": pinned_app,
        "existing": existing_app,
        "existing-hyperpod": existing_hyperpod_app,
    }


@pytest.fixture
def api() -> Iterator[FakeKubernetes]:
    """A Kubernetes API server (tests/kubernetes/fake_api.py) that accepts its TOKEN."""
    with serving() as fake:
        yield fake


@pytest.fixture
def no_aws_setup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A machine with no AWS region, credentials or profiles anywhere boto3 looks."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto's AWS for the test, with dummy credentials in us-east-1."""
    for key, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


def policy_statements(template: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every IAM policy statement in a template (policies and roles' inline policies)."""
    for logical_id, resource in template["Resources"].items():
        properties = resource.get("Properties", {})
        documents = []
        if resource["Type"] == "AWS::IAM::Policy":
            documents.append(properties["PolicyDocument"])
        if resource["Type"] == "AWS::IAM::Role":
            documents.extend(policy["PolicyDocument"] for policy in properties.get("Policies", []))
        for document in documents:
            for statement in document["Statement"]:
                yield logical_id, statement


def role_statements(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    """The statements of every policy attached to one role (attached policies and inline ones)."""
    statements = []
    for logical_id, statement in policy_statements(template):
        resource = template["Resources"][logical_id]
        if logical_id == role_id or {"Ref": role_id} in resource["Properties"].get("Roles", []):
            statements.append(statement)
    return statements


def statements_of_role(template: dict[str, Any], mark: str) -> list[dict[str, Any]]:
    """The statements of the policies attached to the role whose reference in the template holds
    `mark` (a logical id, or the export a role of another stack comes through)."""
    return [
        statement
        for logical_id, statement in policy_statements(template)
        if mark in dumps(template["Resources"][logical_id]["Properties"].get("Roles", []))
    ]


def arn_text(resource: object) -> str:
    """An ARN as the template builds it, references shown as {Name} (`Fn::Join`s joined)."""
    if isinstance(resource, dict) and "Fn::Join" in resource:
        separator, parts = resource["Fn::Join"]
        return separator.join(arn_text(part) for part in parts)
    if isinstance(resource, dict) and "Ref" in resource:
        return "{" + resource["Ref"].removeprefix("AWS::") + "}"
    return str(resource)


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


@pytest.fixture(scope="session")
def openenv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Real OpenEnv servers (tests/reward_envs/openenv_servers.py): each kind's base URL."""
    from tests.reward_envs.openenv_servers import openenv_servers

    with openenv_servers(tmp_path_factory.mktemp("openenv")) as urls:
        yield dict(urls)
