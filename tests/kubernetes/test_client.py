"""The Kubernetes client against a fake API server (HTTPS, the real paths and codes), and the
EKS token: its format and what its signature covers."""

from __future__ import annotations

import base64
import datetime
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest

from lambdas.kubernetes.client import KubernetesClient, KubernetesError
from lambdas.kubernetes.token import EksTokenSource, eks_token
from tests.kubernetes.fake_api import TOKEN, FakeKubernetes, client_of
from tests.service_fakes import FakeEks

JOB = {
    "apiVersion": "sagemaker.amazonaws.com/v1",
    "kind": "HyperPodPyTorchJob",
    "metadata": {"name": "trainer", "namespace": "run-1", "labels": {"nova-mtrl/run": "run-1"}},
    "spec": {"replicaSpecs": [{"name": "pods", "replicas": 1}]},
}


@pytest.fixture
def client(api: FakeKubernetes) -> KubernetesClient:
    return client_of(api)


def test_apply_creates_once_and_updates_in_place(
    api: FakeKubernetes, client: KubernetesClient
) -> None:
    with pytest.raises(KubernetesError, match='404 NotFound: namespaces "run-1" not found'):
        client.apply(JOB)  # objects go into a namespace that exists
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "run-1"}})
    api.requests.clear()
    created = client.apply(JOB)
    again = client.apply(JOB)
    assert again["metadata"]["uid"] == created["metadata"]["uid"]
    assert again["metadata"]["resourceVersion"] == "2"
    assert (
        len(api.objects["/apis/sagemaker.amazonaws.com/v1/namespaces/run-1/hyperpodpytorchjobs"])
        == 1
    )
    method, path, content_type = api.requests[0]
    url = urlsplit(path)
    assert (method, url.path, content_type) == (
        "PATCH",
        "/apis/sagemaker.amazonaws.com/v1/namespaces/run-1/hyperpodpytorchjobs/trainer",
        "application/apply-patch+yaml",
    )
    assert parse_qs(url.query) == {"fieldManager": ["nova-mtrl"], "force": ["true"]}


def test_get_list_and_delete(api: FakeKubernetes, client: KubernetesClient) -> None:
    client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "run-1"}})
    client.apply(JOB)
    other = {
        **JOB,
        "metadata": {**JOB["metadata"], "name": "x", "labels": {"nova-mtrl/run": "run-2"}},
    }
    client.apply(other)
    assert (
        client.get("sagemaker.amazonaws.com/v1", "HyperPodPyTorchJob", "trainer", "run-1")["spec"]
        == JOB["spec"]
    )
    assert client.get("v1", "Namespace", "run-1")["metadata"]["name"] == "run-1"
    listed = client.list(
        "sagemaker.amazonaws.com/v1",
        "HyperPodPyTorchJob",
        namespace="run-1",
        labels={"nova-mtrl/run": "run-1"},
    )
    assert [item["metadata"]["name"] for item in listed] == ["trainer"]
    assert (
        client.delete("sagemaker.amazonaws.com/v1", "HyperPodPyTorchJob", "trainer", "run-1")
        is True
    )
    assert (
        client.delete("sagemaker.amazonaws.com/v1", "HyperPodPyTorchJob", "trainer", "run-1")
        is False
    )
    assert (
        client.get("sagemaker.amazonaws.com/v1", "HyperPodPyTorchJob", "trainer", "run-1") is None
    )
    assert ("DELETE", "/api/v1/namespaces/run-1", "") not in api.requests


def test_an_expired_token_is_replaced_once(api: FakeKubernetes) -> None:
    minted: list[bool] = []

    def token(*, fresh: bool = False) -> str:
        minted.append(fresh)
        return TOKEN if fresh else "k8s-aws-v1.expired"

    client = KubernetesClient(api.endpoint, token=token, certificate_authority=api.ca_data)
    assert client.get("v1", "Namespace", "none") is None
    assert minted == [False, True]


def test_errors_carry_the_apis_status(api: FakeKubernetes) -> None:
    client = KubernetesClient(
        api.endpoint, token=lambda **_: "k8s-aws-v1.wrong", certificate_authority=api.ca_data
    )
    with pytest.raises(KubernetesError, match="Kubernetes API 401 Unauthorized") as raised:
        client.get("v1", "Namespace", "run-1")
    assert raised.value.status == 401


def test_the_cluster_ca_is_required(api: FakeKubernetes) -> None:
    untrusting = KubernetesClient(api.endpoint, token=lambda **_: TOKEN)
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusting.get("v1", "Namespace", "run-1")


def test_endpoint_and_ca_come_from_describe_cluster(
    api: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "test")
    eks = FakeEks(cluster="nova-mtrl", endpoint=api.endpoint, ca_data=api.ca_data)
    client = KubernetesClient.for_eks(eks.client(), "nova-mtrl", token=lambda **_: TOKEN)
    assert client.list("v1", "Pod", namespace="run-1") == []
    assert eks.operations("DescribeCluster") == [{"name": "nova-mtrl"}]


def _decoded(token: str) -> str:
    body = token.removeprefix("k8s-aws-v1.")
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def _sts() -> object:
    return boto3.client(
        "sts", region_name="us-west-2", aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret", endpoint_url="https://sts.us-west-2.amazonaws.com",
    )  # fmt: skip


def test_the_token_is_a_presigned_get_caller_identity_that_signs_the_cluster_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frozen = datetime.datetime(2026, 11, 30, 12, 0, 0)
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: frozen)
    token = eks_token("nova-mtrl", sts=_sts())
    assert token.startswith("k8s-aws-v1.") and "=" not in token
    url = urlsplit(_decoded(token))
    query = parse_qs(url.query)
    assert url.netloc == "sts.us-west-2.amazonaws.com"
    assert query["Action"] == ["GetCallerIdentity"] and query["X-Amz-Expires"] == ["60"]
    assert query["X-Amz-SignedHeaders"] == ["host;x-k8s-aws-id"]
    assert query["X-Amz-Credential"] == ["AKIDEXAMPLE/20261130/us-west-2/sts/aws4_request"]
    # The cluster name is signed: another cluster, same instant, another signature.
    other = parse_qs(urlsplit(_decoded(eks_token("other", sts=_sts()))).query)
    assert other["X-Amz-Signature"] != query["X-Amz-Signature"]
    again = parse_qs(urlsplit(_decoded(eks_token("nova-mtrl", sts=_sts()))).query)
    assert again["X-Amz-Signature"] == query["X-Amz-Signature"]


def test_the_token_source_renews_before_the_minute_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    minted: list[str] = []

    def mint(cluster: str, *, sts: object) -> str:
        minted.append(cluster)
        return f"k8s-aws-v1.{len(minted)}"

    monkeypatch.setattr("lambdas.kubernetes.token.eks_token", mint)
    now = [0.0]
    source = EksTokenSource("nova-mtrl", sts=object(), clock=lambda: now[0])
    assert source() == "k8s-aws-v1.1"
    now[0] = 40.0  # within the 60 s, outside the 15 s margin
    assert source() == "k8s-aws-v1.1"
    now[0] = 46.0
    assert source() == "k8s-aws-v1.2"
    assert source(fresh=True) == "k8s-aws-v1.3" and minted == ["nova-mtrl"] * 3
