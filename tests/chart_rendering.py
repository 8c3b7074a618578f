"""A rendering of AWS's HyperPod Helm chart shaped as `helm template` gives it at the pinned
commit (stacks/hyperpod_chart.py COMMIT), for the parts the tests need: the objects of
`charts/health-monitoring-agent/templates/health-monitoring-agent.yaml` and
`charts/deep-health-check/templates/aws-hyperpod-namespace.yaml`, and one DaemonSet per device
plugin with the instance-type affinity the umbrella chart's values.yaml gives it (lists cut
to a few types each, among them the ones the tests deploy)."""

from __future__ import annotations

from typing import Any

import yaml

RBAC = "rbac.authorization.k8s.io/v1"
HEALTH_IMAGE = "767398015722.dkr.ecr.us-east-1.amazonaws.com/hyperpod-health-monitoring-agent:1.0.1892.0_1.0.424.0"
IMAGES = {
    "nvidia-device-plugin": "nvcr.io/nvidia/k8s-device-plugin:v0.16.1",
    "aws-efa-k8s-device-plugin": "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.6",
    "neuron-device-plugin": "public.ecr.aws/neuron/neuron-device-plugin:2.19.16.0",
}
AFFINITY = {
    "health-monitoring-agent": ["ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.g5.12xlarge"],
    "nvidia-device-plugin": ["ml.g5.12xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge"],
    "aws-efa-k8s-device-plugin": ["ml.g5.12xlarge", "ml.p5.48xlarge", "ml.trn1.32xlarge"],
    "neuron-device-plugin": ["ml.trn1.32xlarge", "ml.trn2.48xlarge"],
}


def _daemonset(
    name: str, namespace: str | None, image: str, types: list[str] | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": name, "image": image}]}
    if types is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": types}
            ]}]
        }}}  # fmt: skip
    metadata: dict[str, Any] = {"name": name, "labels": {"app": name}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def rendering(
    *,
    plugins: tuple[str, ...] = ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"),
    affinity: dict[str, list[str]] | None = None,
    kubeflow: bool = False,
) -> list[dict[str, Any]]:
    """The objects, as `helm template` prints them (namespaced ones may name no namespace);
    `kubeflow`: with the training operator (its Deployment and PyTorchJob CRD)."""
    types = {**AFFINITY, **(affinity or {})}
    agent = "health-monitoring-agent"
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "aws-hyperpod"}},
        {"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": agent},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": agent, "namespace": "aws-hyperpod"}},
        {"apiVersion": RBAC, "kind": "ClusterRoleBinding",
         "metadata": {"name": agent, "namespace": "aws-hyperpod"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": agent},
         "subjects": [{"kind": "ServiceAccount", "name": agent, "namespace": "aws-hyperpod"}]},
        _daemonset(agent, "aws-hyperpod", HEALTH_IMAGE, types[agent]),
    ]  # fmt: skip
    for plugin in plugins:
        # The device plugins' own charts leave the namespace to the release.
        objects.append(
            _daemonset(f"hyperpod-dependencies-{plugin}", None, IMAGES[plugin], types[plugin])
        )
    if kubeflow:
        # charts/training-operators/templates/kubeflow-namespace.yaml (createNamespace: true)
        kubeflow_namespace = {"apiVersion": "v1", "kind": "Namespace",
                              "metadata": {"name": "kubeflow"}}  # fmt: skip
        objects += [kubeflow_namespace, KUBEFLOW_CRD, TRAINING_OPERATOR]
    return objects


KUBEFLOW_CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "pytorchjobs.kubeflow.org"}}  # fmt: skip


# charts/training-operators/templates/Deployment/training-operator-kubeflow-Deployment.yaml,
# rendered for release hyperpod-dependencies with the subchart's values (cut to what matters).
TRAINING_OPERATOR = {
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "hyperpod-dependencies-training-operators", "namespace": "kubeflow",
                 "labels": {"control-plane": "kubeflow-training-operator"}},
    "spec": {"replicas": 1,
             "selector": {"matchLabels": {"control-plane": "kubeflow-training-operator"}},
             "template": {"metadata": {"labels": {"control-plane": "kubeflow-training-operator"}},
                          "spec": {"containers": [{"name": "training-operator",
                                                   "image": "kubeflow/training-operator:v1-855e096",
                                                   "command": ["/manager"]}],
                                   "serviceAccountName": "training-operator"}}},
}  # fmt: skip


def manifest(objects: list[dict[str, Any]]) -> str:
    """`helm template`'s output: YAML documents, each after a `# Source:` comment."""
    return "".join(
        f"---\n# Source: hyperpod-helm-chart/templates/{i}.yaml\n{yaml.safe_dump(obj)}"
        for i, obj in enumerate(objects)
    )
