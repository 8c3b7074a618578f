"""The EKS add-ons' copies for restricted instance groups (domain/rig_addons.py),
against what AWS's RIG dependencies make (aws/sagemaker-hyperpod-cli release_v2,
helm_chart/install_rig_dependencies.sh: override_aws_node, override_coredns)."""

from __future__ import annotations

import pytest

from domain.rig_addons import (
    RESTRICTED_TAINT,
    at_least,
    aws_node_off_restricted,
    rig_aws_node,
    rig_coredns,
)
from tests.kubernetes.eks_addons import REGISTRY, aws_node, coredns

RESTRICTED = {"key": "sagemaker.amazonaws.com/instance-group-type", "operator": "In",
              "values": ["Restricted"]}  # fmt: skip
ELSEWHERE = {**RESTRICTED, "operator": "NotIn"}


def _pod(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def _terms(obj: dict) -> list[dict]:
    affinity = _pod(obj)["affinity"]["nodeAffinity"]
    return affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_rig_aws_node_runs_the_cni_on_restricted_nodes_only_in_imds_only_mode() -> None:
    live = aws_node()
    rig = rig_aws_node(live)
    assert live == aws_node()  # the live object is not changed
    assert rig["metadata"] == {
        "name": "rig-aws-node", "namespace": "kube-system", "labels": {"k8s-app": "aws-node"}
    }  # fmt: skip
    assert "status" not in rig
    (term,) = _terms(rig)
    assert term["matchExpressions"][-1] == RESTRICTED
    assert term["matchExpressions"][:-1] == _terms(live)[0]["matchExpressions"]
    cni, agent = _pod(rig)["containers"]
    assert cni["env"] == [
        {"name": "ENABLE_PREFIX_DELEGATION", "value": "true"},
        {"name": "WARM_ENI_TARGET", "value": "1"},
        {"name": "ENABLE_IMDS_ONLY_MODE", "value": "true"},
    ]
    # Below AWS's minimums: raised to them, in the same repositories; at or above: kept.
    assert cni["image"] == f"{REGISTRY}/amazon-k8s-cni:v1.19.6-eksbuild.1"
    assert (init := _pod(rig)["initContainers"][0])["image"] == (
        f"{REGISTRY}/amazon-k8s-cni-init:v1.19.6-eksbuild.1"
    ), init
    assert agent["image"] == f"{REGISTRY}/amazon/aws-network-policy-agent:v1.2.5-eksbuild.1"
    assert _pod(rig)["tolerations"] == [{"operator": "Exists"}]


def test_a_live_aws_node_already_kept_off_restricted_nodes_still_makes_a_rig_copy_for_them() -> (
    None
):
    """Re-deploying: the standard DaemonSet carries the NotIn expression; its copy turns it."""
    kept_off = aws_node_off_restricted(aws_node())
    assert kept_off is not None
    (term,) = _terms(rig_aws_node(kept_off))
    assert [e for e in term["matchExpressions"] if e["key"] == RESTRICTED["key"]] == [RESTRICTED]
    environment = _pod(rig_aws_node(rig_aws_node(aws_node())))["containers"][0]["env"]
    assert [v["name"] for v in environment].count("ENABLE_IMDS_ONLY_MODE") == 1


def test_aws_node_is_kept_off_restricted_nodes_once() -> None:
    live = aws_node()
    live["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"].append({"matchExpressions": [{"key": "a", "operator": "Exists"}]})
    changed = aws_node_off_restricted(live)
    assert changed is not None and changed["metadata"]["name"] == "aws-node"
    assert "uid" not in changed["metadata"] and "status" not in changed
    assert all(term["matchExpressions"][-1] == ELSEWHERE for term in _terms(changed))
    assert aws_node_off_restricted(changed) is None  # nothing more to change
    bare = aws_node()
    del bare["spec"]["template"]["spec"]["affinity"]
    (term,) = _terms(aws_node_off_restricted(bare))
    assert term == {"matchExpressions": [ELSEWHERE]}


def test_rig_coredns_is_a_daemonset_on_restricted_nodes_tolerating_their_taint() -> None:
    live = coredns()
    rig = rig_coredns(live)
    assert live == coredns()
    assert (rig["kind"], rig["metadata"]["name"]) == ("DaemonSet", "rig-coredns")
    spec = rig["spec"]
    assert {"replicas", "progressDeadlineSeconds", "revisionHistoryLimit", "strategy"}.isdisjoint(
        spec
    )
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    assert spec["selector"] == live["spec"]["selector"]
    pod = _pod(rig)
    assert "topologySpreadConstraints" not in pod
    assert pod["nodeSelector"] == {"sagemaker.amazonaws.com/instance-group-type": "Restricted"}
    assert pod["tolerations"] == [*_pod(live)["tolerations"], RESTRICTED_TAINT]
    assert (
        rig_coredns(rig_coredns(live))["spec"]["template"]["spec"]["tolerations"]
        == (pod["tolerations"])
    )


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("r/cni:v1.19.5-eksbuild.3", "r/cni:v1.19.6-eksbuild.1"),
        ("r/cni:v1.19.6-eksbuild.3", "r/cni:v1.19.6-eksbuild.3"),
        ("r/cni:v1.20.0", "r/cni:v1.20.0"),
        ("r/cni:1.9.9", "r/cni:v1.19.6-eksbuild.1"),  # 1.9 < 1.19: numbers, not text
        ("r:5000/cni:latest", "r:5000/cni:latest"),  # no version to compare: left alone
        ("r:5000/cni:v1.0.0", "r:5000/cni:v1.19.6-eksbuild.1"),  # the tag, not the port
        ("cni", "cni"),
    ],
)
def test_images_below_the_minimum_get_the_minimum_tag(image: str, expected: str) -> None:
    assert at_least(image, "1.19.6", "v1.19.6-eksbuild.1") == expected


def test_fields_the_add_ons_may_leave_out_are_made_where_the_copies_need_them() -> None:
    """A node selector term of fields only, a CNI container without environment, no init
    containers, a CoreDNS without tolerations: each copy still gets what it must carry."""
    live = aws_node()
    pod = _pod(live)
    pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] = [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n-0"]}]}]
    del pod["containers"][0]["env"], pod["initContainers"]
    rig = rig_aws_node(live)
    (term,) = _terms(rig)
    assert term["matchExpressions"] == [RESTRICTED] and term["matchFields"]
    assert _pod(rig)["containers"][0]["env"] == [{"name": "ENABLE_IMDS_ONLY_MODE", "value": "true"}]
    assert "initContainers" not in _pod(rig)
    (kept_off,) = _terms(aws_node_off_restricted(live))
    assert kept_off["matchExpressions"] == [ELSEWHERE]
    live_dns = coredns()
    del _pod(live_dns)["tolerations"], live_dns["spec"]["strategy"]
    rig_dns = rig_coredns(live_dns)
    assert _pod(rig_dns)["tolerations"] == [RESTRICTED_TAINT]
    assert rig_dns["spec"]["updateStrategy"]["type"] == "RollingUpdate"
