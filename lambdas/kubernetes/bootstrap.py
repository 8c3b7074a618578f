"""Deploy-time custom resources that put Kubernetes objects on the EKS cluster and take them off
again — with our own client, no kubectl layer:

- `on_event`: the objects given inline (`Objects`, JSON): the pipeline's RBAC
  (lambdas/kubernetes/rbac.py);
- lambdas/kubernetes/chart_install.py: AWS's HyperPod Helm chart, rendered at deploy time.

Create applies every object (server-side apply: idempotent); Update applies the new set and
deletes what the old set had and the new one has not; Delete removes them all, in reverse order.
CloudFormation calls the function directly (no provider framework) and waits for the answer at
the pre-signed `ResponseURL`; every outcome, errors included, is reported there.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from collections.abc import Callable
from typing import Any

import boto3

from lambdas.kubernetes.client import KubernetesClient
from lambdas.kubernetes.token import EksTokenSource

log = logging.getLogger(__name__)
Objects = list[dict[str, Any]]
# What others are made of or live in comes first; what intercepts requests (webhooks) last.
_FIRST = ("Namespace", "CustomResourceDefinition", "PriorityClass", "ServiceAccount", "Secret",
          "ConfigMap", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")  # fmt: skip
_LAST = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
         "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")  # fmt: skip


def _rank(obj: dict[str, Any]) -> int:
    kind = obj["kind"]
    if kind in _FIRST:
        return _FIRST.index(kind)
    return len(_FIRST) + 1 + _LAST.index(kind) if kind in _LAST else len(_FIRST)


def _identity(obj: dict[str, Any]) -> tuple[str, str, str | None, str]:
    metadata = obj["metadata"]
    return obj["apiVersion"], obj["kind"], metadata.get("namespace"), metadata["name"]


def _delete(kubernetes: KubernetesClient, objects: Objects) -> int:
    return sum(
        kubernetes.delete(
            obj["apiVersion"],
            obj["kind"],
            obj["metadata"]["name"],
            obj["metadata"].get("namespace"),
        )  # fmt: skip
        for obj in sorted(objects, key=_rank, reverse=True)
    )


def reconcile(
    kubernetes: KubernetesClient, objects: Objects, *, request_type: str, previous: Objects = ()
) -> int:
    """Apply `objects` (Create, Update; `previous` ones no longer wanted are deleted) or delete
    them (Delete); returns the objects applied or deleted."""
    if request_type == "Delete":
        return _delete(kubernetes, objects)
    for obj in sorted(objects, key=_rank):
        kubernetes.apply(obj)
    wanted = {_identity(obj) for obj in objects}
    _delete(kubernetes, [obj for obj in previous if _identity(obj) not in wanted])
    return len(objects)


def custom_resource(
    event: dict[str, Any],
    *,
    physical_id: str,
    objects_of: Callable[[dict[str, Any], bool], Objects],
    kubernetes: KubernetesClient | None,
    respond: Callable[[str, dict[str, Any]], None] | None,
) -> None:
    """Reconcile the objects `objects_of(properties, applying)` names and answer CloudFormation;
    `applying` is False for the objects of a previous revision or of a delete."""
    answer = {
        "PhysicalResourceId": event.get("PhysicalResourceId") or physical_id,
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
    }
    try:
        request_type = event["RequestType"]
        objects = objects_of(event["ResourceProperties"], request_type != "Delete")
        previous = (
            objects_of(event["OldResourceProperties"], False) if request_type == "Update" else []
        )
        if kubernetes is None:
            cluster = os.environ["EKS_CLUSTER"]
            token = EksTokenSource(cluster, region=os.environ["AWS_REGION"])
            kubernetes = KubernetesClient.for_eks(boto3.client("eks"), cluster, token=token)
        touched = reconcile(kubernetes, objects, request_type=request_type, previous=previous)
        answer |= {"Status": "SUCCESS", "Data": {"Objects": touched}}
    except Exception as error:  # noqa: BLE001 - CloudFormation must hear about every failure
        log.exception("%s %s failed", event["LogicalResourceId"], event["RequestType"])
        answer |= {"Status": "FAILED", "Reason": f"{type(error).__name__}: {error}"[:1000]}
    (respond or _put)(event["ResponseURL"], answer)


def on_event(
    event: dict[str, Any],
    context: Any = None,
    *,
    kubernetes: KubernetesClient | None = None,
    respond: Callable[[str, dict[str, Any]], None] | None = None,
) -> None:
    custom_resource(
        event,
        physical_id=f"{os.environ['NAME_PREFIX']}-pipeline-rbac",
        objects_of=lambda properties, applying: json.loads(properties["Objects"]),
        kubernetes=kubernetes,
        respond=respond,
    )


def _put(url: str, answer: dict[str, Any]) -> None:
    body = json.dumps(answer).encode()
    request = urllib.request.Request(
        url, data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    with urllib.request.urlopen(request, timeout=30):  # noqa: S310 - CloudFormation's S3 URL
        pass
