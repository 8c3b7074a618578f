"""The pipeline's Kubernetes RBAC: valid objects that cover exactly what a run's job needs, and
the deploy-time custom resource that applies and removes them (against the fake API server)."""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import kubernetes_validate
import pytest

from domain.kubernetes_kinds import KINDS
from domain.kubernetes_rbac import (
    PRIVILEGED_ACCOUNTS,
    launcher_group,
    nova_launcher_rbac,
    pipeline_rbac,
    rbac_properties,
)
from domain.nova_job import evaluation_image, image_repositories, images, init_container_image
from lambdas.kubernetes import bootstrap
from lambdas.kubernetes.training_job import render
from tests.kubernetes.admission import verdict
from tests.kubernetes.fake_api import FakeKubernetes, client_of
from tests.kubernetes.test_training_job import request

# As CloudFormation sends it: a pre-signed URL in its response bucket of the stack's region.
RESPONSE_URL = (
    "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/"
    "arn%3Aaws%3Acloudformation%3Aus-east-1%3A123456789012%3Astack/nova-mtrl-pipeline/1"
    "%7CPipelineRbac%7Creq-1?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=0"
)
EVENT = {
    "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/nova-mtrl-pipeline/1",
    "RequestId": "req-1",
    "LogicalResourceId": "PipelineRbac",
    "ResponseURL": RESPONSE_URL,
    "ResourceProperties": rbac_properties("nova-mtrl", nova_launcher=False),
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


def test_the_pipeline_role_grants_exactly_what_a_run_needs() -> None:
    """What the threat model (docs/operators/security.md) says the pipeline group may do, and nothing more."""
    role = pipeline_rbac("nova-mtrl")[0]
    granted = {
        (group or "core", resource): tuple(sorted(rule["verbs"]))
        for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]
    }  # fmt: skip
    write = tuple(sorted(["get", "list", "create", "patch", "update", "delete"]))
    assert granted == {
        ("core", "namespaces"): write, ("core", "serviceaccounts"): write,
        ("core", "configmaps"): write, ("sagemaker.amazonaws.com", "hyperpodpytorchjobs"): write,
        ("kubeflow.org", "pytorchjobs"): write,
        ("core", "pods"): ("get", "list"), ("core", "events"): ("get", "list"),
        ("core", "nodes"): ("get", "list"),
    }  # fmt: skip


def test_custom_resource_applies_then_removes_and_always_answers(
    api: FakeKubernetes,
) -> None:
    client = client_of(api)
    answers: list[tuple[str, dict]] = []
    respond = lambda url, answer: answers.append((url, answer))  # noqa: E731
    on_event = functools.partial(
        bootstrap.apply_rbac, prefix="nova-mtrl", region="us-east-1", kubernetes=lambda: client,
        respond=respond,
    )  # fmt: skip

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


def test_the_objects_come_from_the_code_never_from_the_event(api: FakeKubernetes) -> None:
    """Whoever may invoke the bootstrap (it is cluster admin) cannot make it apply objects of
    their own: properties other than the set's name and digest are not read."""
    client = client_of(api)
    answers: list[dict] = []
    on_event = functools.partial(
        bootstrap.apply_rbac, prefix="nova-mtrl", region="us-east-1", kubernetes=lambda: client,
        respond=lambda url, answer: answers.append(answer),
    )  # fmt: skip
    admin = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "intruder-is-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "intruders"}],
    }  # fmt: skip
    properties = {**EVENT["ResourceProperties"], "Objects": json.dumps([admin])}
    on_event({**EVENT, "RequestType": "Create", "ResourceProperties": properties})
    assert answers[-1]["Status"] == "SUCCESS"
    bindings = api.objects["/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"]
    assert list(bindings) == ["nova-mtrl-pipeline"]

    # The one choice the event has: with or without the launcher's objects, both ours.
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeflow"}})
    launcher = {**properties, **rbac_properties("nova-mtrl", nova_launcher=True)}
    on_event({**EVENT, "RequestType": "Update", "ResourceProperties": launcher,
              "OldResourceProperties": properties})  # fmt: skip
    roles = api.objects["/apis/rbac.authorization.k8s.io/v1/namespaces/kubeflow/roles"]
    assert list(roles) == [nova_launcher_rbac("nova-mtrl")[0]["metadata"]["name"]]
    assert answers[-1]["Data"] == {"Objects": 8}
    on_event({**EVENT, "RequestType": "Update", "ResourceProperties": properties,
              "OldResourceProperties": launcher})  # fmt: skip
    assert not api.objects["/apis/rbac.authorization.k8s.io/v1/namespaces/kubeflow/roles"]


