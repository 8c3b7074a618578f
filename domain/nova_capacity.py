"""How many nodes a Nova job takes, from the chart AWS's launcher installs for it.

Source: aws/sagemaker-hyperpod-recipes at 0700d22 (the launcher the launcher function runs;
the same at 2631995), `launcher/nova/k8s_templates/RFT/` — `values.yaml` (each service's
resource requests) and `templates/*.yaml` (placement) — and `launcher/nova/launchers.py`
(`SMNovaK8SLauncherRFT`: which recipe key sets which service's replicas):

- the trainer (a Kubeflow PyTorchJob, `run.replicas` pods) and vLLM (`run.generation_replicas`
  pods) each ask 8 GPUs a pod: a whole ml.p5.48xlarge;
- the CPU services — hub (`run.rollout_worker_replicas` pods), prompter, RBS, three NATS servers,
  and Redis when the recipe delegates its rollouts — may not share a node with a GPU pod of the
  job (a required pod anti-affinity both ways, on `kubernetes.io/hostname`), so they need nodes
  of their own; they prefer each other's nodes and pack by their CPU and memory requests.

A node holds at most an ml.p5.48xlarge's 192 vCPUs and 2,048 GiB (Amazon EC2 P5 instances);
what the kubelet and daemon sets keep is not subtracted, so the count is the least that can
work. The user guide's BYOO recipe (4 training, 2 generation replicas, 1 rollout worker) comes
to 8 nodes: the minimum the Nova user guide's compute table gives for RFT on HyperPod.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# AWS's minimum for RFT on SageMaker HyperPod (Nova 2 user guide, "Amazon Nova customization on
# SageMaker HyperPod", compute requirements for Amazon Nova 2 models: 8 × P5.48xlarge, 64 GPUs).
DOCUMENTED_MINIMUM_NODES = 8
NODE_CPUS = 192.0  # ml.p5.48xlarge
NODE_MEMORY_GIB = 2048.0


@dataclass(frozen=True)
class CpuService:
    """A CPU-only service of the chart: its pods' requests (values.yaml)."""

    name: str
    cpus: float
    memory_gib: float
    replicas: int = 1


HUB = CpuService("hub", cpus=90, memory_gib=720)
CHART_SERVICES = (
    CpuService("prompter", cpus=5, memory_gib=369),
    CpuService("rbs", cpus=85, memory_gib=369),
    CpuService("nats-server", cpus=30, memory_gib=256, replicas=3),
)
REDIS = CpuService("redis", cpus=0.5, memory_gib=2)  # only when rollout.delegate is true


@dataclass(frozen=True)
class JobNodes:
    """The nodes one Nova job takes, by what runs on them."""

    training: int
    generation: int
    services: int

    @property
    def total(self) -> int:
        return self.training + self.generation + self.services


def service_nodes(*, rollout_workers: int, delegate: bool = True) -> int:
    """The nodes the job's CPU services need: their pods, largest first, each on the first node
    with room for its CPU and memory requests."""
    services = (
        replace(HUB, replicas=rollout_workers),
        *CHART_SERVICES,
        *((REDIS,) if delegate else ()),
    )
    pods = sorted(
        ((s.cpus, s.memory_gib) for s in services for _ in range(s.replicas)), reverse=True
    )
    free: list[list[float]] = []
    for cpus, memory in pods:
        node = next((n for n in free if n[0] >= cpus and n[1] >= memory), None)
        if node is None:
            node = [NODE_CPUS, NODE_MEMORY_GIB]
            free.append(node)
        node[0] -= cpus
        node[1] -= memory
    return len(free)
