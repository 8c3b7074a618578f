"""Log groups AWS services would create for the deployment's clusters are the stack's own:
named as the services name them (domain/service_logs.py, sources there), encrypted with the
deployment's key, kept for a set time, deleted with the stack, and made before the resource
that makes the service write (a group the service made first would fail the stack's)."""

from __future__ import annotations

from typing import Any

from domain.service_logs import EKS_CONTAINER_INSIGHTS
from tests.conftest import Synthesized


def _groups(app: Synthesized) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        group["Properties"].get("LogGroupName"): (logical_id, group)
        for logical_id, group in app.resources("compute", "AWS::Logs::LogGroup").items()
    }


def _writer(app: Synthesized, resource_type: str, **properties: str) -> dict[str, Any]:
    (found,) = [
        resource
        for resource in app.resources("compute", resource_type).values()
        if all(resource["Properties"].get(k) == v for k, v in properties.items())
    ]
    return found


def test_the_clusters_service_log_groups_are_the_stacks_own(default_app: Synthesized) -> None:
    groups = _groups(default_app)
    (data_key,) = {
        group["Properties"]["KmsKeyId"]["Fn::ImportValue"] for _, group in groups.values()
    }
    assert "StorageDataKey" in data_key
    expected = {
        "/aws/eks/nova-mtrl-eks/cluster": (365, _writer(default_app, "AWS::EKS::Cluster")),
        **{
            f"/aws/containerinsights/nova-mtrl-eks/{kind}": (
                90,
                _writer(
                    default_app, "AWS::EKS::Addon", AddonName="amazon-cloudwatch-observability"
                ),
            )
            for kind in EKS_CONTAINER_INSIGHTS
        },
        "/aws/ecs/containerinsights/nova-mtrl-reward-workers/performance": (
            90,
            _writer(default_app, "AWS::ECS::Cluster"),
        ),
    }
    for name, (days, writer) in expected.items():
        logical_id, group = groups[name]
        assert group["Properties"]["RetentionInDays"] == days, name
        assert group["DeletionPolicy"] == "Delete", name
        assert logical_id in writer["DependsOn"], name


def test_an_existing_eks_cluster_keeps_its_own_log_groups(existing_app: Synthesized) -> None:
    """Its owner's control plane and add-ons write where they already do."""
    names = [name for name in _groups(existing_app) if name]
    assert not [name for name in names if name.startswith(("/aws/eks/", "/aws/containerinsights/"))]
