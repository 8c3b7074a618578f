"""Deploy-time custom resource: installs AWS's HyperPod Helm chart on the EKS cluster before the
HyperPod cluster is created, and removes it after that cluster on destroy.

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


def rendered_objects(
    s3: Any, properties: dict[str, Any], *, region: str, applying: bool = True
) -> Objects:
    """The rendering's objects. One for another region is refused when it is to be applied;
    as a previous revision or one being deleted (a rollback of that refusal) it is nothing to
    remove: it was never applied."""
    manifest = properties["Manifest"]
    body = s3.get_object(Bucket=manifest["Bucket"], Key=manifest["Key"])["Body"].read()
    rendering = json.loads(body)
    if rendering["region"] != region:
        if not applying:
            return []
        raise ValueError(
            f"the HyperPod Helm chart was rendered for {rendering['region']} but this deploys to "
            f"{region}: set `region` in cdk.json (or AWS_REGION when deploying) to {region}"
        )
    return rendering["objects"]


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
    (`<cluster>/<release name>`, the physical id)."""
    custom_resource(
        event,
        physical_id=release,
        objects_of=lambda properties, applying: rendered_objects(
            s3, properties, region=region, applying=applying
        ),
        kubernetes=kubernetes,
        respond=respond,
    )


def compose(environment: Mapping[str, str], clients: Clients) -> dict[str, Handler]:
    settings = ChartSettings.from_environment(environment)
    install = functools.partial(
        install_chart,
        s3=clients("s3"),
        region=settings.region,
        release=f"{settings.eks_cluster}/{settings.release}",
        kubernetes=eks_kubernetes(settings, clients),
        respond=put_answer,
    )
    return {"on_event": install}


on_event = lambda_entries(compose, os.environ)("on_event")
