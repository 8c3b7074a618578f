"""The reward-worker plane: ECS cluster, Fargate task definition, image asset, network rules."""

from __future__ import annotations

import json
import re

from stacks.components.project_files import PROJECT_ROOT
from stacks.components.reward_fleet import WORKER_DOCKERFILE
from tests.conftest import Synthesized


def test_cluster_has_container_insights(default_app: Synthesized) -> None:
    _, cluster = default_app.one("compute", "AWS::ECS::Cluster")
    assert cluster["Properties"]["ClusterName"] == "nova-mtrl-reward-workers"
    assert {"Name": "containerInsights", "Value": "enabled"} in cluster["Properties"][
        "ClusterSettings"
    ]


def test_task_definition_sized_from_config(default_app: Synthesized) -> None:
    _, task = default_app.one("compute", "AWS::ECS::TaskDefinition")
    properties = task["Properties"]
    assert properties["RequiresCompatibilities"] == ["FARGATE"]
    assert properties["NetworkMode"] == "awsvpc"
    assert properties["Cpu"] == str(default_app.config.reward_worker_cpu)
    assert properties["Memory"] == str(default_app.config.reward_worker_memory_mib)
    (container,) = properties["ContainerDefinitions"]
    assert container["ReadonlyRootFilesystem"] is True
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"


def docker_image(app: Synthesized, dockerfile: str) -> dict:
    """The compute stack's Docker image asset built from `dockerfile`."""
    manifest = json.loads((app.outdir / "nova-mtrl-compute.assets.json").read_text())
    (image,) = [
        image
        for image in manifest["dockerImages"].values()
        if image["source"]["dockerFile"] == dockerfile
    ]
    return image


def test_worker_image_is_a_docker_asset_built_at_deploy_time(default_app: Synthesized) -> None:
    image = docker_image(default_app, WORKER_DOCKERFILE)
    assert image["source"]["platform"] == "linux/amd64"
    assert (PROJECT_ROOT / WORKER_DOCKERFILE).is_file()
    _, task = default_app.one("compute", "AWS::ECS::TaskDefinition")
    reference = json.dumps(task["Properties"]["ContainerDefinitions"][0]["Image"])
    assert "container-assets" in reference


def test_the_image_context_holds_only_what_the_dockerfile_copies(default_app: Synthesized) -> None:
    """build/, runs/ and caches beside the code would bloat the context and change the hash
    (a new image and task definition on every deploy)."""
    image = docker_image(default_app, WORKER_DOCKERFILE)
    context = default_app.outdir / image["source"]["directory"]
    assert sorted(entry.name for entry in context.iterdir()) == ["domain", "reward_envs"]
    assert not list(context.rglob("__pycache__"))
    copied = re.findall(r"^COPY (\w+) ", (context / WORKER_DOCKERFILE).read_text(), re.M)
    assert sorted(copied) == ["domain", "reward_envs"]


def test_workers_accept_no_inbound_traffic(default_app: Synthesized) -> None:
    groups = [
        group
        for logical_id, group in default_app.resources("compute", "AWS::EC2::SecurityGroup").items()
        if "RewardFleet" in logical_id
    ]
    (group,) = groups
    assert "SecurityGroupIngress" not in group["Properties"]
    (egress,) = group["Properties"]["SecurityGroupEgress"]
    assert (egress["FromPort"], egress["ToPort"], egress["IpProtocol"]) == (443, 443, "tcp")
