"""Deploy-time custom resource: applies the pipeline's RBAC (lambdas/kubernetes/rbac.py) to the
EKS cluster, and removes it when the stack is deleted — with our own client, no kubectl layer.

CloudFormation calls this function directly (no provider framework) and waits for the answer
at the pre-signed `ResponseURL`; every outcome, errors included, is reported there.
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
from lambdas.kubernetes.rbac import pipeline_rbac
from lambdas.kubernetes.token import EksTokenSource

log = logging.getLogger(__name__)


def reconcile(kubernetes: KubernetesClient, *, prefix: str, request_type: str) -> int:
    """Apply (Create, Update) or delete (Delete) the pipeline's RBAC; returns objects touched."""
    objects = pipeline_rbac(prefix)
    if request_type == "Delete":
        return sum(
            kubernetes.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
            for obj in reversed(objects)
        )
    for obj in objects:
        kubernetes.apply(obj)
    return len(objects)


def on_event(
    event: dict[str, Any],
    context: Any = None,
    *,
    kubernetes: KubernetesClient | None = None,
    respond: Callable[[str, dict[str, Any]], None] | None = None,
) -> None:
    prefix = os.environ["NAME_PREFIX"]
    physical_id = event.get("PhysicalResourceId") or f"{prefix}-pipeline-rbac"
    answer = {
        "PhysicalResourceId": physical_id,
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
    }
    try:
        if kubernetes is None:
            cluster = os.environ["EKS_CLUSTER"]
            token = EksTokenSource(cluster, region=os.environ["AWS_REGION"])
            kubernetes = KubernetesClient.for_eks(boto3.client("eks"), cluster, token=token)
        touched = reconcile(kubernetes, prefix=prefix, request_type=event["RequestType"])
        answer |= {"Status": "SUCCESS", "Data": {"Objects": touched}}
    except Exception as error:  # noqa: BLE001 - CloudFormation must hear about every failure
        log.exception("RBAC %s failed", event["RequestType"])
        answer |= {"Status": "FAILED", "Reason": f"{type(error).__name__}: {error}"[:1000]}
    (respond or _put)(event["ResponseURL"], answer)


def _put(url: str, answer: dict[str, Any]) -> None:
    body = json.dumps(answer).encode()
    request = urllib.request.Request(
        url, data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    with urllib.request.urlopen(request, timeout=30):  # noqa: S310 - CloudFormation's S3 URL
        pass
