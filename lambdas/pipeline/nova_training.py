"""The Nova training plane: a run's job is AWS's — the Forge BYOO recipe with the run's
overrides, rendered and installed by AWS's launcher (the launcher function,
lambdas/launcher/) — on the deployment's restricted instance group.

- scale_up / nodes_ready / scale_down: the run's lease on the restricted group
  (lambdas/pipeline/hyperpod_capacity.py, among the cluster's RestrictedInstanceGroups); a node
  counts once SageMaker has it running and Kubernetes can schedule on it;
- submit: the Forge recipe (read from its S3 location) with the overrides of
  domain/nova_job.py — the run's name, dataset, outputs, GPU split, training settings and the
  four BYOO endpoints of *this* run (its queues, its alias of the rollout forwarder) — handed
  to the launcher function, which starts it idempotently;
- status: the chart's PyTorchJob in the `kubeflow` namespace, its conditions and the pods of the
  job (image pulls, crash loops, OOM kills, pending too long fail the run with that reason);
  its progress is the run's reward curve, which the Nova job does not write: made from the
  rollout reports the router accepted (lambdas/pipeline/reward_curve.py);
- delete: the launcher function uninstalls the run's releases (everything the chart made).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import yaml
from pydantic import Field

from domain.backends import EvaluationUnsupported, JobStatus, Phase, RunContext
from domain.evaluation import EvaluationStage
from domain.nova_job import (
    FORGE_RECIPE_SOURCE,
    FORGE_RECIPES,
    NAMESPACE,
    NovaRefused,
    apply_overrides,
    byoo_endpoints,
    images,
    job_pattern,
    recipe_overrides,
    run_name,
    run_recipe,
)
from lambdas.clients import Clients
from lambdas.kubernetes.client import KubernetesClient
from lambdas.kubernetes.training_job import JOB_API
from lambdas.pipeline.hyperpod_capacity import HyperPodCapacity
from lambdas.pipeline.hyperpod_training import ClusterSettings, InstanceGroupPlane, job_status
from lambdas.pipeline.reward_curve import RewardCurve
from lambdas.router.conversations import ConversationStore

JOB_KIND = "PyTorchJob"  # the chart's trainer (templates/training.yaml), Kubeflow's
NOVA_GROUP_SETTING = "NOVA_INSTANCE_GROUP"  # set where the deployment has a restricted group
S3_URI = re.compile(r"^s3://([^/]+)/(.+)$")


class LaunchFailed(RuntimeError):
    """The launcher function failed; the message is what it said."""


class NovaSettings(ClusterSettings):
    """The restricted group's plane."""

    instance_group: str = Field(alias=NOVA_GROUP_SETTING)
    instance_type: str = Field(alias="NOVA_INSTANCE_TYPE")
    launcher: str = Field(alias="NOVA_LAUNCHER_FUNCTION")
    conversations_table: str = Field(alias="CONVERSATIONS_TABLE")
    # Where the Forge recipes are: `{recipe}` is a path of domain/nova_job.py's FORGE_RECIPES.
    recipe_source: str = Field(default=FORGE_RECIPE_SOURCE, alias="NOVA_RECIPE_SOURCE")


