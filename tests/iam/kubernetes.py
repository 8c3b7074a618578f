"""Kubernetes authorization of a recorded request, as EKS does it: the IAM principal's access
entry gives its Kubernetes groups (and EKS access policies); RBAC rules bound to those groups
allow verbs on resources. Sources: EKS User Guide, "Grant IAM users access to Kubernetes with
EKS access entries"; Kubernetes docs, "Authorization" (request verbs) and "Using RBAC
Authorization"; "Server-Side Apply" (an apply that creates needs create as well as patch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.iam.deployment import AccessEntry

CLUSTER_ADMIN = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


@dataclass(frozen=True)
class KubernetesRequest:
    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None


def parse(method: str, path: str, *, created: bool = False) -> KubernetesRequest:
    """The request attributes the API server authorizes for `method path`."""
    url = urlsplit(path)
    parts = url.path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if resource == "namespaces" and name:
        namespace = name
    verb = {
        "GET": "get" if name else ("watch" if parse_qs(url.query).get("watch") else "list"),
        "PATCH": "create" if created else "patch",
        "DELETE": "delete",
        "POST": "create",
        "PUT": "update",
    }[method]
    return KubernetesRequest(verb, group, resource, namespace, name)


def _rule_allows(rule: dict[str, Any], request: KubernetesRequest) -> bool:
    def has(values: list[str], value: str) -> bool:
        return "*" in values or value in values

    names = rule.get("resourceNames")
    return (
        has(rule.get("apiGroups", []), request.group)
        and has(rule.get("resources", []), request.resource)
        and has(rule.get("verbs", []), request.verb)
        and (not names or request.name in names)
    )


def allowed(
    entry: AccessEntry | None, rbac: list[dict[str, Any]], request: KubernetesRequest
) -> bool:
    if entry is None:
        return False
    if CLUSTER_ADMIN in entry.policies:
        return True
    roles = {obj["metadata"]["name"]: obj for obj in rbac if obj["kind"] == "ClusterRole"}
    for binding in (obj for obj in rbac if obj["kind"] == "ClusterRoleBinding"):
        subjects = {s["name"] for s in binding.get("subjects", []) if s["kind"] == "Group"}
        if subjects & set(entry.groups):
            role = roles.get(binding["roleRef"]["name"], {})
            if any(_rule_allows(rule, request) for rule in role.get("rules", [])):
                return True
    return False
