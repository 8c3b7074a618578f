"""AWS's HyperPod Helm chart, as this deployment installs it: which commit, which parts, and what
its rendering must hold before anything is applied.

Sources:
- SageMaker docs, "Installing packages on the Amazon EKS cluster using Helm": the chart
  (aws/sagemaker-hyperpod-cli, `helm_chart/HyperPodHelmChart`) is required and goes in before
  the HyperPod cluster is created; release `hyperpod-dependencies` in `kube-system`; the
  `aws-hyperpod` namespace cannot change.
- AWS's own HyperPod cluster stack (PyPI `hyperpod-cluster-stack-template` 1.0.2,
  `creation_template.yaml`, parameter `HelmOperators`): the parts AWS turns on — the health
  monitoring agent, deep health check, job auto-restart, HyperPod patching and the device
  plugins among them.
- Restricted instance groups (Nova's): AWS's RIG dependencies (aws/sagemaker-hyperpod-cli
  `release_v2`, `helm_chart/install_rig_dependencies.sh` and `HyperPodHelmChartForRIG/
  values.yaml`, README "Step Four"): RIG nodes carry the label
  `sagemaker.amazonaws.com/instance-group-type: Restricted` and the taint
  `sagemaker.amazonaws.com/RestrictedNode=Worker:NoSchedule`; the device plugins must tolerate
  it (AWS runs a copy of the NVIDIA plugin there and patches the EFA plugin to tolerate it, its
  image from the cluster's own region), and the Kubeflow training operator tolerates it while
  preferring other nodes.
- The device plugins' own documentation for the resources they advertise: NVIDIA's
  k8s-device-plugin (`nvidia.com/gpu`), AWS's EFA plugin (`vpc.amazonaws.com/efa`), AWS Neuron's
  device plugin (`aws.amazon.com/neuron`, `aws.amazon.com/neuroncore`, `aws.amazon.com/neurondevice`).
"""

from __future__ import annotations

import base64
import copy
import enum
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from domain.kubernetes_kinds import KINDS
from domain.presets import ACCELERATORS
from domain.rig_addons import OFF_RESTRICTED, RESTRICTED_TAINT, tolerate_restricted

REPOSITORY = "https://github.com/aws/sagemaker-hyperpod-cli.git"
# Pinned: a chart change reaches a deployment only through a commit here (2026-06-22).
COMMIT = "011ca927123e02b35a399935bbb3ab1905fe33c7"
CHART_PATH = "helm_chart/HyperPodHelmChart"
RELEASE = "hyperpod-dependencies"
NAMESPACE = "kube-system"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
KUBEFLOW_PYTORCH_JOBS = "pytorchjobs.kubeflow.org"
# The chart's Kubeflow training operator (charts/training-operators, its Deployment's label).
TRAINING_OPERATOR_LABEL = ("control-plane", "kubeflow-training-operator")


class Part(enum.Enum):
    """A part of the chart this deployment relies on, found in the rendering by its image."""

    NVIDIA = ("nvidia-device-plugin", "k8s-device-plugin", ("nvidia.com/gpu",))
    EFA = ("aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin", ("vpc.amazonaws.com/efa",))
    NEURON = (
        "neuron-device-plugin",
        "neuron-device-plugin",
        ("aws.amazon.com/neuron", "aws.amazon.com/neuroncore", "aws.amazon.com/neurondevice"),
    )
    HEALTH_AGENT = ("health-monitoring-agent", "hyperpod-health-monitoring-agent", ())

    def __init__(self, values_key: str, image: str, advertises: tuple[str, ...]) -> None:
        self.values_key = values_key
        self.image = image  # a DaemonSet with a container of this image name is the part
        self.advertises = advertises


DEVICE_PLUGINS = (Part.NVIDIA, Part.EFA, Part.NEURON)
# Installed elsewhere: cert-manager and the HyperPod training operator are EKS add-ons
# (stacks/components/eks.py); the rest is not used by the platform.
_OFF = (
    "cert-manager",
    "mlflow",
    "mpi-operator",
    "inferenceOperators",
    "storage",
    "gpu-operator",
    "cluster-role-and-bindings",
    "namespaced-role-and-bindings",
    "team-role-and-bindings",
)
# What AWS's cluster stack turns on for HyperPod's resilience, always.
_ON = ("health-monitoring-agent", "deep-health-check", "job-auto-restart", "hyperpod-patching")


def is_nvidia(instance_type: str) -> bool:
    return instance_type.startswith(("ml.p", "ml.g"))


def is_neuron(instance_type: str) -> bool:
    return instance_type.startswith(("ml.trn", "ml.inf"))


