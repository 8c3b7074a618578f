"""The pipeline's Kubernetes RBAC: valid objects that cover exactly what a run's job needs, and
the deploy-time custom resource that applies and removes them (against the fake API server)."""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import kubernetes_validate
import pytest

from lambdas.kubernetes import bootstrap
from lambdas.kubernetes.client import KINDS
from lambdas.kubernetes.rbac import pipeline_rbac
from lambdas.kubernetes.training_job import render
from tests.kubernetes.fake_api import FakeKubernetes, client_of
from tests.kubernetes.test_training_job import request

EVENT = {
    "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/nova-mtrl-pipeline/1",
    "RequestId": "req-1",
    "LogicalResourceId": "PipelineRbac",
    "ResponseURL": "https://cloudformation-response.s3.amazonaws.com/signed",
    "ResourceProperties": {"Objects": json.dumps(pipeline_rbac("nova-mtrl"))},
}


def test_objects_validate_against_the_kubernetes_schemas() -> None:
    for obj in pipeline_rbac("nova-mtrl"):
        kubernetes_validate.validate(obj, "1.33", strict=True)


@pytest.mark.parametrize("kind", ["HyperPodPyTorchJob", "PyTorchJob"])
def test_the_role_and_the_fence_cover_every_kind_a_run_creates(kind: str) -> None:
    role, _, policy, binding = pipeline_rbac("nova-mtrl")
    allowed = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]
    }  # fmt: skip
    fenced = {
        (group, resource)
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        for group in rule["apiGroups"] for resource in rule["resources"]
    }  # fmt: skip
    for obj in render(replace(request("rft_multiturn_lora"), kind=kind)):
        api = KINDS[(obj["apiVersion"], obj["kind"])]
        group = "" if api.api_version == "v1" else api.api_version.split("/")[0]
        # Server-side apply creates with PATCH; teardown deletes; status reads.
        assert {"create", "patch", "get", "delete"} <= allowed[(group, api.plural)], obj["kind"]
        assert (group, api.plural) in fenced, obj["kind"]
    assert {"get", "list"} <= allowed[("", "pods")] and ("", "pods") not in fenced
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert "'nova-mtrl-run-'" in policy["spec"]["validations"][0]["expression"]


def test_custom_resource_applies_then_removes_and_always_answers(
    api: FakeKubernetes,
) -> None:
    client = client_of(api)
    answers: list[tuple[str, dict]] = []
    respond = lambda url, answer: answers.append((url, answer))  # noqa: E731
    on_event = functools.partial(
        bootstrap.apply_inline, prefix="nova-mtrl", kubernetes=lambda: client, respond=respond
    )

    on_event({**EVENT, "RequestType": "Create"})
    assert answers[-1][0] == EVENT["ResponseURL"]
    assert answers[-1][1]["Status"] == "SUCCESS" and answers[-1][1]["Data"] == {"Objects": 4}
    assert answers[-1][1]["PhysicalResourceId"] == "nova-mtrl-pipeline-rbac"
    assert "nova-mtrl-pipeline" in api.objects["/apis/rbac.authorization.k8s.io/v1/clusterroles"]
    policies = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    assert list(api.objects[policies]) == ["nova-mtrl-pipeline-run-namespaces-only"]

    deleted = {**EVENT, "RequestType": "Delete", "PhysicalResourceId": "nova-mtrl-pipeline-rbac"}
    on_event(deleted)
    assert answers[-1][1]["Status"] == "SUCCESS" and answers[-1][1]["Data"] == {"Objects": 4}
    assert [path for path, items in api.objects.items() if items] == ["/api/v1/namespaces"]
    on_event(deleted)  # gone already: still fine
    assert answers[-1][1]["Data"] == {"Objects": 0}

    api.accepted.clear()  # the function lost its access entry
    updated = {
        **EVENT,
        "RequestType": "Update",
        "OldResourceProperties": EVENT["ResourceProperties"],
    }
    on_event(updated)
    assert answers[-1][1]["Status"] == "FAILED"
    assert answers[-1][1]["Reason"].startswith("KubernetesError: Kubernetes API 401")
