"""Done-when of the compute backends: the synthesized state machine, executed by moto's
interpreter with the AWS backends selected — the ECS reward fleet on moto ECS (a Fargate
stand-in marks the wanted tasks running: moto runs none), the HyperPod training cluster on the
fake Kubernetes API and the recorded SageMaker fake — submits the job, scales the fleet, sees
the job finish, and tears down every object, service and instance it created."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest

from lambdas.kubernetes.client import KubernetesClient
from lambdas.kubernetes.training_job import run_namespace
from lambdas.pipeline import backends
from lambdas.pipeline.ecs_fleet import EcsRewardFleet
from lambdas.pipeline.hyperpod_capacity import CapacityLeases, HyperPodCapacity
from lambdas.pipeline.hyperpod_training import HyperPodSettings, HyperPodTrainingCluster
from mtrl.local.embedded import LocalPipeline
from tests.conftest import Synthesized
from tests.kubernetes.fake_api import FakeKubernetes
from tests.local.test_pipeline_execution import (
    GOOD,
    _finish,
    _notifications,
    _run_queues,
    _upload,
    deployed_pipeline,
)
from tests.pipeline.fake_eks import FakeEks
from tests.pipeline.fake_sagemaker import FakeSageMaker
from tests.pipeline.test_ecs_fleet import Recorded, deploy_fleet_base

TOKEN = "k8s-aws-v1.valid"
BACKEND = "aws-at-the-boundary"


class Fargate(Recorded):
    """moto's ECS does not run tasks: report a service's wanted tasks as running."""

    def describe_services(self, **request: object) -> dict:
        self.calls.append(("describe_services", request))
        answer = self.client.describe_services(**request)
        for service in answer["services"]:
            if service["status"] == "ACTIVE":
                service["runningCount"] = service["desiredCount"]
        return answer


class JobController:
    """The training operator and kubelet, scripted: HyperPod's GPU nodes join as SageMaker runs
    them; the job runs once read, then completes — or, with `bad_image`, its trainer pod cannot
    pull its image."""

    def _nodes(self) -> None:
        (gpu,) = [g for g in self.sagemaker.groups if g["InstanceGroupName"] == "gpu"]
        self.api.objects["/api/v1/nodes"] = {
            f"hyperpod-{i}": {
                "metadata": {"name": f"hyperpod-{i}", "labels": {
                    "node.kubernetes.io/instance-type": gpu["InstanceType"],
                    "sagemaker.amazonaws.com/node-health-status": "Schedulable"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            for i in range(gpu["TargetCount"])
        }  # fmt: skip

    def __init__(self, api: FakeKubernetes, sagemaker: FakeSageMaker) -> None:
        self.api, self.sagemaker, self.reads, self.bad_image = api, sagemaker, 0, False

    def __call__(self, method: str, path: str) -> None:
        if path == "/api/v1/nodes":
            self._nodes()
        if method != "GET" or not path.endswith("/hyperpodpytorchjobs/trainer"):
            return
        for collection, items in list(self.api.objects.items()):
            if collection.endswith("/hyperpodpytorchjobs") and "trainer" in items:
                self.reads += 1
                state = "Running" if self.reads == 1 or self.bad_image else "Completed"
                items["trainer"]["status"] = {"conditions": [{"type": state, "status": "True"}]}
                if self.bad_image:
                    pods = collection.replace(
                        "/apis/sagemaker.amazonaws.com/v1", "/api/v1"
                    ).replace("/hyperpodpytorchjobs", "/pods")
                    self.api.objects.setdefault(pods, {})["trainer-0"] = {
                        "metadata": {"name": "trainer-0"},
                        "status": {"containerStatuses": [{
                            "name": "pytorch", "image": "trainer:missing",
                            "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
                        }]},
                    }  # fmt: skip


@pytest.fixture
def deployed(
    default_app: Synthesized, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LocalPipeline, dict, dict]]:
    with (
        FakeKubernetes() as api,
        deployed_pipeline(default_app, monkeypatch, backend=BACKEND) as (pipeline, clients),
    ):
        api.accepted.add(TOKEN)
        ecs = Fargate(boto3.client("ecs"))
        fleet = EcsRewardFleet(deploy_fleet_base(), ecs=ecs)
        sagemaker, eks = FakeSageMaker(), FakeEks()
        controller = JobController(api, sagemaker)
        api.on_request = controller
        # The settings as the stack wrote them for the functions.
        settings = HyperPodSettings.model_validate(
            {**pipeline.environment, "AWS_REGION": "us-east-1"}
        )
        cluster = HyperPodTrainingCluster(
            settings,
            kubernetes=KubernetesClient(
                api.endpoint, token=lambda **_: TOKEN, certificate_authority=api.ca_data
            ),
            capacity=HyperPodCapacity(
                sagemaker,
                CapacityLeases(boto3.client("dynamodb"), settings.runs_table),
                cluster="nova-mtrl",
                instance_group=settings.instance_group,
            ),
            eks=eks,
            s3=boto3.client("s3"),
        )
        backends.register_fleet(BACKEND, lambda: fleet)
        backends.register_cluster(BACKEND, lambda: cluster)
        yield (
            pipeline,
            clients,
            {
                "api": api,
                "ecs": ecs,
                "sagemaker": sagemaker,
                "fleet": fleet,
                "eks": eks,
                "controller": controller,
            },
        )


def test_a_run_on_the_aws_backends_submits_scales_finishes_and_leaves_nothing(deployed) -> None:
    pipeline, clients, aws = deployed
    api, ecs, sagemaker = aws["api"], aws["ecs"], aws["sagemaker"]
    started = _upload(pipeline, clients, "training-data/wordle.jsonl", GOOD)
    described = _finish(clients, started["execution_arn"])
    assert described["status"] == "SUCCEEDED", described
    run_id = started["run_id"]
    namespace = run_namespace("nova-mtrl", run_id)

    # GPU nodes: up to the config's 4 for the run, back to zero after it.
    counts = [update["InstanceGroups"][1]["InstanceCount"] for update in sagemaker.updates]
    assert counts == [4, 0]
    # Nodes counted ready only once Kubernetes could schedule on them.
    assert any(path.startswith("/api/v1/nodes?") for method, path, _ in api.requests)
    # The job: every object applied in the run's namespace, read until complete, then deleted.
    applied = [path.split("?")[0] for method, path, _ in api.requests if method == "PATCH"]
    assert applied[0] == f"/api/v1/namespaces/{namespace}"
    assert applied[-1].endswith(f"/namespaces/{namespace}/hyperpodpytorchjobs/trainer")
    assert ("DELETE", f"/api/v1/namespaces/{namespace}") in [
        (m, p.split("?")[0]) for m, p, _ in api.requests
    ]
    assert not any(items for path, items in api.objects.items() if namespace in path)
    assert namespace not in api.objects["/api/v1/namespaces"]
    created_associations = [
        op for op, _ in aws["eks"].requests if op == "CreatePodIdentityAssociation"
    ]
    assert len(created_associations) == 1 and aws["eks"].associations == {}
    # The fleet: a service with the config's 4 workers, then nothing of it.
    (created,) = [call for name, call in ecs.calls if name == "create_service"]
    assert created["desiredCount"] == 4
    assert [name for name, _ in ecs.calls].count("delete_service") == 1
    service = boto3.client("ecs").describe_services(
        cluster="nova-mtrl-reward-workers", services=[created["serviceName"]]
    )["services"]
    assert all(s["status"] != "ACTIVE" for s in service)
    families = boto3.client("ecs").list_task_definitions(
        familyPrefix=aws["fleet"].family_name
        if hasattr(aws["fleet"], "family_name")
        else created["taskDefinition"].split("/")[-1].split(":")[0],
        status="ACTIVE",
    )["taskDefinitionArns"]
    assert families == []
    assert boto3.client("ssm").describe_parameters()["Parameters"] == []
    # Router resources too, and the notification says so.
    assert _run_queues(clients) == []
    output = json.loads(described["output"])
    assert output["teardown"]["leftover"] == 0
    assert (
        output["released"]["job_objects_deleted"] == 7
        and output["released"]["workers_stopped"] >= 1
    )
    (notice,) = _notifications(clients)
    assert notice.startswith(f"nova-mtrl run {run_id} SUCCEEDED")


def test_a_job_that_cannot_start_fails_the_run_with_the_reason_and_leaves_nothing(
    deployed,
) -> None:
    pipeline, clients, aws = deployed
    aws["controller"].bad_image = True
    started = _upload(pipeline, clients, "training-data/wordle.jsonl", GOOD)
    described = _finish(clients, started["execution_arn"])
    assert described["status"] == "FAILED" and described["error"] == "TrainingJobFailed"
    reason = "image pull failed for trainer:missing (pod trainer-0, container pytorch): not found"
    assert described["cause"] == f"failed: {reason}"
    (notice,) = _notifications(clients)
    assert reason in notice
    assert [u["InstanceGroups"][1]["InstanceCount"] for u in aws["sagemaker"].updates] == [4, 0]
    namespace = run_namespace("nova-mtrl", started["run_id"])
    assert not any(items for path, items in aws["api"].objects.items() if namespace in path)
    assert namespace not in aws["api"].objects["/api/v1/namespaces"]
    assert aws["eks"].associations == {}
    assert _run_queues(clients) == []
