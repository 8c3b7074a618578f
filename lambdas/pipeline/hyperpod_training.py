"""The training plane on HyperPod (backend name "aws"): nodes through SageMaker, the job
through the EKS cluster's Kubernetes API.

- scale_up / nodes_ready / scale_down: the run's lease on the GPU instance group
  (lambdas/pipeline/hyperpod_capacity.py), with the deployment's keep-warm period; a node
  counts once SageMaker has it running and Kubernetes can schedule on it (Ready, not
  cordoned, and passed HyperPod's health checks);
- submit: server-side apply of the run's objects (lambdas/kubernetes/training_job.py), so a
  resubmission changes nothing, and an EKS Pod Identity association that gives the run's
  service account the deployment's training-job role (one per run: associations name one
  namespace);
- status: the job's conditions, the trainer's last step (from the tail of its metrics object
  under the run's outputs: stall detection), and what its pods say when it is stuck — image pull errors,
  crash loops and OOM kills fail the run with that reason; unschedulable pods keep it pending
  until `pending_limit_seconds`, then `pending_too_long`;
- submit_evaluation / evaluation_status: the same image, told to evaluate the starting or the
  trained model on the held-out records, as a job of its own (`evaluation-<stage>`);
- delete: the run's Pod Identity association and namespace (with everything in it), waiting
  until the namespace is gone.
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import Field, Json

from domain.backends import (
    METRICS_OBJECT,
    JobStatus,
    Phase,
    RunContext,
    TrainingCluster,
    last_step,
)
from domain.episodes import EvaluationStage
from domain.naming import RUN_SERVICE_ACCOUNT, run_namespace
from domain.presets import JobKind, ModelPreset, preset_for
from domain.trainer_job import TrainingJob
from lambdas.clients import Clients
from lambdas.environment import EnvironmentSettings
from lambdas.kubernetes.client import KubernetesClient
from lambdas.kubernetes.token import EksTokenSource, regional_sts
from lambdas.kubernetes.training_job import (
    COMPONENT_LABEL,
    JOB_API,
    RUN_LABEL,
    JobRequest,
    job_name,
    render,
)
from lambdas.pipeline.hyperpod_capacity import CapacityLeases, HyperPodCapacity

IMAGE_PULL_ERRORS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
CRASH_LOOP_RESTARTS = 3  # a container restarted this often is not coming back by itself
DONE = {"Succeeded", "Complete", "Completed"}  # Kubeflow says Succeeded, HyperPod Complete(d)
# HyperPod's operator may report PodsRunning where Kubeflow's says Running (AWS's own job test,
# aws/sagemaker-hyperpod-cli test/integration_tests/init/test_pytorch_job_creation.py).
RUNNING = {"Running", "PodsRunning"}
DELETE_POLL_SECONDS = 2.0
# HyperPod labels each node with the outcome of its health checks.
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


class JobStillDeleting(RuntimeError):
    """The run's namespace is still terminating (Step Functions retries the teardown step)."""


class ClusterSettings(EnvironmentSettings):
    """What every training plane on the deployment's HyperPod cluster reads from the functions'
    environment (set by the pipeline stack)."""

    prefix: str = Field(alias="NAME_PREFIX")
    leases_table: str = Field(alias="CAPACITY_LEASES_TABLE")
    eks_cluster: str = Field(alias="EKS_CLUSTER")
    hyperpod_cluster: str = Field(alias="HYPERPOD_CLUSTER")
    region: str = Field(alias="AWS_REGION")
    keep_warm_seconds: float = Field(default=0, ge=0, alias="KEEP_WARM_SECONDS")
    pending_limit_seconds: float = Field(default=1800, gt=0, alias="PENDING_LIMIT_SECONDS")

    def kubernetes(self, clients: Clients) -> Callable[[], KubernetesClient]:
        """The EKS cluster's Kubernetes API, as this function's role, made when first called."""

        def made() -> KubernetesClient:
            token = EksTokenSource(self.eks_cluster, sts=regional_sts(clients, self.region))
            return KubernetesClient.for_eks(clients("eks"), self.eks_cluster, token=token)

        return made

    def capacity(
        self, clients: Clients, instance_group: str, *, restricted: bool = False
    ) -> HyperPodCapacity:
        """The runs' leases on one of the cluster's instance groups, and its node count."""
        return HyperPodCapacity(
            clients("sagemaker"),
            CapacityLeases(clients("dynamodb"), self.leases_table),
            cluster=self.hyperpod_cluster,
            instance_group=instance_group,
            restricted=restricted,
        )


class HyperPodSettings(ClusterSettings):
    """The standard group's plane."""

    instance_group: str = Field(alias="HYPERPOD_INSTANCE_GROUP")
    instance_type: str = Field(alias="HYPERPOD_INSTANCE_TYPE")
    job_kind: JobKind = Field(default="HyperPodPyTorchJob", alias="TRAINING_JOB_KIND")
    presets: Json[dict[str, ModelPreset]] = Field(alias="MODEL_PRESETS")
    account: str = Field(alias="ACCOUNT_ID")
    job_role_arn: str = Field(alias="TRAINING_JOB_ROLE_ARN")
    delete_wait_seconds: float = Field(default=90, ge=0, alias="DELETE_WAIT_SECONDS")


