"""The Kubernetes kinds this project creates or reads, with where each lives in the API: the
pipeline's client (lambdas/kubernetes/client.py) calls them, and the deploy checks that AWS's
HyperPod chart renders nothing of a kind it could not install (stacks/hyperpod_chart.py,
stacks/render_hyperpod_chart.py)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None, name: str | None = None) -> str:
        group = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        scope = f"/namespaces/{quote(namespace)}" if self.namespaced and namespace else ""
        item = f"/{quote(name)}" if name else ""
        return f"{group}{scope}/{self.plural}{item}"


# The kinds the pipeline and the deploy-time installs create or read.
_KNOWN = (
    Kind("v1", "Namespace", "namespaces", namespaced=False),
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Service", "services"),
    Kind("v1", "Pod", "pods"),
    Kind("v1", "Event", "events"),
    Kind("v1", "Node", "nodes", namespaced=False),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("apps/v1", "StatefulSet", "statefulsets"),
    Kind("apps/v1", "DaemonSet", "daemonsets"),
    Kind("v1", "Secret", "secrets"),
    Kind("batch/v1", "Job", "jobs"),
    Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", namespaced=False),
    Kind(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        namespaced=False,
    ),
    Kind("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
    Kind("sagemaker.amazonaws.com/v1", "HyperPodPyTorchJob", "hyperpodpytorchjobs"),
    Kind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
    Kind(
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        namespaced=False,
    ),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        namespaced=False,
    ),
    Kind(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        namespaced=False,
    ),
    Kind(
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        namespaced=False,
    ),
    Kind(
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        namespaced=False,
    ),
)
# By (apiVersion, kind), as a manifest names them.
KINDS: dict[tuple[str, str], Kind] = {(kind.api_version, kind.kind): kind for kind in _KNOWN}


def kind_of(api_version: str, kind: str) -> Kind:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"unknown Kubernetes kind {api_version}/{kind}") from None
