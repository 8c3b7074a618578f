"""The HyperPod training plane: submit / status / delete against a fake Kubernetes API server
(HTTPS, real paths and codes), nodes through the recorded SageMaker fake and moto DynamoDB."""

from __future__ import annotations

import copy
import datetime
import json
import time
from dataclasses import replace
from typing import Any

import boto3
import pytest

from domain.backends import RunContext
from domain.episodes import EvaluationStage
from domain.naming import run_namespace
from domain.presets import PresetMismatch
from domain.trainer_job import job_from_environment
from lambdas.kubernetes.training_job import render
from lambdas.pipeline.hyperpod_capacity import CapacityLeases, HyperPodCapacity
from lambdas.pipeline.hyperpod_training import (
    HyperPodSettings,
    HyperPodTrainingCluster,
    JobStillDeleting,
    job_status,
)
from stacks.config import PlatformConfig, deployment_context
from tests.aws import create_leases_table
from tests.kubernetes.fake_api import FakeKubernetes, client_of
from tests.kubernetes.test_training_job import validate
from tests.service_fakes import FakeEks, FakeSageMaker
from training_configs.schema import load_training_config

JOB_ROLE = "arn:aws:iam::123456789012:role/nova-mtrl-training-job"
RUN = RunContext(
    run_id="wordle-0a1b2c3d4e",
    queues={
        "rollout_requests": "https://sqs/q-rollout-requests.fifo",
        "dlq": "https://sqs/q-dlq.fifo",
    },
    router_url=None,
    run_token="",
    bucket="nova-mtrl-data",
    dataset_key="training-data/wordle.jsonl",
    dataset_version=None,
    output_prefix="runs/wordle-0a1b2c3d4e/",
    # An open-weights model: Nova trains on the restricted group (nova_training.py).
    config=load_training_config("rft_multiturn_lora").model_copy(
        update={"model": "qwen3-8b", "instance_count": 1}
    ),
)
NAMESPACE = run_namespace("nova-mtrl", RUN.run_id)
JOBS = f"/apis/sagemaker.amazonaws.com/v1/namespaces/{NAMESPACE}/hyperpodpytorchjobs"


TRAINER_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/cdk-assets:trainer"


