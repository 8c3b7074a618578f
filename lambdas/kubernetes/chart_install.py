"""Deploy-time custom resource: installs AWS's HyperPod Helm chart on the EKS cluster before the
HyperPod cluster is created, and removes it after that cluster on destroy.

With restricted instance groups (the rendering says so), the EKS add-ons' copies for their
nodes go with the chart (domain/rig_addons.py: `rig-aws-node`, `rig-coredns`, made
from the cluster's own add-on objects, removed with the chart), and the VPC CNI's `aws-node` is
kept off those nodes (not ours: changed, never deleted).

The chart was rendered and checked on the deploying machine (stacks/render_hyperpod_chart.py)
and uploaded as a CDK asset: `Manifest` names it ({Bucket, Key}); a new rendering is a new key,
so CloudFormation sends an Update and the objects the chart dropped are deleted
(lambdas/kubernetes/bootstrap.py). A rendering for another region than this function's fails
the deploy rather than install images from the wrong registry.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from domain import rig_addons
from lambdas.clients import Clients, Handler, lambda_entries
from lambdas.kubernetes.bootstrap import (
    Objects,
    Respond,
    custom_resource,
    eks_kubernetes,
    put_answer,
)
from lambdas.kubernetes.client import KubernetesClient
from lambdas.kubernetes.settings import ChartSettings

Load = Callable[[str, str], dict[str, Any]]  # (bucket, key) -> the rendering's document


def rendering_of(
    load: Load, properties: dict[str, Any], *, region: str, applying: bool = True
) -> dict[str, Any]:
    """The rendering (`objects`, `restricted`). One for another region is refused when it is to
    be applied; as a previous revision or one being deleted (a rollback of that refusal) it has
    nothing to remove: it was never applied."""
    manifest = properties["Manifest"]
    rendering = load(manifest["Bucket"], manifest["Key"])
    if rendering["region"] != region:
        if not applying:
            return {"objects": [], "restricted": False}
        raise ValueError(
            f"the HyperPod Helm chart was rendered for {rendering['region']} but this deploys to "
            f"{region}: set `region` in cdk.json (or AWS_REGION when deploying) to {region}"
        )
    return rendering


def restricted_addons(kubernetes: KubernetesClient, *, applying: bool) -> Objects:
    """The add-ons' copies for restricted nodes, made from the cluster's add-ons (to apply), or
    named only (to delete)."""
    if not applying:
        return [
            {"apiVersion": "apps/v1", "kind": "DaemonSet",
             "metadata": {"name": f"rig-{name}", "namespace": rig_addons.NAMESPACE}}
            for name in (rig_addons.AWS_NODE, rig_addons.COREDNS)
        ]  # fmt: skip
    return [
        rig_addons.rig_aws_node(_addon(kubernetes, "DaemonSet", rig_addons.AWS_NODE, "vpc-cni")),
        rig_addons.rig_coredns(_addon(kubernetes, "Deployment", rig_addons.COREDNS, "coredns")),
    ]


def keep_aws_node_off_restricted(kubernetes: KubernetesClient) -> None:
    changed = rig_addons.aws_node_off_restricted(
        _addon(kubernetes, "DaemonSet", rig_addons.AWS_NODE, "vpc-cni")
    )
    if changed is not None:
        kubernetes.apply(changed)


def _addon(kubernetes: KubernetesClient, kind: str, name: str, addon: str) -> dict[str, Any]:
    found = kubernetes.get("apps/v1", kind, name, rig_addons.NAMESPACE)
    if found is None:
        raise ValueError(
            f"no {kind} {name} in {rig_addons.NAMESPACE}: restricted instance groups need a copy "
            f"of the EKS add-on {addon}'s; install the add-on (stacks/components/eks.py does)"
        )
    return found


def install_chart(
    event: dict[str, Any],
    *,
    s3: Any,
    region: str,
    release: str,
    kubernetes: Callable[[], KubernetesClient],
    respond: Respond,
) -> None:
    """The rendering the `Manifest` property names, applied as release `release`
    (`<cluster>/<release name>`, the physical id), with the add-ons' copies for restricted
    nodes where the rendering is for restricted groups."""
    client = functools.cache(kubernetes)

    @functools.cache  # read once per event: `prepare` and `objects_of` both need it
    def load(bucket: str, key: str) -> dict[str, Any]:
        return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    def objects_of(properties: dict[str, Any], applying: bool) -> Objects:
        rendering = rendering_of(load, properties, region=region, applying=applying)
        if not rendering.get("restricted"):
            return rendering["objects"]
        return [*rendering["objects"], *restricted_addons(client(), applying=applying)]

    def prepare(properties: dict[str, Any]) -> None:
        # Another region's rendering is refused before anything changes.
        if rendering_of(load, properties, region=region).get("restricted"):
            keep_aws_node_off_restricted(client())

    custom_resource(
        event, physical_id=release, objects_of=objects_of, kubernetes=client, respond=respond,
        region=region, prepare=prepare,
    )  # fmt: skip


def compose(
    environment: Mapping[str, str], clients: Clients, *, respond: Respond | None = None
) -> dict[str, Handler]:
    """`respond`: how answers reach CloudFormation's bucket (`put_answer`)."""
    settings = ChartSettings.from_environment(environment)
    install = functools.partial(
        install_chart,
        s3=clients("s3"),
        region=settings.region,
        release=f"{settings.eks_cluster}/{settings.release}",
        kubernetes=eks_kubernetes(settings, clients),
        respond=respond or put_answer,
    )
    return {"on_event": install}


on_event = lambda_entries(compose, os.environ)("on_event")
