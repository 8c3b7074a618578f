"""Deploy-time custom resources that put Kubernetes objects on the EKS cluster and take them off
again — with our own client, no kubectl layer:

- `apply_rbac` (Lambda entry `on_event`): the deployment's RBAC (domain/kubernetes_rbac.py),
  built here from the function's own settings. The event only chooses whether the Nova
  launcher's objects are among them (`NovaLauncher`) and carries a digest of the set
  (`Revision`) so a new set is a new revision: whoever may invoke the function (it is cluster
  admin) can at most apply or remove this deployment's own objects, never objects of their own;
- lambdas/kubernetes/chart_install.py: AWS's HyperPod Helm chart, rendered at deploy time.

Create applies every object (server-side apply: idempotent); Update applies the new set and
deletes what the old set had and the new one has not; Delete removes them all, in reverse order.
CloudFormation calls the function directly (no provider framework) and waits for the answer at
the pre-signed `ResponseURL`; every outcome, errors included, is reported there. An event whose
`ResponseURL` is not in CloudFormation's response bucket of the function's region is refused
before anything is done or sent: the functions run in the VPC, and would otherwise PUT to
whatever address an invoker names.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from domain.kubernetes_rbac import rbac_of
from lambdas.clients import Clients, Handler, lambda_entries
from lambdas.kubernetes.client import KubernetesClient
from lambdas.kubernetes.settings import ClusterSettings, RbacSettings
from lambdas.kubernetes.token import EksTokenSource, regional_sts

log = logging.getLogger(__name__)
Objects = list[dict[str, Any]]
Respond = Callable[[str, dict[str, Any]], None]
# CloudFormation's own bucket for custom resource answers, by region without dashes (CloudFormation
# User Guide, "Setting up VPC endpoints for CloudFormation": the buckets a VPC endpoint policy must
# allow, `cloudformation-custom-resource-response-<RegionWithoutDashes>`).
RESPONSE_BUCKET = "cloudformation-custom-resource-response-{region}"


class NotCloudFormation(ValueError):
    """An event whose response URL is not CloudFormation's: it is not answered or acted on."""


def check_response_url(url: str, *, region: str) -> None:
    """Refuse `url` unless it is an https URL of CloudFormation's response bucket in `region`
    (S3's virtual-hosted forms: global, regional with a dot or a dash)."""
    bucket = RESPONSE_BUCKET.format(region=region.replace("-", ""))
    hosts = {f"{bucket}.s3.amazonaws.com", f"{bucket}.s3.{region}.amazonaws.com",
             f"{bucket}.s3-{region}.amazonaws.com"}  # fmt: skip
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or parts.scheme != "https"
        or parts.hostname not in hosts
        or port not in (None, 443)
        or parts.username is not None
    ):
        raise NotCloudFormation(
            f"ResponseURL {url[:200]!r} is not CloudFormation's pre-signed URL in {bucket}: "
            "only CloudFormation's own custom resource requests are served"
        )


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
    region: str,
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Reconcile the objects `objects_of(properties, applying)` names and answer CloudFormation;
    `applying` is False for the objects of a previous revision or of a delete. `kubernetes()`
    is called inside, so not reaching the cluster is an answer too. `prepare(properties)`, on
    Create and Update, changes what the cluster has that is not ours to own, first. An event
    that is not CloudFormation's (`check_response_url`) raises `NotCloudFormation` first."""
    check_response_url(event["ResponseURL"], region=region)
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


def apply_rbac(
    event: dict[str, Any],
    *,
    prefix: str,
    region: str,
    kubernetes: Callable[[], KubernetesClient],
    respond: Respond,
) -> None:
    """The deployment's RBAC (`deployment_rbac`), with the Nova launcher's objects where the
    revision's `NovaLauncher` property is "true"."""
    custom_resource(
        event,
        physical_id=f"{prefix}-pipeline-rbac",
        objects_of=lambda properties, applying: rbac_of(prefix, properties),
        kubernetes=kubernetes,
        respond=respond,
        region=region,
    )


def eks_kubernetes(settings: ClusterSettings, clients: Clients) -> Callable[[], KubernetesClient]:
    """The client of the function's EKS cluster, as the function's role."""
    cluster, region = settings.eks_cluster, settings.region
    return lambda: KubernetesClient.for_eks(
        clients("eks"), cluster, token=EksTokenSource(cluster, sts=regional_sts(clients, region))
    )


def compose(
    environment: Mapping[str, str], clients: Clients, *, respond: Respond | None = None
) -> dict[str, Handler]:
    """`respond`: how answers reach CloudFormation's bucket (`put_answer`)."""
    settings = RbacSettings.from_environment(environment)
    apply = functools.partial(
        apply_rbac,
        prefix=settings.prefix,
        region=settings.region,
        kubernetes=eks_kubernetes(settings, clients),
        respond=respond or put_answer,
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
