"""The nodes of a Nova job, from the chart AWS's launcher installs (domain/nova_capacity.py).

Sources: aws/sagemaker-hyperpod-recipes at 0700d22 (and unchanged at 2631995),
launcher/nova/k8s_templates/RFT/values.yaml and templates/; the Nova 2 user guide, "Amazon Nova
customization on SageMaker HyperPod", compute requirements for Amazon Nova 2 models: "RFT on
SageMaker HyperPod | 8 | P5.48xlarge | 64"."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from domain.nova_capacity import (
    CHART_SERVICES,
    DOCUMENTED_MINIMUM_NODES,
    HUB,
    NODE_CPUS,
    NODE_MEMORY_GIB,
    REDIS,
    JobNodes,
    service_nodes,
)
from domain.nova_job import NovaRefused, job_layout, nova_problems, recipe_overrides
from tests.forge_recipe import documented_byoo_recipe
from training_configs.schema import SHIPPED, load_training_config, parse_training_config

# values.yaml, trainingConfig.<service>.resources.requests (cpu, memory) and replicas.
CHART_REQUESTS = {
    "hub": ("90", "720Gi", 1),
    "prompter": ("5", "369Gi", 1),
    "rbs": ("85", "369Gi", 1),
    "nats-server": ("30", "256Gi", 3),
    "redis": ("500m", "2Gi", 1),
}


def _cpus(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_the_cpu_services_are_the_charts_requests() -> None:
    ours = {s.name: (s.cpus, s.memory_gib, s.replicas) for s in (HUB, *CHART_SERVICES, REDIS)}
    assert ours == {
        name: (_cpus(cpu), float(memory.removesuffix("Gi")), replicas)
        for name, (cpu, memory, replicas) in CHART_REQUESTS.items()
    }


def test_the_documented_byoo_layout_takes_the_compute_tables_minimum() -> None:
    """The user guide's recipe (replicas 4, generation_replicas 2, rollout_worker_replicas 1):
    its GPU pods take 6 nodes; the CPU services (270.5 vCPUs, 2,228 GiB) do not fit one
    ml.p5.48xlarge, so 2 more — 8, the compute table's minimum for RFT on HyperPod."""
    run = documented_byoo_recipe()["run"]
    nodes = JobNodes(
        training=run["replicas"],
        generation=run["generation_replicas"],
        services=service_nodes(rollout_workers=run["rollout_worker_replicas"]),
    )
    assert (nodes.training, nodes.generation, nodes.services) == (4, 2, 2)
    assert nodes.total == DOCUMENTED_MINIMUM_NODES == 8
    requests = [(s.cpus * s.replicas, s.memory_gib * s.replicas) for s in (HUB, *CHART_SERVICES)]
    cpus = sum(c for c, _ in requests) + REDIS.cpus
    assert cpus > NODE_CPUS and sum(m for _, m in requests) > NODE_MEMORY_GIB


@pytest.mark.parametrize(("workers", "nodes"), [(1, 2), (2, 2), (3, 3), (4, 3), (8, 5)])
def test_more_rollout_workers_need_more_service_nodes(workers: int, nodes: int) -> None:
    assert service_nodes(rollout_workers=workers) == nodes
    # Every node's pods fit it: no fewer nodes could hold the hub pods alone by CPU.
    assert nodes >= -(-(workers * HUB.cpus) // NODE_CPUS)


def test_without_delegation_redis_is_not_counted() -> None:
    assert service_nodes(rollout_workers=1, delegate=False) == 2
    # 2 hubs fill 180 vCPUs of one node; RBS, 3 NATS, the prompter 180 of the other: Redis's
    # half vCPU still fits, a third hub does not.
    assert service_nodes(rollout_workers=2) == 2


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_configs_fit_the_chart(name: str) -> None:
    config = load_training_config(name)
    assert nova_problems(config) == []
    layout = job_layout(config)
    assert layout.total == config.instance_count >= DOCUMENTED_MINIMUM_NODES
    assert layout.services == 2 and layout.generation == config.generation_replicas


def test_the_four_node_layout_is_refused_with_the_least_that_fits() -> None:
    """Two vLLM and two training nodes leave the chart's CPU services nowhere to go: its pods
    would stay Pending after the nodes were paid for."""
    text = yaml.safe_dump(
        yaml.safe_load(load_training_config_text("rft_multiturn_lora")) | {"instance_count": 4}
    )
    config = parse_training_config(text)
    (problem,) = nova_problems(config)
    assert problem == (
        "instance_count 4 leaves 0 training replicas beside the 2 generation replicas (a node "
        "each) and the 2 nodes AWS's chart needs for its CPU services (hub, prompter, RBS, NATS, "
        "Redis); Nova's recipe takes 2, 4, 6, 8 training replicas: set instance_count to one of "
        "6, 8, 10, 12 (at least 6)"
    )
    with pytest.raises(NovaRefused, match="instance_count 4 leaves 0 training replicas"):
        recipe_overrides(config, name="n", data_s3_path="d", output_s3_path="o", byoo={})


def test_more_rollout_workers_move_the_least_that_fits() -> None:
    raw = yaml.safe_load(load_training_config_text("rft_multiturn_lora"))
    config = parse_training_config(yaml.safe_dump(raw | {"nova": {"rollout_worker_replicas": 3}}))
    (problem,) = nova_problems(config)
    assert problem.endswith("set instance_count to one of 7, 9, 11, 13 (at least 7)")
    assert job_layout(config.model_copy(update={"instance_count": 9})).training == 4


def load_training_config_text(name: str) -> str:
    return resources.files("training_configs").joinpath(f"{name}.yaml").read_text()