def parts_needed(instance_type: str) -> set[Part]:
    """The chart parts a node of this type needs: its accelerator's device plugin, EFA where
    the platform's pods ask for EFA interfaces on it, and the health agent on accelerators."""
    needed: set[Part] = set()
    if is_nvidia(instance_type):
        needed |= {Part.NVIDIA, Part.HEALTH_AGENT}
    if is_neuron(instance_type):
        needed |= {Part.NEURON, Part.HEALTH_AGENT}
    if ACCELERATORS.get(instance_type, (0, 0))[1] > 0 or is_neuron(instance_type):
        needed.add(Part.EFA)
    return needed


@dataclass(frozen=True)
class ChartRequest:
    """What the deploy-time rendering needs (stacks/render_hyperpod_chart.py)."""

    kube_version: str
    region: str | None  # None: the deploying machine's default region
    instance_types: tuple[str, ...]
    kubeflow_training_operator: bool
    restricted_instance_types: tuple[str, ...] = ()  # of the restricted groups (also above)

    def values(self, region: str) -> dict[str, Any]:
        """Helm values: only what this deployment needs, everything else off."""
        needed = set().union(*(parts_needed(t) for t in self.instance_types))
        values: dict[str, Any] = {
            # `helm template` has no cluster to look the region up in: the health agent's image
            # comes from a registry per region, so the region is given.
            "global": {"region": region},
            "trainingOperators": {"enabled": self.kubeflow_training_operator},
        }
        values |= {key: {"enabled": False} for key in _OFF}
        values |= {key: {"enabled": True} for key in _ON}
        for plugin in DEVICE_PLUGINS:
            values[plugin.values_key] = {"devicePlugin": {"enabled": plugin in needed}}
        return values

    def encode(self) -> str:
        """One command-line argument that no shell splits or expands (base64url of JSON): some
        CDK CLI versions run asset executables through a shell."""
        data = {
            "kube_version": self.kube_version,
            "region": self.region,
            "instance_types": list(self.instance_types),
            "kubeflow_training_operator": self.kubeflow_training_operator,
            "restricted_instance_types": list(self.restricted_instance_types),
        }
        return base64.urlsafe_b64encode(json.dumps(data, sort_keys=True).encode()).decode()

    @classmethod
    def decode(cls, argument: str) -> ChartRequest:
        data = json.loads(base64.urlsafe_b64decode(argument.encode()))
        return cls(
            kube_version=data["kube_version"],
            region=data["region"],
            instance_types=tuple(data["instance_types"]),
            kubeflow_training_operator=data["kubeflow_training_operator"],
            restricted_instance_types=tuple(data["restricted_instance_types"]),
        )


def admit_restricted_nodes(objects: list[dict[str, Any]], *, region: str) -> list[dict[str, Any]]:
    """The rendering as AWS's RIG dependencies change it for restricted groups: the device
    plugins tolerate the RIG taint (the EFA plugin's image from `region`'s registry, as RIG
    nodes pull it), the training operator tolerates it and prefers nodes of other groups."""
    plugins = {part.image for part in DEVICE_PLUGINS}
    admitted = []
    for obj in objects:
        if obj.get("kind") == "DaemonSet" and _image_names(obj) & plugins:
            obj = _tolerating(obj)
            if Part.EFA.image in _image_names(obj):
                obj = _efa_image_from(obj, region)
        elif obj.get("kind") == "Deployment" and _labelled(obj, TRAINING_OPERATOR_LABEL):
            obj = _tolerating(obj)
            affinity = obj["spec"]["template"]["spec"].setdefault("affinity", {})
            preferred = affinity.setdefault("nodeAffinity", {}).setdefault(
                "preferredDuringSchedulingIgnoredDuringExecution", []
            )
            elsewhere = {
                "weight": 100,
                "preference": {"matchExpressions": [copy.deepcopy(OFF_RESTRICTED)]},
            }
            if elsewhere not in preferred:
                preferred.append(elsewhere)
        admitted.append(obj)
    return admitted