class InstanceGroupPlane(TrainingCluster):
    """A training plane on one HyperPod instance group: the run's lease on its nodes, which count
    once SageMaker has them running and Kubernetes can schedule on them (Ready, not cordoned,
    passed HyperPod's health checks), and the keep-warm period."""

    def __init__(
        self,
        *,
        kubernetes: KubernetesClient | Callable[[], KubernetesClient],
        capacity: HyperPodCapacity,
        instance_type: str,
        keep_warm_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self._kubernetes = kubernetes
        self.capacity = capacity
        self._instance_type, self._keep_warm_seconds = instance_type, keep_warm_seconds
        self._clock = clock

    @functools.cached_property
    def kubernetes(self) -> KubernetesClient:
        """Made when first needed: steps that only scale nodes never reach for the EKS API."""
        made = self._kubernetes
        return made if isinstance(made, KubernetesClient) else made()

    def scale_up(self, run: RunContext, *, instances: int) -> None:
        self.capacity.scale_up(run.run_id, instances)

    def nodes_ready(self, run: RunContext) -> int:
        running = self.capacity.ready_nodes()
        if running == 0:
            return 0
        nodes = self.kubernetes.list(
            "v1",
            "Node",
            labels={INSTANCE_TYPE_LABEL: self._instance_type, HEALTH_LABEL: "Schedulable"},
        )
        return min(running, sum(1 for node in nodes if schedulable(node)))

    def scale_down(self, run: RunContext) -> None:
        self.capacity.scale_down(
            run.run_id, keep_warm_seconds=self._keep_warm_seconds, now=self._clock()
        )

    def release_idle(self, *, immediately: bool = False) -> bool:
        if immediately:
            return self.capacity.scale_unheld()
        return self.capacity.scale_idle(
            keep_warm_seconds=self._keep_warm_seconds, now=self._clock()
        )


class HyperPodTrainingCluster(InstanceGroupPlane):
    def __init__(
        self,
        settings: HyperPodSettings,
        *,
        kubernetes: KubernetesClient | Callable[[], KubernetesClient],
        capacity: HyperPodCapacity,
        eks: Any,
        s3: Any,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            kubernetes=kubernetes, capacity=capacity, instance_type=settings.instance_type,
            keep_warm_seconds=settings.keep_warm_seconds, clock=clock,
        )  # fmt: skip
        self.settings = settings
        self.eks, self.s3 = eks, s3
        self._sleep = sleep

    @classmethod
    def from_environment(
        cls, environment: Mapping[str, str], clients: Clients
    ) -> HyperPodTrainingCluster:
        settings = HyperPodSettings.from_environment(environment)
        return cls(
            settings, kubernetes=settings.kubernetes(clients),
            capacity=settings.capacity(clients, settings.instance_group), eks=clients("eks"),
            s3=clients("s3"),
        )  # fmt: skip

    def namespace(self, run: RunContext) -> str:
        return run_namespace(self.settings.prefix, run.run_id)

    # --- the job ---

    def job_request(self, run: RunContext) -> JobRequest:
        preset = preset_for(run.training, self.settings.presets)
        return JobRequest(
            job=TrainingJob.for_run(run),
            prefix=self.settings.prefix,
            preset=preset,
            account=self.settings.account,
            region=self.settings.region,
            kind=self.settings.job_kind,
        )

    def submit(self, run: RunContext) -> str:
        return self._apply(run, stage=None)

    def _apply(self, run: RunContext, *, stage: EvaluationStage | None) -> str:
        """The run's objects for its training job (or the evaluation of `stage`), applied."""
        objects = render(self.job_request(run), stage=stage)
        namespace = self.namespace(run)
        # First: pods get their credentials at admission, from the association that exists then.
        if not self._associations(namespace):
            self.eks.create_pod_identity_association(
                clusterName=self.settings.eks_cluster,
                namespace=namespace,
                serviceAccount=RUN_SERVICE_ACCOUNT,
                roleArn=self.settings.job_role_arn,
                tags={RUN_LABEL: run.run_id},
            )
        for obj in objects:
            self.kubernetes.apply(obj)
        return f"{namespace}/{job_name(stage)}"

    def _associations(self, namespace: str) -> list[str]:
        pages = self.eks.get_paginator("list_pod_identity_associations").paginate(
            clusterName=self.settings.eks_cluster, namespace=namespace
        )
        return [item["associationId"] for page in pages for item in page["associations"]]

    def status(self, run: RunContext) -> JobStatus:
        status = self._job_status(run, stage=None)
        step = last_step(self.s3, bucket=run.bucket, key=f"{run.output_prefix}{METRICS_OBJECT}")
        return replace(status, step=step)

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        """The trainer image evaluates: the baseline before training, the final checkpoint after
        it, each a job of its own on the run's node (domain/trainer_job.py `play_evaluation`)."""
        return self._apply(run, stage=stage)

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        return self._job_status(run, stage=stage)

    def _job_status(self, run: RunContext, *, stage: EvaluationStage | None) -> JobStatus:
        namespace = self.namespace(run)
        kind, name = self.settings.job_kind, job_name(stage)
        job = self.kubernetes.get(JOB_API[kind], kind, name, namespace)
        if job is None:
            return JobStatus(Phase.FAILED, f"job {namespace}/{name} does not exist")
        pods = [
            pod
            for pod in self.kubernetes.list("v1", "Pod", namespace=namespace)
            if pod["metadata"].get("labels", {}).get(COMPONENT_LABEL, name) == name
        ]
        return job_status(
            job, pods, now=self._clock(), pending_limit_seconds=self.settings.pending_limit_seconds
        )

    def delete(self, run: RunContext) -> int:
        """Delete the run's namespace and wait until it is gone; returns how many of the run's
        objects existed. Raises JobStillDeleting when it outlasts `delete_wait_seconds`."""
        namespace = self.namespace(run)
        associations = self._associations(namespace)
        for association in associations:
            self.eks.delete_pod_identity_association(
                clusterName=self.settings.eks_cluster, associationId=association
            )
        if self.kubernetes.get("v1", "Namespace", namespace) is None:
            return len(associations)
        kind = self.settings.job_kind
        existing = (
            1
            + len(associations)
            + sum(
                len(self.kubernetes.list(api, name, namespace=namespace))
                for api, name in (
                    (JOB_API[kind], kind),
                    ("v1", "ServiceAccount"),
                    ("v1", "ConfigMap"),
                )
            )
        )
        self.kubernetes.delete("v1", "Namespace", namespace)
        deadline = self._clock() + self.settings.delete_wait_seconds
        while self.kubernetes.get("v1", "Namespace", namespace) is not None:
            if self._clock() >= deadline:
                raise JobStillDeleting(f"namespace {namespace} is still terminating")
            self._sleep(DELETE_POLL_SECONDS)
        return existing


def job_status(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    *,
    now: float,
    pending_limit_seconds: float,
) -> JobStatus:
    """The job's phase from its conditions, and from its pods when they are stuck."""
    true = {
        c["type"]: c
        for c in job.get("status", {}).get("conditions", [])
        if c.get("status") == "True"
    }
    if "Failed" in true:
        condition = true["Failed"]
        return JobStatus(
            Phase.FAILED, condition.get("message") or condition.get("reason") or "the job failed"
        )
    if true.keys() & DONE:
        return JobStatus(Phase.SUCCEEDED)
    problem = pod_problem(pods)
    if problem:
        return JobStatus(Phase.FAILED, problem)
    if true.keys() & RUNNING:
        return JobStatus(Phase.RUNNING)
    waiting = unschedulable(pods) or "waiting for the training operator to start the job"
    created = _timestamp(job["metadata"].get("creationTimestamp"))
    if created is not None and now - created > pending_limit_seconds:
        minutes = int((now - created) // 60)
        return JobStatus(Phase.PENDING_TOO_LONG, f"pending for {minutes} min: {waiting}")
    return JobStatus(Phase.PENDING, waiting)


def pod_problem(pods: list[dict[str, Any]]) -> str | None:
    """The first pod failure that will not heal by waiting, as one line."""
    for pod in pods:
        name = pod["metadata"]["name"]
        status = pod.get("status", {})
        for container in status.get("initContainerStatuses", []) + status.get(
            "containerStatuses", []
        ):
            where = f"pod {name}, container {container['name']}"
            waiting = container.get("state", {}).get("waiting") or {}
            last = (container.get("lastState") or {}).get("terminated") or {}
            terminated = container.get("state", {}).get("terminated") or {}
            if waiting.get("reason") in IMAGE_PULL_ERRORS:
                image = container.get("image", "?")
                return f"image pull failed for {image} ({where}): {waiting.get('message') or waiting['reason']}"
            if "OOMKilled" in (last.get("reason"), terminated.get("reason")):
                return f"out of memory: {where} was OOMKilled; use a larger instance type or smaller batch"
            if (
                waiting.get("reason") == "CrashLoopBackOff"
                and container.get("restartCount", 0) >= CRASH_LOOP_RESTARTS
            ):
                exit_code = last.get("exitCode")
                return f"crash loop: {where} restarted {container['restartCount']} times (last exit code {exit_code}); see its logs"
    return None


def schedulable(node: dict[str, Any]) -> bool:
    ready = any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in node.get("status", {}).get("conditions", [])
    )
    return ready and not node.get("spec", {}).get("unschedulable", False)


def unschedulable(pods: list[dict[str, Any]]) -> str | None:
    for pod in pods:
        for condition in pod.get("status", {}).get("conditions", []):
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("reason") == "Unschedulable"
            ):
                return f"pod {pod['metadata']['name']} is unschedulable: {condition.get('message', '')}".rstrip(
                    ": "
                )
    return None


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
