"""Deploy-time custom resources that put Kubernetes objects on the EKS cluster and take them off
again — with our own client, no kubectl layer:

- `apply_inline` (Lambda entry `on_event`): the objects given inline (`Objects`, JSON): the pipeline's RBAC
  (lambdas/kubernetes/rbac.py);
- lambdas/kubernetes/chart_install.py: AWS's HyperPod Helm chart, rendered at deploy time.

Create applies every object (server-side apply: idempotent); Update applies the new set and
deletes what the old set had and the new one has not; Delete removes them all, in reverse order.
CloudFormation calls the function directly (no provider framework) and waits for the answer at
the pre-signed `ResponseURL`; every outcome, errors included, is reported there.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from lambdas.clients import Clients, Handler, lambda_entries
from lambdas.kubernetes.client import KubernetesClient
from lambdas.kubernetes.settings import ClusterSettings, RbacSettings
from lambdas.kubernetes.token import EksTokenSource, regional_sts

log = logging.getLogger(__name__)
Objects = list[dict[str, Any]]
Respond = Callable[[str, dict[str, Any]], None]
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
    kubernetes: Callable[[], KubernetesClient],
    respond: Respond,
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Reconcile the objects `objects_of(properties, applying)` names and answer CloudFormation;
    `applying` is False for the objects of a previous revision or of a delete. `kubernetes()`
    is called inside, so not reaching the cluster is an answer too. `prepare(properties)`, on
    Create and Update, changes what the cluster has that is not ours to own, first."""
    answer = {
        "PhysicalResourceId": event.get("PhysicalResourceId") or physical_id,
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
    }
    try:
        request_type = event["RequestType"]
        if prepare is not None and request_type != "Delete":
            prepare(event["ResourceProperties"])
        objects = objects_of(event["ResourceProperties"], request_type != "Delete")
        previous = (
            objects_of(event["OldResourceProperties"], False) if request_type == "Update" else []
        )
        touched = reconcile(kubernetes(), objects, request_type=request_type, previous=previous)
        answer |= {"Status": "SUCCESS", "Data": {"Objects": touched}}
    except Exception as error:  # noqa: BLE001 - CloudFormation must hear about every failure
        log.exception("%s %s failed", event["LogicalResourceId"], event["RequestType"])
        answer |= {"Status": "FAILED", "Reason": f"{type(error).__name__}: {error}"[:1000]}
    respond(event["ResponseURL"], answer)


def apply_inline(
    event: dict[str, Any],
    *,
    prefix: str,
    kubernetes: Callable[[], KubernetesClient],
    respond: Respond,
) -> None:
    """The pipeline's RBAC: the objects in the `Objects` property (JSON)."""
    custom_resource(
        event,
        physical_id=f"{prefix}-pipeline-rbac",
        objects_of=lambda properties, applying: json.loads(properties["Objects"]),
        kubernetes=kubernetes,
        respond=respond,
    )


def eks_kubernetes(settings: ClusterSettings, clients: Clients) -> Callable[[], KubernetesClient]:
    """The client of the function's EKS cluster, as the function's role."""
    cluster, region = settings.eks_cluster, settings.region
    return lambda: KubernetesClient.for_eks(
        clients("eks"), cluster, token=EksTokenSource(cluster, sts=regional_sts(clients, region))
    )


def compose(environment: Mapping[str, str], clients: Clients) -> dict[str, Handler]:
    settings = RbacSettings.from_environment(environment)
    apply = functools.partial(
        apply_inline,
        prefix=settings.prefix,
        kubernetes=eks_kubernetes(settings, clients),
        respond=put_answer,
    )
    return {"on_event": apply}


def put_answer(url: str, answer: dict[str, Any]) -> None:
    """The answer to CloudFormation, PUT to the pre-signed response URL."""
    body = json.dumps(answer).encode()
    request = urllib.request.Request(
        url, data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    with urllib.request.urlopen(request, timeout=30):  # noqa: S310 - CloudFormation's S3 URL
        pass


on_event = lambda_entries(compose, os.environ)("on_event")