def _tolerating(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of the workload whose pods tolerate the RIG taint."""
    copied = json.loads(json.dumps(obj))
    tolerate_restricted(copied["spec"]["template"]["spec"])
    return copied


def _efa_image_from(daemonset: dict[str, Any], region: str) -> dict[str, Any]:
    for container in daemonset["spec"]["template"]["spec"]["containers"]:
        if _image_name(container.get("image", "")) == Part.EFA.image:
            container["image"] = re.sub(
                r"\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com", f".dkr.ecr.{region}.amazonaws.com",
                container["image"],
            )  # fmt: skip
    return daemonset


def _labelled(obj: dict[str, Any], label: tuple[str, str]) -> bool:
    return (obj.get("metadata", {}).get("labels") or {}).get(label[0]) == label[1]


def _tolerates_restricted(workload: dict[str, Any]) -> bool:
    spec = workload.get("spec", {}).get("template", {}).get("spec", {})
    return RESTRICTED_TAINT in (spec.get("tolerations") or []) or any(
        t.get("operator") == "Exists" and not t.get("key") for t in spec.get("tolerations") or []
    )


class RenderingError(ValueError):
    """The chart's rendering lacks something this deployment needs (the message says what)."""


def check_rendering(objects: list[dict[str, Any]], request: ChartRequest) -> None:
    """Every object is of a kind our client can apply; every part the instance types need is a
    DaemonSet that schedules on them. Raises RenderingError naming each problem and its fix."""
    problems = [
        f"{obj.get('kind')} {obj.get('metadata', {}).get('name')} ({obj.get('apiVersion')}): a "
        "kind domain/kubernetes_kinds.py does not know; add it to KINDS"
        for obj in objects
        if (obj.get("apiVersion"), obj.get("kind")) not in KINDS
    ]
    if request.kubeflow_training_operator and not any(
        obj.get("kind") == "CustomResourceDefinition"
        and obj.get("metadata", {}).get("name") == KUBEFLOW_PYTORCH_JOBS
        for obj in objects
    ):
        problems.append(
            f"no CustomResourceDefinition {KUBEFLOW_PYTORCH_JOBS}: the jobs of "
            "training_job_kind PyTorchJob need Kubeflow's training operator and its CRDs"
        )
    daemonsets = [obj for obj in objects if obj.get("kind") == "DaemonSet"]
    for instance_type in request.instance_types:
        for part in sorted(parts_needed(instance_type), key=lambda p: p.name):
            found = [ds for ds in daemonsets if part.image in _image_names(ds)]
            if not found:
                problems.append(
                    f"no {part.values_key} DaemonSet in the chart, needed on {instance_type}"
                )
            elif not any(_schedules_on(ds, instance_type) for ds in found):
                problems.append(
                    f"the chart's {part.values_key} does not run on {instance_type} (its node "
                    "affinity leaves it out): pick a supported instance type or pin a chart "
                    "commit that supports it in stacks/hyperpod_chart.py"
                )
            elif (
                instance_type in request.restricted_instance_types
                and part in DEVICE_PLUGINS
                and not any(
                    _schedules_on(ds, instance_type) and _tolerates_restricted(ds) for ds in found
                )
            ):
                problems.append(
                    f"the chart's {part.values_key} does not tolerate the restricted group's "
                    f"taint on {instance_type}: see admit_restricted_nodes"
                )
    if problems:
        raise RenderingError(
            f"the HyperPod Helm chart at {COMMIT[:12]} cannot serve this deployment:\n  "
            + "\n  ".join(problems)
        )


def advertised(instance_types: Iterable[str]) -> set[str]:
    """The extended resources the installed plugins make nodes of these types advertise."""
    return {
        resource
        for instance_type in instance_types
        for part in parts_needed(instance_type)
        for resource in part.advertises
    }


def _image_names(daemonset: dict[str, Any]) -> set[str]:
    """The containers' image names without registry, path and tag: `nvcr.io/nvidia/
    k8s-device-plugin:v0.16.1` is `k8s-device-plugin` (not the EFA plugin's
    `aws-efa-k8s-device-plugin`, which ends the same)."""
    spec = daemonset.get("spec", {}).get("template", {}).get("spec", {})
    return {_image_name(c.get("image", "")) for c in spec.get("containers", [])}


def _image_name(image: str) -> str:
    return image.split("@")[0].rsplit("/", 1)[-1].split(":")[0]


def _schedules_on(daemonset: dict[str, Any], instance_type: str) -> bool:
    """Whether the DaemonSet's required node affinity admits nodes of `instance_type` (any
    term matching; a term's instance-type expressions all matching)."""
    spec = daemonset.get("spec", {}).get("template", {}).get("spec", {})
    required = (
        (spec.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if not required:
        return True
    return any(_term_admits(term, instance_type) for term in required["nodeSelectorTerms"])


def _term_admits(term: dict[str, Any], instance_type: str) -> bool:
    for expression in term.get("matchExpressions", []):
        if expression["key"] != INSTANCE_TYPE_LABEL:
            continue
        values = expression.get("values", [])
        operator = expression["operator"]
        if operator == "In" and instance_type not in values:
            return False
        if operator == "NotIn" and instance_type in values:
            return False
        if operator == "DoesNotExist":
            return False
    return True
