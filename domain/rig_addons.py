"""The EKS add-ons as restricted instance groups need them, made from the cluster's own add-on
objects as AWS's RIG dependencies make them (aws/sagemaker-hyperpod-cli `release_v2`,
`helm_chart/install_rig_dependencies.sh`, functions `override_aws_node` and
`override_coredns`):

- `rig-aws-node`: a copy of the VPC CNI's `aws-node` DaemonSet for restricted nodes only, with
  `ENABLE_PREFIX_DELEGATION` and `ENABLE_IMDS_ONLY_MODE` on and its images at least the
  versions AWS names;
- `aws-node` itself kept off restricted nodes (an expression added to each of its node
  selector terms);
- `rig-coredns`: CoreDNS's Deployment as a DaemonSet on restricted nodes, tolerating their
  taint.

A restricted node is labelled `sagemaker.amazonaws.com/instance-group-type: Restricted` and
tainted `sagemaker.amazonaws.com/RestrictedNode=Worker:NoSchedule` (same sources).
"""

from __future__ import annotations

import copy
import re
from typing import Any

NAMESPACE = "kube-system"
AWS_NODE, COREDNS = "aws-node", "coredns"
GROUP_TYPE_LABEL = "sagemaker.amazonaws.com/instance-group-type"
RESTRICTED_TAINT = {
    "key": "sagemaker.amazonaws.com/RestrictedNode",
    "operator": "Equal",
    "value": "Worker",
    "effect": "NoSchedule",
}
# A node selector expression that leaves restricted nodes out.
OFF_RESTRICTED = {"key": GROUP_TYPE_LABEL, "operator": "NotIn", "values": ["Restricted"]}
# Container -> (the lowest version AWS accepts on restricted nodes, the tag it uses instead).
MINIMUM_IMAGES = {
    "aws-node": ("1.19.6", "v1.19.6-eksbuild.1"),
    "aws-eks-nodeagent": ("1.2.2", "v1.2.2-eksbuild.1"),
    "aws-vpc-cni-init": ("1.19.6", "v1.19.6-eksbuild.1"),
}
# What the API server adds to an object: not part of what is applied.
_SERVER_FIELDS = (
    "uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink",
)  # fmt: skip


def rig_aws_node(aws_node: dict[str, Any]) -> dict[str, Any]:
    """The VPC CNI's DaemonSet for restricted nodes."""
    rig = _applicable(aws_node, name=f"rig-{AWS_NODE}")
    spec = rig["spec"]["template"]["spec"]
    for term in _selector_terms(spec):
        expressions = term.setdefault("matchExpressions", [])
        ours = [e for e in expressions if e.get("key") == GROUP_TYPE_LABEL]
        if ours:
            for expression in ours:
                expression["operator"], expression["values"] = "In", ["Restricted"]
        else:
            expressions.append(
                {"key": GROUP_TYPE_LABEL, "operator": "In", "values": ["Restricted"]}
            )
    for container in spec["containers"]:
        if container.get("name") == AWS_NODE:
            environment = container.setdefault("env", [])
            for variable in environment:
                if variable.get("name") == "ENABLE_PREFIX_DELEGATION":
                    variable["value"] = "true"
            if not any(v.get("name") == "ENABLE_IMDS_ONLY_MODE" for v in environment):
                environment.append({"name": "ENABLE_IMDS_ONLY_MODE", "value": "true"})
    for container in [*spec["containers"], *spec.get("initContainers", [])]:
        if container.get("name") in MINIMUM_IMAGES:
            container["image"] = at_least(container["image"], *MINIMUM_IMAGES[container["name"]])
    return rig


def aws_node_off_restricted(aws_node: dict[str, Any]) -> dict[str, Any] | None:
    """`aws-node` kept off restricted nodes; None when it already is."""
    changed = _applicable(aws_node, name=AWS_NODE)
    spec = changed["spec"]["template"]["spec"]
    terms = _selector_terms(spec)
    if all(OFF_RESTRICTED in term.get("matchExpressions", []) for term in terms):
        return None
    for term in terms:
        if OFF_RESTRICTED not in term.setdefault("matchExpressions", []):
            term["matchExpressions"].append(copy.deepcopy(OFF_RESTRICTED))
    return changed


def rig_coredns(coredns: dict[str, Any]) -> dict[str, Any]:
    """CoreDNS's Deployment as a DaemonSet on restricted nodes."""
    rig = _applicable(coredns, name=f"rig-{COREDNS}")
    rig["kind"] = "DaemonSet"
    spec = rig["spec"]
    for field in ("replicas", "progressDeadlineSeconds", "revisionHistoryLimit", "strategy"):
        spec.pop(field, None)
    # AWS carries the Deployment's strategy type over (coredns': RollingUpdate); a DaemonSet
    # knows no other that keeps DNS up while it rolls.
    spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    pod = spec["template"]["spec"]
    pod.pop("topologySpreadConstraints", None)
    pod["nodeSelector"] = {GROUP_TYPE_LABEL: "Restricted"}
    tolerate_restricted(pod)
    return rig


def tolerate_restricted(pod_spec: dict[str, Any]) -> None:
    """The pod tolerates restricted nodes' taint (once)."""
    tolerations = pod_spec.setdefault("tolerations", [])
    if RESTRICTED_TAINT not in tolerations:
        tolerations.append(dict(RESTRICTED_TAINT))


def at_least(image: str, minimum: str, tag: str) -> str:
    """`image` with `tag` when its own tag's version (`v1.18.3-eksbuild.1` is 1.18.3) is below
    `minimum`; unchanged when its tag has no version to compare."""
    repository, _, current = image.rpartition(":")
    found = re.match(r"v?(\d+(?:\.\d+)*)", current)
    if not repository or found is None:
        return image
    version = tuple(int(part) for part in found.group(1).split("."))
    if version < tuple(int(part) for part in minimum.split(".")):
        return f"{repository}:{tag}"
    return image


def _applicable(obj: dict[str, Any], *, name: str) -> dict[str, Any]:
    """A copy of a live object as one applies it: named `name`, without what the server keeps."""
    copied = copy.deepcopy(obj)
    copied.pop("status", None)
    metadata = copied["metadata"]
    for field in _SERVER_FIELDS:
        metadata.pop(field, None)
    metadata["name"] = name
    metadata["namespace"] = NAMESPACE
    return copied


def _selector_terms(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's required node selector terms (one made when it has none)."""
    required = (
        pod_spec.setdefault("affinity", {})
        .setdefault("nodeAffinity", {})
        .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    terms: list[dict[str, Any]] = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({"matchExpressions": []})
    return terms
