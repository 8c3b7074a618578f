"""The EKS add-ons' objects as the API server returns them (vpc-cni's `aws-node` DaemonSet,
coredns' Deployment), cut to what the restricted-group copies touch and what the server adds:
shaped after EKS's add-on manifests (aws/amazon-vpc-cni-k8s `config/master/aws-k8s-cni.yaml`,
the coredns add-on), versions older than AWS's RIG minimums where it matters."""

from __future__ import annotations

from typing import Any

REGISTRY = "602401143452.dkr.ecr.us-east-1.amazonaws.com"
_SERVER = {"uid": "u-1", "resourceVersion": "812", "generation": 3,
           "creationTimestamp": "2026-12-01T10:00:00Z",
           "managedFields": [{"manager": "eks", "operation": "Apply"}]}  # fmt: skip
_NOT_FARGATE = {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn",
                "values": ["fargate", "hybrid", "auto"]}  # fmt: skip


def aws_node() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "aws-node", "namespace": "kube-system",
                     "labels": {"k8s-app": "aws-node"}, **_SERVER},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "aws-node"}},
            "template": {
                "metadata": {"labels": {"k8s-app": "aws-node"}},
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                            _NOT_FARGATE,
                        ]}]}}},
                    "containers": [
                        {"name": "aws-node", "image": f"{REGISTRY}/amazon-k8s-cni:v1.18.3-eksbuild.1",
                         "env": [{"name": "ENABLE_PREFIX_DELEGATION", "value": "false"},
                                 {"name": "WARM_ENI_TARGET", "value": "1"}]},
                        {"name": "aws-eks-nodeagent",
                         "image": f"{REGISTRY}/amazon/aws-network-policy-agent:v1.2.5-eksbuild.1"},
                    ],
                    "initContainers": [{"name": "aws-vpc-cni-init",
                                        "image": f"{REGISTRY}/amazon-k8s-cni-init:v1.18.3-eksbuild.1"}],
                    "tolerations": [{"operator": "Exists"}],
                },
            },
        },
        "status": {"numberReady": 2},
    }  # fmt: skip


def coredns() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "coredns", "namespace": "kube-system",
                     "labels": {"k8s-app": "kube-dns"}, **_SERVER},
        "spec": {
            "replicas": 2, "progressDeadlineSeconds": 600, "revisionHistoryLimit": 10,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
            "template": {
                "metadata": {"labels": {"k8s-app": "kube-dns"}},
                "spec": {
                    "containers": [{"name": "coredns",
                                    "image": f"{REGISTRY}/eks/coredns:v1.11.4-eksbuild.2"}],
                    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                                    {"key": "node-role.kubernetes.io/control-plane",
                                     "effect": "NoSchedule"}],
                    "topologySpreadConstraints": [{"maxSkew": 1,
                                                   "topologyKey": "topology.kubernetes.io/zone",
                                                   "whenUnsatisfiable": "ScheduleAnyway"}],
                },
            },
        },
        "status": {"readyReplicas": 2},
    }  # fmt: skip


def install(objects: dict[str, dict[str, Any]]) -> None:
    """Put both on a fake API server's store (`FakeKubernetes.objects`), as EKS does."""
    objects.setdefault("/apis/apps/v1/namespaces/kube-system/daemonsets", {})["aws-node"] = (
        aws_node()
    )
    objects.setdefault("/apis/apps/v1/namespaces/kube-system/deployments", {})["coredns"] = (
        coredns()
    )