def test_a_new_set_of_objects_is_a_new_revision() -> None:
    ours = rbac_properties("nova-mtrl", nova_launcher=False)
    assert ours != rbac_properties("nova-mtrl", nova_launcher=True)
    assert ours["Revision"] != rbac_properties("other", nova_launcher=False)["Revision"]
    assert ours == rbac_properties("nova-mtrl", nova_launcher=False)


@pytest.mark.parametrize(
    "url",
    [
        RESPONSE_URL,
        "https://cloudformation-custom-resource-response-useast1.s3.us-east-1.amazonaws.com/a?b=c",
        "https://cloudformation-custom-resource-response-useast1.s3-us-east-1.amazonaws.com/a",
    ],
)
def test_cloudformations_response_urls_are_answered(api: FakeKubernetes, url: str) -> None:
    answers: list[str] = []
    client = client_of(api)
    bootstrap.apply_rbac(
        {**EVENT, "RequestType": "Create", "ResponseURL": url}, prefix="nova-mtrl",
        region="us-east-1", kubernetes=lambda: client,
        respond=lambda to, answer: answers.append(to),
    )  # fmt: skip
    assert answers == [url]


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",  # the VPC's inside
        "http://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/a",  # no TLS
        "https://cloudformation-custom-resource-response-uswest2.s3.amazonaws.com/a",  # region
        "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com.evil.io/a",
        "https://cloudformation-custom-resource-response-useast1-x.s3.amazonaws.com/a",
        "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com:8443/a",
        "https://user@cloudformation-custom-resource-response-useast1.s3.amazonaws.com/a",
        "https://example.com/?cloudformation-custom-resource-response-useast1.s3.amazonaws.com",
        "https://[::1/a",
    ],
)
def test_any_other_response_url_is_refused_before_anything_is_done(
    api: FakeKubernetes, url: str
) -> None:
    answers: list[str] = []
    client = client_of(api)
    with pytest.raises(bootstrap.NotCloudFormation, match="is not CloudFormation's pre-signed"):
        bootstrap.apply_rbac(
            {**EVENT, "RequestType": "Create", "ResponseURL": url}, prefix="nova-mtrl",
            region="us-east-1", kubernetes=lambda: client,
            respond=lambda to, answer: answers.append(to),
        )  # fmt: skip
    assert answers == []
    assert [path for path, items in api.objects.items() if items] == ["/api/v1/namespaces"]


def _fence() -> dict:
    (policy,) = [
        o for o in nova_launcher_rbac("nova-mtrl") if o["kind"] == "ValidatingAdmissionPolicy"
    ]
    return policy


NOVA_IMAGES = images("us-east-1")
INIT_IMAGE = init_container_image("us-east-1")


def _workload(
    kind: str,
    account: str | None = None,
    *,
    field: str = "serviceAccountName",
    image: str = NOVA_IMAGES["storm"],
    init_image: str | None = INIT_IMAGE,
    lists: dict[str, list[dict]] | None = None,
) -> dict:
    """A workload as AWS's Nova chart makes them (launcher/nova/k8s_templates/RFT/templates:
    the prompter's pod has the init container, others a main container only), with the images
    AWS's launcher sets (`image`, `init_image`), `account` in `field`, and `lists` more."""
    spec: dict = {"containers": [{"name": "main", "image": image}]}
    if init_image is not None:
        spec["initContainers"] = [{"name": "init-container", "image": init_image}]
    if account is not None:
        spec[field] = account
    spec |= lists or {}
    template = {"metadata": {"labels": {"app": "nova"}}, "spec": spec}
    if kind == "PyTorchJob":
        master = {"containers": [{"name": "pytorch", "image": NOVA_IMAGES["training"]}]}
        replicas = {"Master": {"replicas": 1, "template": {"metadata": {}, "spec": master}},
                    "Worker": {"replicas": 1, "template": template}}  # fmt: skip
        return {"kind": kind, "apiVersion": "kubeflow.org/v1",
                "spec": {"pytorchReplicaSpecs": replicas}}  # fmt: skip
    return {"kind": kind, "apiVersion": "apps/v1", "spec": {"template": template}}


