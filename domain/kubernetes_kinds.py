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
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None, name: str | None = None) -> str:
        group = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        scope = f"/namespaces/{quote(namespace)}" if self.namespaced and namespace else ""
        item = f"/{quote(name)}" if name else ""
        return f"{group}{scope}/{self.plural}{item}"


# The kinds the pipeline and the deploy-time installs create or read, by (apiVersion, kind).
KINDS: dict[tuple[str, str], Kind] = {
    ("v1", "Namespace"): Kind("v1", "namespaces", namespaced=False),
    ("v1", "ServiceAccount"): Kind("v1", "serviceaccounts"),
    ("v1", "ConfigMap"): Kind("v1", "configmaps"),
    ("v1", "Service"): Kind("v1", "services"),
    ("v1", "Pod"): Kind("v1", "pods"),
    ("v1", "Event"): Kind("v1", "events"),
    ("v1", "Node"): Kind("v1", "nodes", namespaced=False),
    ("apps/v1", "Deployment"): Kind("apps/v1", "deployments"),
    ("apps/v1", "StatefulSet"): Kind("apps/v1", "statefulsets"),
    ("apps/v1", "DaemonSet"): Kind("apps/v1", "daemonsets"),
    ("v1", "Secret"): Kind("v1", "secrets"),
    ("batch/v1", "Job"): Kind("batch/v1", "jobs"),
    ("scheduling.k8s.io/v1", "PriorityClass"): Kind(
        "scheduling.k8s.io/v1", "priorityclasses", namespaced=False
    ),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): Kind(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False
    ),
    ("kubeflow.org/v1", "PyTorchJob"): Kind("kubeflow.org/v1", "pytorchjobs"),
    ("sagemaker.amazonaws.com/v1", "HyperPodPyTorchJob"): Kind(
        "sagemaker.amazonaws.com/v1", "hyperpodpytorchjobs"
    ),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): Kind(
        "rbac.authorization.k8s.io/v1", "clusterroles", namespaced=False
    ),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): Kind(
        "rbac.authorization.k8s.io/v1", "clusterrolebindings", namespaced=False
    ),
    ("rbac.authorization.k8s.io/v1", "Role"): Kind("rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): Kind(
        "rbac.authorization.k8s.io/v1", "rolebindings"
    ),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): Kind(
        "admissionregistration.k8s.io/v1", "validatingadmissionpolicies", namespaced=False
    ),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): Kind(
        "admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", namespaced=False
    ),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): Kind(
        "admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", namespaced=False
    ),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): Kind(
        "admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", namespaced=False
    ),
}


def kind_of(api_version: str, kind: str) -> Kind:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"unknown Kubernetes kind {api_version}/{kind}") from None