class NovaTrainingCluster(InstanceGroupPlane):
    def __init__(
        self,
        settings: NovaSettings,
        *,
        kubernetes: KubernetesClient | Callable[[], KubernetesClient],
        capacity: HyperPodCapacity,
        lambda_client: Any,
        s3: Any,
        curve: RewardCurve,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            kubernetes=kubernetes, capacity=capacity, instance_type=settings.instance_type,
            keep_warm_seconds=settings.keep_warm_seconds, clock=clock,
        )  # fmt: skip
        self.settings = settings
        self.lambda_client, self.s3, self.curve = lambda_client, s3, curve

    @classmethod
    def from_environment(
        cls, environment: Mapping[str, str], clients: Clients
    ) -> NovaTrainingCluster:
        settings = NovaSettings.from_environment(environment)
        return cls(
            settings, kubernetes=settings.kubernetes(clients),
            capacity=settings.capacity(clients, settings.instance_group, restricted=True),
            lambda_client=clients("lambda"), s3=clients("s3"),
            curve=RewardCurve(
                ConversationStore(clients("dynamodb"), settings.conversations_table), clients("s3")
            ),
        )  # fmt: skip

    def name(self, run: RunContext) -> str:
        return run_name(self.settings.prefix, run.run_id)

    # --- the job ---

    def recipe(self, run: RunContext) -> dict[str, Any]:
        """The Forge recipe of the run's config with the run's overrides."""
        config = run.training
        if run.rollout_request_arn is None:
            raise ValueError(f"run {run.run_id}: no rollout Lambda alias (Provision makes it)")
        source = self.settings.recipe_source.format(recipe=FORGE_RECIPES[config.recipe])
        found = S3_URI.match(source)
        if found is None:
            raise NovaRefused(f"NOVA_RECIPE_SOURCE {source!r} is not an s3://bucket/key URI")
        body = self.s3.get_object(Bucket=found.group(1), Key=found.group(2))["Body"].read()
        base = yaml.safe_load(body)
        if not isinstance(base, dict):
            raise NovaRefused(f"recipe {source}: expected a YAML mapping")
        overrides = recipe_overrides(
            config,
            name=self.name(run),
            data_s3_path=f"s3://{run.bucket}/{run.dataset_key}",
            output_s3_path=f"s3://{run.bucket}/{run.output_prefix}",
            byoo=byoo_endpoints(run.rollout_request_arn, lambda kind: run.queues[kind]),
            base_checkpoint=run.base.uri if run.base else None,
        )
        return apply_overrides(base, overrides)

    def submit(self, run: RunContext) -> str:
        config = run.training
        name = self.name(run)
        answer = self._launch(
            {
                "action": "start",
                "name": name,
                "recipe": run_recipe(config.recipe, name),
                "body": self.recipe(run),
                "instance_type": config.instance_type,
                "container": images(self.settings.region)["training"],
            }
        )
        return f"{NAMESPACE}/{answer['job']}"

    def status(self, run: RunContext) -> JobStatus:
        pattern = re.compile(job_pattern(self.name(run)))
        jobs = [
            job
            for job in self.kubernetes.list(JOB_API[JOB_KIND], JOB_KIND, namespace=NAMESPACE)
            if pattern.match(job["metadata"]["name"])
        ]
        if not jobs:
            return JobStatus(Phase.FAILED, f"the run's Nova job is not in namespace {NAMESPACE}")
        job = max(jobs, key=lambda item: item["metadata"]["creationTimestamp"])
        prefix = f"{job['metadata']['name']}-"
        pods = [
            pod
            for pod in self.kubernetes.list("v1", "Pod", namespace=NAMESPACE)
            if pod["metadata"]["name"].startswith(prefix)
        ]
        status = job_status(
            job, pods, now=self._clock(), pending_limit_seconds=self.settings.pending_limit_seconds
        )
        ended = status.phase in (Phase.SUCCEEDED, Phase.FAILED)
        return replace(status, step=self.curve.update(run, final=ended))

    # AWS's evaluation (the Forge SDK's RFT_MULTITURN_EVAL recipe over the same BYOO queues) is
    # not launched by the pipeline yet: Nova runs train without a held-out evaluation, and their
    # report says so.
    NO_EVALUATION = (
        "the Nova plane does not launch AWS's RFT multi-turn evaluation recipe yet; evaluate "
        "the model with the Nova Forge SDK (RFT_MULTITURN_EVAL)"
    )

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        raise EvaluationUnsupported(self.NO_EVALUATION)

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        raise EvaluationUnsupported(self.NO_EVALUATION)

    def delete(self, run: RunContext) -> int:
        return self._launch({"action": "stop", "name": self.name(run)})["releases"]

    def _launch(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = self.lambda_client.invoke(
            FunctionName=self.settings.launcher,
            InvocationType="RequestResponse",
            Payload=json.dumps(request).encode(),
        )
        payload = json.loads(answer["Payload"].read())
        if answer.get("FunctionError"):  # Lambda's error payload: errorMessage, errorType, ...
            message = payload["errorMessage"]
            raise LaunchFailed(
                f"the launcher could not {request['action']} {request['name']}: {message}"
            )
        return payload