def settings(**overrides: Any) -> HyperPodSettings:
    presets = PlatformConfig.from_context(deployment_context()).model_presets
    return HyperPodSettings.model_validate(
        {
            "NAME_PREFIX": "nova-mtrl",
            "CAPACITY_LEASES_TABLE": "leases",
            "EKS_CLUSTER": "nova-mtrl-eks",
            "HYPERPOD_CLUSTER": "nova-mtrl",
            "HYPERPOD_INSTANCE_GROUP": "gpu",
            "HYPERPOD_INSTANCE_TYPE": "ml.p5.48xlarge",
            # As the pipeline stack fills them in: the image `cdk deploy` built.
            "MODEL_PRESETS": json.dumps(
                {k: {**v.model_dump(), "trainer_image": TRAINER_IMAGE} for k, v in presets.items()}
            ),
            "ACCOUNT_ID": "123456789012",
            "AWS_REGION": "us-east-1",
            "DELETE_WAIT_SECONDS": "10",
            "TRAINING_JOB_ROLE_ARN": JOB_ROLE,
            **overrides,
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def eks() -> FakeEks:
    return FakeEks()


def make_cluster(
    api: FakeKubernetes,
    clock: Clock,
    eks: FakeEks | None = None,
    sagemaker: FakeSageMaker | None = None,
    **overrides: Any,
) -> HyperPodTrainingCluster:
    db = boto3.client("dynamodb")
    create_leases_table(db, "leases")
    boto3.client("s3").create_bucket(Bucket=RUN.bucket)  # where the trainer writes its metrics
    return HyperPodTrainingCluster(
        settings(**overrides),
        kubernetes=client_of(api),
        capacity=HyperPodCapacity(
            (sagemaker or FakeSageMaker()).client(),
            CapacityLeases(db, "leases"),
            cluster="nova-mtrl",
            instance_group="gpu",
        ),
        eks=(eks or FakeEks()).client(),
        s3=boto3.client("s3"),
        clock=clock,
        sleep=clock.sleep,
    )


@pytest.fixture
def cluster(aws: None, api: FakeKubernetes, clock: Clock, eks: FakeEks) -> HyperPodTrainingCluster:
    return make_cluster(api, clock, eks)


def set_job_condition(api: FakeKubernetes, kind: str, **fields: str) -> None:
    job = api.objects[JOBS]["trainer"]
    job["status"] = {"conditions": [{"type": kind, "status": "True", **fields}]}


def add_pod(api: FakeKubernetes, name: str, status: dict[str, Any]) -> None:
    pods = api.objects.setdefault(f"/api/v1/namespaces/{NAMESPACE}/pods", {})
    pods[name] = {"metadata": {"name": name, "namespace": NAMESPACE}, "status": status}


def test_submit_applies_every_object_once_and_is_idempotent(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes, eks: FakeEks
) -> None:
    assert cluster.submit(RUN) == f"{NAMESPACE}/trainer"
    first = copy.deepcopy(api.objects)
    assert cluster.submit(RUN) == f"{NAMESPACE}/trainer"
    assert list(api.objects[JOBS]) == ["trainer"]
    assert (
        api.objects[JOBS]["trainer"]["metadata"]["uid"] == first[JOBS]["trainer"]["metadata"]["uid"]
    )
    applied = [(method, path.split("?")[0]) for method, path, _ in api.requests]
    assert applied[:4] == [
        ("PATCH", f"/api/v1/namespaces/{NAMESPACE}"),
        ("PATCH", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/run-workloads"),
        ("PATCH", f"/api/v1/namespaces/{NAMESPACE}/configmaps/run-settings"),
        ("PATCH", f"{JOBS}/trainer"),
    ]
    settings = api.objects[f"/api/v1/namespaces/{NAMESPACE}/configmaps"]["run-settings"]["data"]
    job = job_from_environment(settings)
    assert (job.bucket, job.output_prefix) == ("nova-mtrl-data", "runs/wordle-0a1b2c3d4e/")
    assert (job.dataset_key, job.queues) == ("training-data/wordle.jsonl", RUN.queues)
    (container,) = api.objects[JOBS]["trainer"]["spec"]["replicaSpecs"][0]["template"]["spec"][
        "containers"
    ]
    assert container["image"] == TRAINER_IMAGE
    # One Pod Identity association for the run's service account, made before any pod exists.
    (association,) = eks.associations.values()
    assert {k: association[k] for k in ("clusterName", "namespace", "serviceAccount", "roleArn")} == {
        "clusterName": "nova-mtrl-eks", "namespace": NAMESPACE, "serviceAccount": "run-workloads",
        "roleArn": JOB_ROLE,
    }  # fmt: skip
    operations = [operation for operation, _ in eks.requests]
    assert operations == [
        "ListPodIdentityAssociations", "CreatePodIdentityAssociation", "ListPodIdentityAssociations",
    ]  # fmt: skip


def test_a_model_without_preset_fails_before_anything_is_applied(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes
) -> None:
    with pytest.raises(PresetMismatch, match="model 'llama-9' has no preset.*qwen3-8b"):
        cluster.submit(replace(RUN, config=RUN.training.model_copy(update={"model": "llama-9"})))
    assert api.requests == []


def test_status_carries_the_trainers_last_step_from_its_metrics(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes
) -> None:
    s3 = boto3.client("s3")
    cluster.submit(RUN)
    set_job_condition(api, "Running")
    assert cluster.status(RUN).step is None  # no metrics yet
    lines = [
        json.dumps({"step": step, "mean_reward": 0.1, "pad": "x" * 900}) for step in range(1, 13)
    ]
    s3.put_object(
        Bucket=RUN.bucket, Key=f"{RUN.output_prefix}metrics.jsonl", Body="\n".join(lines) + "\n"
    )
    status = cluster.status(RUN)
    assert (status.phase, status.step) == ("running", 12)


def test_status_follows_the_job_conditions(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes
) -> None:
    assert cluster.status(RUN).phase == "failed"  # not submitted: says so
    cluster.submit(RUN)
    assert cluster.status(RUN).phase == "pending"
    set_job_condition(api, "Running")
    assert cluster.status(RUN).phase == "running"
    set_job_condition(api, "Completed")
    assert cluster.status(RUN).phase == "succeeded"
    set_job_condition(api, "Failed", message="NCCL timeout on rank 3")
    assert cluster.status(RUN) == cluster.status(RUN).__class__("failed", "NCCL timeout on rank 3")


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        ({"state": {"waiting": {"reason": "ImagePullBackOff", "message": "403 Forbidden"}},
          "image": "123.dkr.ecr/trainer:v1"},
         "image pull failed for 123.dkr.ecr/trainer:v1 (pod trainer-0, container pytorch): 403 Forbidden"),
        ({"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 4,
          "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}},
         "crash loop: pod trainer-0, container pytorch restarted 4 times (last exit code 1); see its logs"),
        ({"state": {"running": {}}, "restartCount": 1,
          "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}},
         "out of memory: pod trainer-0, container pytorch was OOMKilled; use a larger instance type or smaller batch"),
    ],
)  # fmt: skip
def test_pod_failures_fail_the_run_with_the_reason(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes, container: dict, expected: str
) -> None:
    cluster.submit(RUN)
    set_job_condition(api, "Running")
    add_pod(api, "trainer-0", {"containerStatuses": [{"name": "pytorch", **container}]})
    status = cluster.status(RUN)
    assert (status.phase, status.reason) == ("failed", expected)


def test_a_short_crash_loop_is_not_yet_a_failure() -> None:
    pod = {"metadata": {"name": "p", "creationTimestamp": None}, "status": {"containerStatuses": [
        {"name": "c", "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 1}]}}  # fmt: skip
    job = {"metadata": {}, "status": {"conditions": [{"type": "Running", "status": "True"}]}}
    assert job_status(job, [pod], now=0, pending_limit_seconds=60).phase == "running"


@pytest.mark.parametrize("condition", ["Running", "PodsRunning"])
def test_hyperpods_pods_running_condition_counts_as_running(condition: str) -> None:
    # Source: AWS's own HyperPodPyTorchJob test waits for either (aws/sagemaker-hyperpod-cli,
    # test/integration_tests/init/test_pytorch_job_creation.py).
    job = {"metadata": {}, "status": {"conditions": [{"type": condition, "status": "True"}]}}
    assert job_status(job, [], now=0, pending_limit_seconds=60).phase == "running"
    job["status"]["conditions"][0]["status"] = "False"
    assert job_status(job, [], now=0, pending_limit_seconds=60).phase == "pending"


def test_unschedulable_pods_wait_then_pend_too_long(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes, clock: Clock
) -> None:
    cluster.submit(RUN)
    add_pod(api, "trainer-0", {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]})  # fmt: skip
    status = cluster.status(RUN)
    assert status.phase == "pending"
    assert "unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu." in status.reason
    # Half an hour after the job was made (the API server stamped it, to the second).
    stamp = api.objects[JOBS]["trainer"]["metadata"]["creationTimestamp"]
    created = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    clock.now = created.timestamp() + 1801
    status = cluster.status(RUN)
    assert status.phase == "pending_too_long"
    assert status.reason.startswith("pending for 30 min: pod trainer-0 is unschedulable")


def test_delete_removes_the_namespace_and_waits_until_it_is_gone(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes, clock: Clock, eks: FakeEks
) -> None:
    cluster.submit(RUN)
    api.terminating_reads[NAMESPACE] = 3
    started = clock.now
    # namespace, job, service account, config map, Pod Identity association
    assert cluster.delete(RUN) == 5
    assert eks.associations == {}
    assert clock.now - started == 6  # three polls two seconds apart while it terminated
    assert not any(NAMESPACE in path for path in api.objects if api.objects[path])
    assert cluster.delete(RUN) == 0  # repeated: nothing left


def test_delete_that_outlasts_the_wait_raises_for_a_retry(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes
) -> None:
    cluster.submit(RUN)
    api.terminating_reads[NAMESPACE] = 100
    with pytest.raises(JobStillDeleting, match=f"namespace {NAMESPACE} is still terminating"):
        cluster.delete(RUN)


def add_node(api: FakeKubernetes, name: str, *, health: str = "Schedulable", ready: str = "True",
             cordoned: bool = False, instance_type: str = "ml.p5.48xlarge") -> None:  # fmt: skip
    api.objects.setdefault("/api/v1/nodes", {})[name] = {
        "metadata": {"name": name, "labels": {
            "node.kubernetes.io/instance-type": instance_type,
            "sagemaker.amazonaws.com/node-health-status": health}},
        "spec": {"unschedulable": cordoned},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }  # fmt: skip


def test_a_node_is_ready_once_running_and_schedulable(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes
) -> None:
    assert cluster.nodes_ready(RUN) == 0  # nothing running: Kubernetes is not even asked
    assert not any("/api/v1/nodes" in path for _, path, _ in api.requests)
    cluster.scale_up(RUN, instances=4)  # SageMaker now reports 4 running
    add_node(api, "hp-1")
    add_node(api, "hp-2")
    add_node(api, "hp-3", health="UnschedulablePendingReplacement")
    add_node(api, "hp-4", ready="False")
    add_node(api, "hp-5", cordoned=True)
    add_node(api, "cpu-1", instance_type="ml.m5.2xlarge")
    assert cluster.nodes_ready(RUN) == 2
    for name in ("hp-3", "hp-4", "hp-5", "hp-6"):
        add_node(api, name)
    assert cluster.nodes_ready(RUN) == 4  # never more than SageMaker has running


def test_nodes_scale_through_the_lease_with_keep_warm(
    aws: None, api: FakeKubernetes, clock: Clock
) -> None:
    sagemaker = FakeSageMaker()
    cluster = make_cluster(api, clock, sagemaker=sagemaker, KEEP_WARM_SECONDS="900")
    cluster.scale_up(RUN, instances=4)
    assert cluster.capacity.ready_nodes() == 4
    cluster.scale_down(RUN)
    assert sagemaker.groups[1]["TargetCount"] == 4  # kept warm
    assert cluster.capacity.scale_idle(keep_warm_seconds=900, now=clock.now + 900) is True
    assert sagemaker.groups[1]["TargetCount"] == 0


def test_an_evaluation_is_the_trainer_image_told_to_evaluate_in_a_job_of_its_own(
    cluster: HyperPodTrainingCluster, api: FakeKubernetes
) -> None:
    assert cluster.submit_evaluation(RUN, stage=EvaluationStage.BASELINE) == (
        f"{NAMESPACE}/evaluation-baseline"
    )
    configs = api.objects[f"/api/v1/namespaces/{NAMESPACE}/configmaps"]
    job = job_from_environment(configs["evaluation-baseline-settings"]["data"])
    assert job.evaluation is EvaluationStage.BASELINE and job.model_source == "Qwen/Qwen3-8B"
    evaluation = api.objects[JOBS]["evaluation-baseline"]
    (replica,) = evaluation["spec"]["replicaSpecs"]
    (container,) = replica["template"]["spec"]["containers"]
    assert container["envFrom"] == [{"configMapRef": {"name": "evaluation-baseline-settings"}}]
    assert container["image"] == TRAINER_IMAGE
    for obj in render(cluster.job_request(RUN), stage=EvaluationStage.FINAL):
        validate(obj)
    # Its status is its own job's, not the trainer's (which does not exist yet).
    stage = EvaluationStage.BASELINE
    assert cluster.evaluation_status(RUN, stage=stage).phase == "pending"
    evaluation["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    assert cluster.evaluation_status(RUN, stage=stage).phase == "succeeded"
    assert cluster.status(RUN).phase == "failed"
    assert cluster.evaluation_status(RUN, stage=EvaluationStage.FINAL).reason == (
        f"job {NAMESPACE}/evaluation-final does not exist"
    )
    # A pod of the evaluation that cannot start fails it; the trainer's pods do not.
    add_pod(api, "trainer-0", {"containerStatuses": [{"name": "pytorch", "state": {
        "waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 4}]})  # fmt: skip
    api.objects[f"/api/v1/namespaces/{NAMESPACE}/pods"]["trainer-0"]["metadata"]["labels"] = {
        "app.kubernetes.io/component": "trainer"
    }
    evaluation["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
    assert cluster.evaluation_status(RUN, stage=stage).phase == "running"
