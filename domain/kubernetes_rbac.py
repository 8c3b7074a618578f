"""The pipeline's Kubernetes permissions, as objects applied once at deploy time.

EKS access policies cover built-in kinds only and cannot create namespaces, so the pipeline's
roles get an access entry in the group `<prefix>:pipeline`, and this group gets exactly what a
run needs: its namespace, service account, config map and job; pods, events and nodes to read.
RBAC cannot limit a create to names of a pattern, so a ValidatingAdmissionPolicy (GA since
Kubernetes 1.30) refuses any change by that group outside `<prefix>-run-*` namespaces.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from domain.naming import run_prefix
from domain.nova_job import NAMESPACE, image_repositories

ADMISSION_API = "admissionregistration.k8s.io/v1"
RBAC_API = "rbac.authorization.k8s.io/v1"
WRITE = ["get", "list", "create", "patch", "update", "delete"]
# (API group, resources) the pipeline creates and deletes for a run.
MANAGED = (
    ("", ["namespaces", "serviceaccounts", "configmaps"]),
    ("sagemaker.amazonaws.com", ["hyperpodpytorchjobs"]),
    ("kubeflow.org", ["pytorchjobs"]),
)


def pipeline_group(prefix: str) -> str:
    return f"{prefix}:pipeline"


def pipeline_rbac(prefix: str) -> list[dict[str, Any]]:
    """ClusterRole + binding for the pipeline group, and the policy that fences it in."""
    name = f"{prefix}-pipeline"
    group = pipeline_group(prefix)
    labels = {"app.kubernetes.io/managed-by": "nova-mtrl", "nova-mtrl/deployment": prefix}
    allowed = run_prefix(prefix)
    rules = [
        {"apiGroups": [api], "resources": resources, "verbs": WRITE} for api, resources in MANAGED
    ]
    rules.append(
        {"apiGroups": [""], "resources": ["pods", "events", "nodes"], "verbs": ["get", "list"]}
    )
    return [
        {
            "apiVersion": RBAC_API,
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": rules,
        },
        {
            "apiVersion": RBAC_API,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        },
        {
            "apiVersion": ADMISSION_API,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": f"{name}-run-namespaces-only", "labels": labels},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [api],
                            "apiVersions": ["*"],
                            "operations": ["CREATE", "UPDATE", "DELETE"],
                            "resources": resources,
                        }
                        for api, resources in MANAGED
                    ]
                },
                "matchConditions": [
                    {
                        "name": "pipeline-group",
                        "expression": f"request.userInfo.groups.exists(g, g == '{group}')",
                    }
                ],
                "validations": [
                    {
                        "expression": (
                            "(request.resource.resource == 'namespaces' ? request.name : "
                            f"request.namespace).startsWith('{allowed}')"
                        ),
                        "message": f"the nova-mtrl pipeline may only change {allowed}* namespaces",
                    }
                ],
            },
        },
        {
            "apiVersion": ADMISSION_API,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": f"{name}-run-namespaces-only", "labels": labels},
            "spec": {
                "policyName": f"{name}-run-namespaces-only",
                "validationActions": ["Deny"],
            },
        },
    ]


# What helm installs and uninstalls for AWS's Nova RFT chart (aws/sagemaker-hyperpod-recipes,
# launcher/nova/k8s_templates/RFT/templates: Secret, ConfigMap, Service, Deployment,
# StatefulSet, Job, PyTorchJob) and where helm keeps its releases (Secrets of the namespace).
NOVA_CHART = (
    ("", ["secrets", "configmaps", "services"]),
    ("apps", ["deployments", "statefulsets"]),
    ("batch", ["jobs"]),
    ("kubeflow.org", ["pytorchjobs"]),
)


# Service accounts in Nova's namespace that hold cluster-wide rights: the Kubeflow training
# operator's (AWS's HyperPod chart at stacks/hyperpod_chart.COMMIT,
# charts/training-operators/templates/ServiceAccount/training-operator-kubeflow-ServiceAccount.yaml,
# bound to its ClusterRole: pods, pods/exec, secrets). RBAC cannot stop a workload the launcher
# group creates from running as one of them; an admission policy does.
PRIVILEGED_ACCOUNTS = ("training-operator",)
# The launcher group's kinds that carry pod templates, and where: AWS's Nova chart's Deployments,
# StatefulSets, Jobs (spec.template) and PyTorchJobs (spec.pytorchReplicaSpecs[*].template).
POD_TEMPLATES = (
    ("apps", ["deployments", "statefulsets"]),
    ("batch", ["jobs"]),
    ("kubeflow.org", ["pytorchjobs"]),
)
POD_SPECS = (
    "object.kind == 'PyTorchJob' ? object.spec.pytorchReplicaSpecs.map(k, "
    "object.spec.pytorchReplicaSpecs[k].template.spec) : [object.spec.template.spec]"
)
# A pod spec's lists of containers, each checked.
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _cel_strings(values: tuple[str, ...]) -> str:
    """CEL string literals, comma-separated (the inside of a list)."""
    return ", ".join(f"'{value}'" for value in values)


def _every_pod_spec(conditions: list[str]) -> str:
    """CEL: every pod spec of the object meets every condition (on `s`)."""
    return f"variables.podSpecs.all(s, {' && '.join(conditions)})"


def _only_accounts_other_than(accounts: tuple[str, ...]) -> str:
    """CEL: no pod spec runs as one of `accounts` (either field names a pod's account)."""
    denied = _cel_strings(accounts)
    return _every_pod_spec([
        f"!(has(s.{field}) && s.{field} in [{denied}])"
        for field in ("serviceAccountName", "serviceAccount")
    ])  # fmt: skip


def _only_images_from(repositories: tuple[str, ...]) -> str:
    """CEL: every container of every pod spec has an image of one of `repositories`, by tag or
    digest (the registry is everything before an image's first `/`, so a look-alike host or
    account does not pass)."""
    allowed = _cel_strings(repositories)
    image_ok = (
        f"has(c.image) && [{allowed}].exists(r, "
        "c.image.startsWith(r + ':') || c.image.startsWith(r + '@'))"
    )
    return _every_pod_spec([
        f"(!has(s.{field}) || s.{field}.all(c, {image_ok}))" for field in CONTAINER_LISTS
    ])  # fmt: skip


def launcher_group(prefix: str) -> str:
    return f"{prefix}:nova-launcher"


def nova_launcher_rbac(prefix: str) -> list[dict[str, Any]]:
    """The launcher group's rights: AWS's chart in the Nova jobs' namespace, nothing elsewhere
    (a Role, not a ClusterRole). The namespace is the HyperPod chart's (its training operator,
    always on where Nova runs, makes it: stacks/components/hyperpod_dependencies.py), installed
    by the compute stack before these and removed after them."""
    name = f"{prefix}-nova-launcher"
    labels = {"app.kubernetes.io/managed-by": "nova-mtrl", "nova-mtrl/deployment": prefix}
    rules = [
        {"apiGroups": [api], "resources": resources, "verbs": [*WRITE, "watch"]}
        for api, resources in NOVA_CHART
    ]
    metadata = {"name": name, "namespace": NAMESPACE, "labels": labels}
    fence = f"{name}-fence"
    denied, repositories = _cel_strings(PRIVILEGED_ACCOUNTS), image_repositories()
    return [
        {"apiVersion": RBAC_API, "kind": "Role", "metadata": metadata, "rules": rules},
        {
            "apiVersion": RBAC_API, "kind": "RoleBinding", "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                          "name": launcher_group(prefix)}],
        },
        {
            "apiVersion": ADMISSION_API, "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": fence, "labels": labels},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}
                    },
                    "resourceRules": [
                        {"apiGroups": [api], "apiVersions": ["*"],
                         "operations": ["CREATE", "UPDATE"], "resources": resources}
                        for api, resources in POD_TEMPLATES
                    ],
                },
                "matchConditions": [{
                    "name": "launcher-group",
                    "expression": (
                        f"request.userInfo.groups.exists(g, g == '{launcher_group(prefix)}')"
                    ),
                }],
                "variables": [{"name": "podSpecs", "expression": POD_SPECS}],
                "validations": [
                    {
                        "expression": _only_accounts_other_than(PRIVILEGED_ACCOUNTS),
                        "message": (
                            f"the Nova launcher may not run pods as {denied} in {NAMESPACE}: "
                            "they hold cluster-wide rights"
                        ),
                    },
                    {
                        "expression": _only_images_from(repositories),
                        "message": (
                            f"the Nova launcher may run only Nova's images in {NAMESPACE}, from "
                            f"AWS's repositories {', '.join(repositories)}"
                        ),
                    },
                ],
            },
        },
        {
            "apiVersion": ADMISSION_API, "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": fence, "labels": labels},
            "spec": {"policyName": fence, "validationActions": ["Deny"]},
        },
    ]  # fmt: skip


def deployment_rbac(prefix: str, *, nova_launcher: bool) -> list[dict[str, Any]]:
    """Every RBAC object a deployment applies: the pipeline's, and the Nova launcher's where the
    deployment has the launcher."""
    return pipeline_rbac(prefix) + (nova_launcher_rbac(prefix) if nova_launcher else [])


def rbac_properties(prefix: str, *, nova_launcher: bool) -> dict[str, str]:
    """The RBAC custom resource's properties: which set to apply, and the set's digest (so a new
    set of objects is a new revision, re-applied on the next deploy). Never the objects."""
    objects = deployment_rbac(prefix, nova_launcher=nova_launcher)
    digest = hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()
    return {"NovaLauncher": "true" if nova_launcher else "false", "Revision": digest}


def rbac_of(prefix: str, properties: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The objects a revision's properties (`rbac_properties`) stand for, built here."""
    return deployment_rbac(prefix, nova_launcher=properties.get("NovaLauncher") == "true")
