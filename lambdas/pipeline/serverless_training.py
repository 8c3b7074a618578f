"""The serverless training plane: a run's job is SageMaker's managed multi-turn RL job (CreateJob,
JobCategory `AgentRFT`), made of the run's config as domain/serverless_job.py builds it — the
document AWS's SDK builds for the same settings. No nodes: the job runs on SageMaker's capacity,
its rollouts through the deployment's agent Lambda and the run's reward workers.

- submit: the base model's hub ARN (DescribeHubContent, as the SDK resolves it), the records it
  trains on (its `train` channel, beside the run's outputs, without the held-out ones), then
  CreateJob; a job the run already has is its job (idempotent);
- status: DescribeJob's JobStatus, the secondary status telling a job that waits for capacity
  from one that trains; FailureReason when it failed; its progress is the run's reward curve,
  which the managed job does not write (its own figures go to MLflow): made from the rollout
  reports the run's workers send the router beside the job's runtime
  (lambdas/pipeline/reward_curve.py), as a Nova run's is;
- managed_job_output: DescribeJob's `JobConfigDocument.ServiceOutput`, as the SDK's AgentRFTJob
  reads it: the package the job registered the trained model as (`OutputModelPackageArn`, the
  run's model, which Collect records instead of registering one of its own), the tokens billed;
- submit_evaluation / evaluation_status: each held-out evaluation is AWS's own evaluation job
  (JobCategory `AgentRFTEvaluation`, the SDK's MultiTurnRLEvaluator's document) of the base
  model, or of the trained model's package, on the held-out records (its `evaluation` channel);
  its rollouts reach the run's workers through the same agent Lambda, in the evaluation's phase,
  and their reports are its episodes, as a Nova evaluation's are. The training job gets no
  `validation` channel: the service would play the held-out records during training through the
  same workers, into the run's reward curve, and report only to MLflow;
- delete: StopJob on each of the run's jobs that still runs (their records stay, as AWS keeps
  them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from botocore.exceptions import ClientError
from pydantic import Field

from domain.backends import EvaluationUnsupported, JobStatus, Phase, RunContext, TrainingCluster
from domain.episodes import EvaluationStage
from domain.evaluation import results_prefix
from domain.naming import DEPLOYMENT_TAG, RUN_TAG, checkpoint_group_name, model_group_name
from domain.serverless_job import (
    EVALUATION_CATEGORY,
    EVALUATION_MAX_SECONDS,
    HUB_NAME,
    JOB_CATEGORY,
    EvaluationTargets,
    JobTargets,
    ServiceOutput,
    create_evaluation_request,
    create_job_request,
    hub_model,
    job_name,
    run_jobs,
    service_output,
)
from lambdas.clients import Clients
from lambdas.environment import EnvironmentSettings
from lambdas.pipeline.job_records import evaluation_data, held_out_records, training_data
from lambdas.pipeline.reward_curve import RewardCurve, evaluation_from_reports
from lambdas.router.conversations import ConversationStore

# The setting a deployment with the serverless plane sets (the stack: the job's role).
SERVERLESS_ROLE_SETTING = "SERVERLESS_JOB_ROLE_ARN"
# DescribeJob's secondary statuses of a job that has not started training.
WAITING = ("Pending", "Starting", "Downloading")
NOT_FOUND = "ResourceNotFound"


class ManagedJobSettings(EnvironmentSettings):
    prefix: str = Field(alias="NAME_PREFIX")
    region: str = Field(alias="AWS_REGION")
    account: str = Field(alias="ACCOUNT_ID")
    job_role_arn: str = Field(alias=SERVERLESS_ROLE_SETTING)
    agent_function_arn: str = Field(alias="AGENT_FUNCTION_ARN")
    # The data bucket's key: the job's outputs are encrypted with it.
    data_key_arn: str | None = Field(default=None, alias="DATA_KEY_ARN")
    conversations_table: str = Field(alias="CONVERSATIONS_TABLE")


class ServerlessTrainingCluster(TrainingCluster):
    def __init__(
        self, settings: ManagedJobSettings, *, sagemaker: Any, s3: Any, store: ConversationStore
    ) -> None:
        """`store`: the router's record of the run's rollouts (its reward curve, and its
        evaluations' episodes)."""
        self.settings, self.sagemaker, self.s3, self.store = settings, sagemaker, s3, store
        self.curve = RewardCurve(store, s3)

    @classmethod
    def from_environment(
        cls, environment: Mapping[str, str], clients: Clients
    ) -> ServerlessTrainingCluster:
        settings = ManagedJobSettings.from_environment(environment)
        return cls(
            settings, sagemaker=clients("sagemaker"), s3=clients("s3"),
            store=ConversationStore(clients("dynamodb"), settings.conversations_table),
        )  # fmt: skip

    def job(self, run: RunContext, stage: EvaluationStage | None = None) -> str:
        """The run's training job, or its evaluation of `stage`."""
        return job_name(self.settings.prefix, run.run_id, stage)

    def _describe(self, name: str, category: str = JOB_CATEGORY) -> dict[str, Any] | None:
        try:
            return self.sagemaker.describe_job(JobName=name, JobCategory=category)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == NOT_FOUND:
                return None
            raise

    def _base_model_arn(self, run: RunContext) -> str:
        """The hub's ARN of the run's model, as the SDK resolves it."""
        return self.sagemaker.describe_hub_content(
            HubName=HUB_NAME, HubContentType="Model", HubContentName=hub_model(run.training.model)
        )["HubContentArn"]

    def _tags(self, run: RunContext) -> dict[str, str]:
        return {DEPLOYMENT_TAG: self.settings.prefix, RUN_TAG: run.run_id}

    def targets(self, run: RunContext) -> JobTargets:
        """What the run gives its job: the agent, the model, its records, where results go."""
        settings = self.settings
        groups = f"arn:aws:sagemaker:{settings.region}:{settings.account}:model-package-group/"
        return JobTargets(
            agent_lambda_arn=settings.agent_function_arn,
            base_model_arn=self._base_model_arn(run),
            train_uri=training_data(self.s3, run, always_written=True),
            output_uri=f"s3://{run.bucket}/{run.output_prefix}",
            kms_key_arn=settings.data_key_arn,
            output_model_package_group_arn=groups + model_group_name(settings.prefix),
            checkpoint_model_package_group_arn=groups + checkpoint_group_name(settings.prefix),
        )

    def evaluation_targets(self, run: RunContext, stage: EvaluationStage) -> EvaluationTargets:
        """What the run gives its evaluation of `stage`: the base model, or the package the
        training job registered (EvaluationUnsupported: none), and the held-out records."""
        package = None
        if stage is EvaluationStage.FINAL:
            output = self.managed_job_output(run)
            package = output.output_model_package_arn if output else None
            if package is None:
                raise EvaluationUnsupported(
                    f"the run's job {self.job(run)} registered no trained model package: there "
                    "is no trained model to evaluate"
                )
        records = held_out_records(self.s3, run)
        return EvaluationTargets(
            agent_lambda_arn=self.settings.agent_function_arn,
            base_model_arn=self._base_model_arn(run),
            evaluation_uri=evaluation_data(self.s3, run, records),
            output_uri=results_prefix(f"s3://{run.bucket}/{run.output_prefix}", stage),
            kms_key_arn=self.settings.data_key_arn,
            model_package_arn=package,
            max_runtime_seconds=min(
                int(run.training.deadline_hours * 3600), EVALUATION_MAX_SECONDS
            ),
        )

    # --- the job ---

    def scale_up(self, run: RunContext, *, instances: int) -> None:
        """No nodes to ask for: the job runs on SageMaker's capacity."""

    def nodes_ready(self, run: RunContext) -> int:
        return 0

    def submit(self, run: RunContext) -> str:
        if (described := self._describe(self.job(run))) is not None:
            return described["JobArn"]
        request = create_job_request(
            run.training, self.targets(run), name=self.job(run),
            role_arn=self.settings.job_role_arn, tags=self._tags(run),
        )  # fmt: skip
        return self.sagemaker.create_job(**request)["JobArn"]

    def status(self, run: RunContext) -> JobStatus:
        status = self._job_status(self.job(run))
        ended = status.phase in (Phase.SUCCEEDED, Phase.FAILED)
        return replace(status, step=self.curve.update(run, final=ended))

    def _job_status(self, name: str, category: str = JOB_CATEGORY) -> JobStatus:
        described = self._describe(name, category)
        if described is None:
            return JobStatus(Phase.FAILED, f"job {name} does not exist")
        status, secondary = described["JobStatus"], described.get("SecondaryStatus", "")
        if status == "InProgress":
            return JobStatus(Phase.PENDING if secondary in WAITING else Phase.RUNNING, secondary)
        if status == "Completed":
            return JobStatus(Phase.SUCCEEDED)
        reason = described.get("FailureReason") or f"the job is {status}"
        return JobStatus(Phase.FAILED, reason)

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        name = self.job(run, stage)
        if (described := self._describe(name, EVALUATION_CATEGORY)) is not None:
            return described["JobArn"]
        request = create_evaluation_request(
            run.training, self.evaluation_targets(run, stage), name=name,
            role_arn=self.settings.job_role_arn, tags=self._tags(run),
        )  # fmt: skip
        return self.sagemaker.create_job(**request)["JobArn"]

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        """The evaluation job's phase; once it succeeded, its episodes are the reports of its
        rollouts."""
        status = self._job_status(self.job(run, stage), EVALUATION_CATEGORY)
        return evaluation_from_reports(
            self.store, self.s3, run, stage, status, invoked="the agent Lambda"
        )

    def managed_job_output(self, run: RunContext) -> ServiceOutput | None:
        """The training job's ServiceOutput as DescribeJob answers it (None: no job): the
        package it registered the trained model as, in the deployment's group (its document's
        OutputModelPackageGroupArn), once it completed."""
        described = self._describe(self.job(run))
        return service_output(described) if described else None

    def delete(self, run: RunContext) -> int:
        """Stop each of the run's jobs that runs; how many it has."""
        found = 0
        for name, category in run_jobs(self.settings.prefix, run.run_id):
            described = self._describe(name, category)
            if described is None:
                continue
            found += 1
            if described["JobStatus"] == "InProgress":
                try:
                    self.sagemaker.stop_job(JobName=name, JobCategory=category)
                except ClientError as error:
                    if error.response.get("Error", {}).get("Code") != NOT_FOUND:
                        raise
        return found

    def scale_down(self, run: RunContext) -> None:
        """No nodes to release."""

    def release_idle(self, *, immediately: bool = False) -> bool:
        return False
