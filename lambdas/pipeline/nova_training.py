"""The Nova training plane: a run's job is AWS's — the Forge BYOO recipe with the run's
overrides, rendered and installed by AWS's launcher (the launcher function,
lambdas/launcher/) — on the deployment's restricted instance group.

- scale_up / nodes_ready / scale_down: the run's lease on the restricted group
  (lambdas/pipeline/hyperpod_capacity.py, among the cluster's RestrictedInstanceGroups); a node
  counts once SageMaker has it running and Kubernetes can schedule on it;
- submit: the Forge recipe (read from its S3 location) with the overrides of
  domain/nova_job.py — the run's name, dataset, outputs, GPU split, training settings and the
  four BYOO endpoints of *this* run (its queues, and the deployment's rollout Lambda, unqualified
  as the Forge SDK passes it: the run holds it from Provision to teardown) — handed to the
  launcher function, which starts it idempotently;
- status: the chart's PyTorchJob in the `kubeflow` namespace, its conditions and the pods of the
  job (image pulls, crash loops, OOM kills, pending too long fail the run with that reason);
  its progress is the run's reward curve, which the Nova job does not write: made from the
  rollout reports the router accepted (lambdas/pipeline/reward_curve.py);
- submit_evaluation / evaluation_status: AWS's multi-turn evaluation recipe (the Forge SDK's
  RFT_MULTITURN_EVAL) for the starting model or the trained checkpoint, on the run's held-out
  records, through the same launcher, queues and rollout Lambda; each phase is opened before its
  job starts, so its rollouts' reports are kept apart from training's
  (lambdas/router/rollout_forwarder.py). Once the job succeeded, those reports are the
  evaluation's episodes (`runs/<run_id>/evaluation/<stage>.jsonl`), summarised like every
  plane's. Where AWS publishes no evaluation image, or its recipe takes no BYOO endpoints, the
  run goes on without an evaluation and says why;
- the held-out records are never trained on: with a share held out, the job trains on
  `runs/<run_id>/data/training.jsonl` (the dataset without them);
- delete: the launcher function uninstalls the run's releases (everything the chart made),
  its evaluations' too.
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
from domain.bucket import run_outputs
from domain.checkpoints import latest
from domain.episodes import EvaluationStage
from domain.evaluation import results_prefix
from domain.nova_job import (
    DOCUMENTED_BYOO_KEYS,
    FORGE_EVALUATION_RECIPE,
    FORGE_RECIPE_SOURCE,
    FORGE_RECIPES,
    NAMESPACE,
    NOVA_MODELS,
    BuiltRecipe,
    NovaRefused,
    apply_overrides,
    byoo_endpoints,
    delegating,
    evaluation_image,
    evaluation_overrides,
    evaluation_run_recipe,
    images,
    job_pattern,
    recipe_leaves,
    recipe_overrides,
    run_name,
    run_recipe,
    submitted_recipe_key,
    tracking_overrides,
    without_single_turn_reward,
)
from domain.tracking import EXPERIMENT
from lambdas.clients import Clients
from lambdas.kubernetes.client import KubernetesClient
from lambdas.kubernetes.training_job import JOB_API
from lambdas.pipeline.checkpoints import recorded_checkpoints
from lambdas.pipeline.hyperpod_capacity import HyperPodCapacity
from lambdas.pipeline.hyperpod_training import ClusterSettings, InstanceGroupPlane, job_status
from lambdas.pipeline.job_records import evaluation_data, held_out_records, training_data
from lambdas.pipeline.reward_curve import RewardCurve, evaluation_from_reports
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
    # The deployment's MLflow tracking server, where it has one: the recipes log there too.
    mlflow_tracking_server_arn: str | None = Field(default=None, alias="MLFLOW_TRACKING_SERVER_ARN")


class NovaTrainingCluster(InstanceGroupPlane):
    def __init__(
        self,
        settings: NovaSettings,
        *,
        kubernetes: KubernetesClient | Callable[[], KubernetesClient],
        capacity: HyperPodCapacity,
        lambda_client: Any,
        s3: Any,
        store: ConversationStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`store`: the router's record of the run's rollouts (its reward curve, and its
        evaluations' episodes)."""
        super().__init__(
            kubernetes=kubernetes, capacity=capacity, instance_type=settings.instance_type,
            keep_warm_seconds=settings.keep_warm_seconds, clock=clock,
        )  # fmt: skip
        self.settings = settings
        self.lambda_client, self.s3, self.store = lambda_client, s3, store
        self.curve = RewardCurve(store, s3)

    @classmethod
    def from_environment(
        cls, environment: Mapping[str, str], clients: Clients
    ) -> NovaTrainingCluster:
        settings = NovaSettings.from_environment(environment)
        return cls(
            settings, kubernetes=settings.kubernetes(clients),
            capacity=settings.capacity(clients, settings.instance_group, restricted=True),
            lambda_client=clients("lambda"), s3=clients("s3"),
            store=ConversationStore(clients("dynamodb"), settings.conversations_table),
        )  # fmt: skip

    def name(self, run: RunContext) -> str:
        return run_name(self.settings.prefix, run.run_id)

    # --- the job ---

    def forge_recipe(self, path: str) -> tuple[str, dict[str, Any]]:
        """Where the Forge recipe at `path` (of the recipes collection) is read from, and it."""
        source = self.settings.recipe_source.format(recipe=path)
        found = S3_URI.match(source)
        if found is None:
            raise NovaRefused(f"NOVA_RECIPE_SOURCE {source!r} is not an s3://bucket/key URI")
        body = self.s3.get_object(Bucket=found.group(1), Key=found.group(2))["Body"].read()
        recipe = yaml.safe_load(body)
        if not isinstance(recipe, dict):
            raise NovaRefused(f"recipe {source}: expected a YAML mapping")
        return source, recipe

    def recipe(self, run: RunContext) -> BuiltRecipe:
        """The Forge recipe of the run's config with the run's overrides, and the overrides it
        did not take (NovaRefused: it is not a BYOO recipe)."""
        config = run.training
        if run.rollout_request_arn is None:
            raise ValueError(f"run {run.run_id}: it does not hold the rollout Lambda (Provision)")
        source, base = self.forge_recipe(FORGE_RECIPES[config.recipe])
        overrides = recipe_overrides(
            config,
            name=self.name(run),
            data_s3_path=self.training_data(run),
            output_s3_path=f"s3://{run.bucket}/{run.output_prefix}",
            byoo=byoo_endpoints(run.rollout_request_arn, lambda kind: run.queues[kind]),
            base_checkpoint=run.base.uri if run.base else None,
        )
        return delegating(
            apply_overrides(base, overrides | self._tracking(base, run.run_id)), source
        )

    def _tracking(self, recipe: dict[str, Any], run_name: str) -> dict[str, Any]:
        return tracking_overrides(
            recipe,
            tracking_uri=self.settings.mlflow_tracking_server_arn,
            experiment=EXPERIMENT,
            run_name=run_name,
        )

    def training_data(self, run: RunContext) -> str:
        return training_data(self.s3, run)

    def submit(self, run: RunContext) -> str:
        config = run.training
        name = self.name(run)
        built = self.recipe(run)
        self._record(run, name, built)
        answer = self._launch(
            {
                "action": "start",
                "name": name,
                "recipe": run_recipe(config.recipe, name),
                "body": built.recipe,
                "instance_type": config.instance_type,
                "container": images(self.settings.region)["training"],
            }
        )
        return f"{NAMESPACE}/{answer['job']}"

    def _record(self, run: RunContext, name: str, built: BuiltRecipe) -> None:
        """What a job was started with, beside the run's outputs: the recipe after overrides
        and the overrides it did not take (`submitted_recipe_key`)."""
        record = {"job": name, "skipped": list(built.skipped), "recipe": built.recipe}
        self.s3.put_object(
            Bucket=run.bucket,
            Key=submitted_recipe_key(run.output_prefix, name),
            Body=json.dumps(record, indent=2).encode(),
            ContentType="application/json",
        )

    def status(self, run: RunContext) -> JobStatus:
        status = self._job_status(self.name(run), "the run's Nova job")
        ended = status.phase in (Phase.SUCCEEDED, Phase.FAILED)
        return replace(status, step=self.curve.update(run, final=ended))

    def _job_status(self, name: str, what: str) -> JobStatus:
        """The latest PyTorchJob the launcher made of recipe name `name`, and its pods."""
        pattern = re.compile(job_pattern(name))
        jobs = [
            job
            for job in self.kubernetes.list(JOB_API[JOB_KIND], JOB_KIND, namespace=NAMESPACE)
            if pattern.match(job["metadata"]["name"])
        ]
        if not jobs:
            return JobStatus(Phase.FAILED, f"{what} is not in namespace {NAMESPACE}")
        job = max(jobs, key=lambda item: item["metadata"]["creationTimestamp"])
        prefix = f"{job['metadata']['name']}-"
        pods = [
            pod
            for pod in self.kubernetes.list("v1", "Pod", namespace=NAMESPACE)
            if pod["metadata"]["name"].startswith(prefix)
        ]
        return job_status(
            job, pods, now=self._clock(), pending_limit_seconds=self.settings.pending_limit_seconds
        )

    # --- the held-out evaluations ---

    def evaluation_name(self, run: RunContext, stage: EvaluationStage) -> str:
        return run_name(self.settings.prefix, run.run_id, stage)

    def evaluation_recipe(self, run: RunContext, stage: EvaluationStage) -> BuiltRecipe:
        """AWS's evaluation recipe for the stage's model on the run's held-out records, through
        the stage's endpoints, and the overrides it did not take (EvaluationUnsupported: it
        takes not all of the BYOO endpoints, or nothing is held out)."""
        if run.rollout_request_arn is None:
            raise ValueError(f"run {run.run_id}: it does not hold the rollout Lambda (Provision)")
        source, base = self.forge_recipe(FORGE_EVALUATION_RECIPE)
        missing = [key for key in DOCUMENTED_BYOO_KEYS if key not in recipe_leaves(base)]
        if missing:
            raise EvaluationUnsupported(
                f"AWS's evaluation recipe {source} has no {', '.join(missing)}: it cannot play "
                "its rollouts through this run's reward workers"
            )
        records = held_out_records(self.s3, run)
        overrides = evaluation_overrides(
            name=self.evaluation_name(run, stage),
            model_name_or_path=self.evaluated_model(run, stage),
            data_s3_path=evaluation_data(self.s3, run, records),
            output_s3_path=results_prefix(f"s3://{run.bucket}/{run.output_prefix}", stage),
            byoo=byoo_endpoints(run.rollout_request_arn, lambda kind: run.queues[kind]),
        )
        tracking = self._tracking(base, f"{run.run_id}-{stage}")
        return apply_overrides(without_single_turn_reward(base), overrides | tracking)

    def evaluated_model(self, run: RunContext, stage: EvaluationStage) -> str:
        """The starting model (the base checkpoint, or Nova's), or the checkpoint training
        ended with (EvaluationUnsupported: the job recorded none with a location)."""
        if stage is EvaluationStage.BASELINE:
            return run.base.uri if run.base else NOVA_MODELS[run.training.model]
        outputs = run_outputs(self.s3, bucket=run.bucket, prefix=run.output_prefix)
        found = latest(
            recorded_checkpoints(
                self.s3, bucket=run.bucket, prefix=run.output_prefix, outputs=outputs
            )
        )
        if found is None or found.uri is None:
            raise EvaluationUnsupported(
                f"the run's Nova job recorded no checkpoint with a location under "
                f"s3://{run.bucket}/{run.output_prefix}: there is no trained model to evaluate"
            )
        return found.uri

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        image = evaluation_image(self.settings.region)
        if image is None:
            raise EvaluationUnsupported(
                f"AWS publishes no Nova evaluation image in {self.settings.region}; evaluate "
                "the model with the Nova Forge SDK (RFT_MULTITURN_EVAL) in a region that has one"
            )
        name = self.evaluation_name(run, stage)
        built = self.evaluation_recipe(run, stage)
        self._record(run, name, built)
        answer = self._launch(
            {
                "action": "start",
                "name": name,
                "recipe": evaluation_run_recipe(name),
                "body": built.recipe,
                "instance_type": run.training.instance_type,
                "container": image,
            }
        )
        return f"{NAMESPACE}/{answer['job']}"

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        """The evaluation job's phase; once it succeeded, its episodes are the reports of its
        rollouts."""
        status = self._job_status(self.evaluation_name(run, stage), f"the run's {stage} evaluation")
        return evaluation_from_reports(
            self.store, self.s3, run, stage, status, invoked="the rollout Lambda"
        )

    def delete(self, run: RunContext) -> int:
        names = [self.name(run), *(self.evaluation_name(run, stage) for stage in EvaluationStage)]
        return sum(self._launch({"action": "stop", "name": name})["releases"] for name in names)

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
