"""The deploy-time install of AWS's HyperPod Helm chart (lambdas/kubernetes/chart_install.py)
against the fake API server, which refuses objects in a namespace that does not exist yet:
create in a working order, update to a new rendering (what the chart dropped goes), delete
everything, and fail the deploy with the reason — a rendering for another region, the API's
own message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from lambdas.kubernetes import chart_install
from tests.chart_rendering import rendering
from tests.kubernetes import eks_addons
from tests.kubernetes.fake_api import FakeKubernetes, client_of
from tests.kubernetes.test_rbac import RESPONSE_URL

BUCKET = "cdk-hnb659fds-assets-123456789012-us-east-1"
EVENT = {
    "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/nova-mtrl-compute/1",
    "RequestId": "req-1",
    "LogicalResourceId": "HyperPodChart",
    "ResponseURL": RESPONSE_URL,
}
DAEMONSETS = "/apis/apps/v1/namespaces/kube-system/daemonsets"


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def upload(
    s3: Any, key: str, objects: list[dict[str, Any]], region: str = "us-east-1",
    restricted: bool = False,
) -> dict:  # fmt: skip
    """A rendering as stacks/render_hyperpod_chart.py writes it (namespaces filled in)."""
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            obj["metadata"].setdefault("namespace", "kube-system")
    body = {"commit": "c", "release": "hyperpod-dependencies", "region": region,
            "objects": objects, "restricted": restricted}  # fmt: skip
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(body).encode())
    return {"Manifest": {"Bucket": BUCKET, "Key": key}}


def call(api: FakeKubernetes, s3: Any, event: dict[str, Any]) -> dict[str, Any]:
    answers: list[dict[str, Any]] = []
    client = client_of(api)
    chart_install.install_chart(
        {**EVENT, **event}, s3=s3, region="us-east-1",
        release="nova-mtrl-eks/hyperpod-dependencies", kubernetes=lambda: client,
        respond=lambda url, answer: answers.append(answer),
    )  # fmt: skip
    (answer,) = answers
    return answer


def test_installs_in_a_working_order_then_updates_and_removes_everything(
    api: FakeKubernetes, s3: Any
) -> None:
    first = upload(s3, "v1.json", rendering())
    created = call(api, s3, {"RequestType": "Create", "ResourceProperties": first})
    assert created["Status"] == "SUCCESS", created
    assert created["PhysicalResourceId"] == "nova-mtrl-eks/hyperpod-dependencies"
    assert created["Data"] == {"Objects": 7}
    # The namespace came before what lives in it (the API refuses otherwise).
    assert "aws-hyperpod" in api.objects["/api/v1/namespaces"]
    applied = [path for method, path, _ in api.requests if method == "PATCH"]
    assert applied[0].startswith("/api/v1/namespaces/aws-hyperpod?")
    assert set(api.objects[DAEMONSETS]) == {
        "hyperpod-dependencies-nvidia-device-plugin",
        "hyperpod-dependencies-aws-efa-k8s-device-plugin",
    }

    # A new rendering without the EFA plugin: applied, and the plugin it dropped is deleted.
    second = upload(s3, "v2.json", rendering(plugins=("nvidia-device-plugin",)))
    updated = call(api, s3, {
        "RequestType": "Update", "PhysicalResourceId": created["PhysicalResourceId"],
        "ResourceProperties": second, "OldResourceProperties": first,
    })  # fmt: skip
    assert updated["Status"] == "SUCCESS", updated
    assert set(api.objects[DAEMONSETS]) == {"hyperpod-dependencies-nvidia-device-plugin"}

    deleted = call(api, s3, {
        "RequestType": "Delete", "PhysicalResourceId": created["PhysicalResourceId"],
        "ResourceProperties": second,
    })  # fmt: skip
    assert deleted["Status"] == "SUCCESS" and deleted["Data"] == {"Objects": 6}
    assert not api.objects[DAEMONSETS]
    assert set(api.objects["/api/v1/namespaces"]) == {"default", "kube-system"}
    deletes = [path for method, path, _ in api.requests if method == "DELETE"]
    assert deletes[-1] == "/api/v1/namespaces/aws-hyperpod"  # what others live in goes last


def test_a_rendering_for_another_region_fails_the_deploy_and_installs_nothing(
    api: FakeKubernetes, s3: Any
) -> None:
    properties = upload(s3, "v1.json", rendering(), region="us-west-2")
    answer = call(api, s3, {"RequestType": "Create", "ResourceProperties": properties})
    assert answer["Status"] == "FAILED"
    assert "rendered for us-west-2 but this deploys to us-east-1" in answer["Reason"]
    assert "set `region` in cdk.json" in answer["Reason"]
    assert not [r for r in api.requests if r[0] == "PATCH"]
    # CloudFormation's rollback deletes what the refused create made: nothing, and says so.
    rollback = call(api, s3, {"RequestType": "Delete", "ResourceProperties": properties,
                              "PhysicalResourceId": answer["PhysicalResourceId"]})  # fmt: skip
    assert (rollback["Status"], rollback["Data"]) == ("SUCCESS", {"Objects": 0})
    assert not [r for r in api.requests if r[0] == "DELETE"]
    # An update back from it (the rollback of a failed update) installs the good rendering and
    # has nothing of the refused one to remove.
    good = upload(s3, "good.json", rendering())
    back = call(api, s3, {"RequestType": "Update", "ResourceProperties": good,
                          "OldResourceProperties": properties,
                          "PhysicalResourceId": answer["PhysicalResourceId"]})  # fmt: skip
    assert (back["Status"], back["Data"]) == ("SUCCESS", {"Objects": 7})


def test_the_apis_refusal_reaches_cloudformation(api: FakeKubernetes, s3: Any) -> None:
    # An object in a namespace the chart never creates: the API's own message is the reason.
    stray = {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "agent", "namespace": "nowhere"}}  # fmt: skip
    properties = upload(s3, "v1.json", [*rendering(), stray])
    answer = call(api, s3, {"RequestType": "Create", "ResourceProperties": properties})
    assert answer["Status"] == "FAILED"
    assert answer["Reason"] == (
        'KubernetesError: Kubernetes API 404 NotFound: namespaces "nowhere" not found'
    )


def test_for_restricted_groups_the_add_ons_copies_go_with_the_chart_and_aws_node_stays_off(
    api: FakeKubernetes, s3: Any
) -> None:
    """As AWS's RIG dependencies: `rig-aws-node` and `rig-coredns` made from the cluster's own
    add-ons, installed and removed with the chart; the standard `aws-node` kept off restricted
    nodes — changed, not owned: a delete leaves it (and coredns) where EKS put it."""
    eks_addons.install(api.objects)
    properties = upload(s3, "rig.json", rendering(), restricted=True)
    reads: list[dict] = []
    s3.meta.events.register("before-call.s3.GetObject", lambda params, **_: reads.append(params))
    created = call(api, s3, {"RequestType": "Create", "ResourceProperties": properties})
    assert len(reads) == 1  # the rendering is read once, for the change to aws-node and the rest
    assert (created["Status"], created["Data"]) == ("SUCCESS", {"Objects": 9}), created
    daemonsets = api.objects[DAEMONSETS]
    assert {"rig-aws-node", "rig-coredns"} <= set(daemonsets)
    assert daemonsets["rig-coredns"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "sagemaker.amazonaws.com/instance-group-type": "Restricted"
    }
    terms = daemonsets["aws-node"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][-1]["operator"] == "NotIn"
    # The same deploy again (an update to an equal rendering): aws-node is not changed again.
    patches = [p for m, p, _ in api.requests if m == "PATCH" and "/daemonsets/aws-node?" in p]
    again = call(api, s3, {"RequestType": "Update", "ResourceProperties": properties,
                           "OldResourceProperties": properties,
                           "PhysicalResourceId": created["PhysicalResourceId"]})  # fmt: skip
    assert again["Status"] == "SUCCESS"
    assert [p for m, p, _ in api.requests if m == "PATCH" and "/daemonsets/aws-node?" in p] == (
        patches
    )
    rig = daemonsets["rig-aws-node"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    (term,) = rig["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][-1]["operator"] == "In"
    deleted = call(api, s3, {"RequestType": "Delete", "ResourceProperties": properties,
                             "PhysicalResourceId": created["PhysicalResourceId"]})  # fmt: skip
    assert (deleted["Status"], deleted["Data"]) == ("SUCCESS", {"Objects": 9})
    assert set(api.objects[DAEMONSETS]) == {"aws-node"}
    assert "coredns" in api.objects["/apis/apps/v1/namespaces/kube-system/deployments"]


def test_a_restricted_rendering_for_another_region_changes_nothing_on_the_cluster(
    api: FakeKubernetes, s3: Any
) -> None:
    eks_addons.install(api.objects)
    properties = upload(s3, "rig.json", rendering(), region="us-west-2", restricted=True)
    answer = call(api, s3, {"RequestType": "Create", "ResourceProperties": properties})
    assert answer["Status"] == "FAILED" and "rendered for us-west-2" in answer["Reason"]
    assert not [r for r in api.requests if r[0] == "PATCH"]  # aws-node untouched too


def test_restricted_groups_without_the_add_ons_fail_the_deploy_saying_which(
    api: FakeKubernetes, s3: Any
) -> None:
    properties = upload(s3, "rig.json", rendering(), restricted=True)
    answer = call(api, s3, {"RequestType": "Create", "ResourceProperties": properties})
    assert answer["Status"] == "FAILED"
    assert answer["Reason"] == (
        "ValueError: no DaemonSet aws-node in kube-system: restricted instance groups need a "
        "copy of the EKS add-on vpc-cni's; install the add-on (stacks/components/eks.py does)"
    )
    assert not [r for r in api.requests if r[0] == "PATCH"]