def test_the_launcher_group_cannot_run_pods_as_the_training_operator() -> None:
    """RBAC does not limit which service account a workload's pods use; the admission policy
    does, for the launcher group in Nova's namespace (its expression run by a CEL evaluator)."""
    policy = _fence()
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kubeflow"}
    }
    launcher = [launcher_group("nova-mtrl"), "system:authenticated"]
    for kind in ("Deployment", "StatefulSet", "Job", "PyTorchJob"):
        for admitted in (None, "nova-rft", "default"):
            assert verdict(policy, groups=launcher, obj=_workload(kind, admitted)) is None
        for account in PRIVILEGED_ACCOUNTS:
            for field in ("serviceAccountName", "serviceAccount"):
                said = verdict(policy, groups=launcher, obj=_workload(kind, account, field=field))
                assert said == (
                    "the Nova launcher may not run pods as 'training-operator' in kubeflow: "
                    "they hold cluster-wide rights"
                ), (kind, field)
        # Not the launcher group: this policy is not the one that judges it.
        operator = _workload(kind, "training-operator")
        assert verdict(policy, groups=["system:masters"], obj=operator) is None
    bindings = [
        o
        for o in nova_launcher_rbac("nova-mtrl")
        if o["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    assert [b["spec"] for b in bindings] == [
        {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    ]


def test_the_launcher_group_runs_only_novas_images() -> None:
    """The launcher group's workloads in kubeflow take their images, every container's, from
    the repositories AWS's launcher and the SDK name (domain/nova_job.image_repositories): the
    chart's images as the launcher sets them and the evaluation image pass, by tag or digest;
    anything else, in any container list and in any replica of a PyTorchJob, is refused."""
    policy, launcher = _fence(), [launcher_group("nova-mtrl")]
    said = (
        "the Nova launcher may run only Nova's images in kubeflow, from AWS's repositories "
        + ", ".join(image_repositories())
    )
    digest = "@sha256:" + "a" * 64
    admitted = [*NOVA_IMAGES.values(), evaluation_image("us-west-2"),
                NOVA_IMAGES["training"].rpartition(":")[0] + digest]  # fmt: skip
    refused = [
        "nova:latest",
        "docker.io/library/busybox:latest",
        # Another account, a look-alike host, a repository that only starts like Nova's.
        NOVA_IMAGES["training"].replace("708977205387", "123456789012"),
        NOVA_IMAGES["training"].replace(".amazonaws.com/", ".amazonaws.com.example.org/"),
        NOVA_IMAGES["training"].replace("nova-fine-tune-repo:", "nova-fine-tune-repo-x:"),
        NOVA_IMAGES["training"].rpartition(":")[0],  # no tag: `latest` of whatever is pushed
    ]
    for kind in ("Deployment", "StatefulSet", "Job", "PyTorchJob"):
        for image in admitted:
            assert verdict(policy, groups=launcher, obj=_workload(kind, image=image)) is None
        for image in refused:
            assert verdict(policy, groups=launcher, obj=_workload(kind, image=image)) == said
            assert verdict(policy, groups=launcher, obj=_workload(kind, init_image=image)) == said
            sidecar = {"ephemeralContainers": [{"name": "debug", "image": image}]}
            assert verdict(policy, groups=launcher, obj=_workload(kind, lists=sidecar)) == said
        no_image = {"containers": [{"name": "main"}]}
        assert verdict(policy, groups=launcher, obj=_workload(kind, lists=no_image)) == said
        # Other groups are not this policy's to judge.
        other = _workload(kind, image="docker.io/library/busybox:latest")
        assert verdict(policy, groups=["system:masters"], obj=other) is None
