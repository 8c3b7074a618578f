"""The serverless training plane's long-lived parts (lambdas/pipeline/serverless_training.py):
each serverless run's job is SageMaker's managed multi-turn RL job; this is what it and the
pipeline use. With `serverless_training: false` none of it exists and its needs grant nothing.

- `agent`: the agent Lambda (lambdas/router/agent_forwarder.py), `<prefix>-agent-rft`, the job
  document's `CustomAgentLambdaConfig.LambdaArn`: the job invokes it with each rollout request;
- `job_role`: what SageMaker runs each run's job as (CreateJob's RoleArn), trusted by
  `job.sagemaker.amazonaws.com` (SageMaker Developer Guide, "model-customize-mtrl-prereqs"):
  what AWS's managed policy for it (AmazonSageMakerJobFullAccess) grants, narrowed to this
  deployment — the runs' records and outputs, the agent Lambda, the public hub's models, the two
  model package groups, the job's log group; no VPC (the document sends no VpcConfig);
- the checkpoint group `<prefix>-checkpoints` (the document's
  IntermediateCheckpointModelPackageGroupArn); trained models go to the release group
  (`<prefix>-models`, stacks/components/model_release.py);
- `environment`: the plane's settings (ManagedJobSettings) for the steps that start, watch and
  stop jobs and those that check a config against the planes.

Grants (stacks/components/access.py): MANAGED_JOB_START (CreateJob with its tags, DescribeJob,
DescribeHubContent, PassRole of the job role to job.sagemaker only), MANAGED_JOB_WATCH, the same
two for the held-out evaluation jobs (MANAGED_EVALUATION_START, _WATCH), MANAGED_JOB_STOP (both
kinds), JOB_RUNTIME (the reward workers: the runtime's Sample, CompleteRollout and
UpdateReward on the deployment's jobs — AWS's AmazonSageMakerJobRuntimeAccess, narrowed),
AGENT_INVOKE (the job role only), MANAGED_JOB_SERVICE (the job role). Which calls the job makes
with its role is AWS's and unpublished beyond the managed policy: unverified until a job runs.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from domain.naming import checkpoint_group_name, model_group_name, run_prefix
from domain.needs import Need
from domain.serverless_job import (
    EVALUATION_CATEGORY,
    HUB_NAME,
    JOB_CATEGORY,
    LOG_GROUPS,
    agent_function_name,
    job_role_name,
)
from lambdas.environment import environment_for
from lambdas.pipeline.serverless_training import ManagedJobSettings
from lambdas.router.settings import ForwarderSettings
from stacks.components.access import Allow, log_group_arn
from stacks.components.functions import pipeline_function
from stacks.components.nag import Wildcard

AGENT_HANDLER = "lambdas.router.agent_forwarder.handler"
JOB_SERVICE = "job.sagemaker.amazonaws.com"


class ServerlessPlane(Construct):
    """Attributes: `agent`, `job_role` (None without the plane), `environment`; provides the
    serverless plane's needs."""

    provides = frozenset(
        {
            Need.MANAGED_JOB_START,
            Need.MANAGED_JOB_WATCH,
            Need.MANAGED_EVALUATION_START,
            Need.MANAGED_EVALUATION_WATCH,
            Need.MANAGED_JOB_STOP,
            Need.JOB_RUNTIME,
            Need.AGENT_INVOKE,
            Need.MANAGED_JOB_SERVICE,
        }
    )

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        enabled: bool,
        reserved_concurrency: int | None,
        code: lambda_.Code,
        data_key: kms.IKey,
        conversations_table: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.agent: lambda_.Function | None = None
        self.job_role: iam.Role | None = None
        self.environment: dict[str, str] = {}
        if not enabled:
            return
        stack = Stack.of(self)
        prefix = name_prefix
        self.agent = pipeline_function(
            self,
            "Agent",
            function_name=agent_function_name(prefix),
            handler=AGENT_HANDLER,
            description="Serverless plane: puts a managed job's rollout requests on its run's queue",
            code=code,
            timeout=Duration.seconds(30),
            environment=environment_for(
                ForwarderSettings, name_prefix=prefix, table_name=conversations_table
            ),
            log_key=data_key,
            invocation="SageMaker's managed job invokes it synchronously with each rollout "
            "request and sees each error at once",
            reserved_concurrency=reserved_concurrency,
        )
        self.job_role = iam.Role(
            self,
            "JobRole",
            role_name=job_role_name(prefix),
            # Only SageMaker's jobs in this account (confused-deputy prevention, as the
            # deployment's other service roles; that the job service sets aws:SourceAccount is
            # unverified until a job runs).
            assumed_by=iam.ServicePrincipal(JOB_SERVICE).with_conditions(
                {"StringEquals": {"aws:SourceAccount": stack.account}}
            ),
            description="SageMaker's managed multi-turn RL job of a serverless run",
        )
        self.environment = environment_for(
            ManagedJobSettings,
            account=stack.account,
            job_role_arn=self.job_role.role_arn,
            agent_function_arn=self.agent.function_arn,
        )
        # The deployment's jobs: `<prefix>-run-<run id>`, and its evaluations
        # `<prefix>-run-<run id>-<stage>` (domain/serverless_job.job_name).
        self._jobs = [
            stack.format_arn(
                service="sagemaker",
                resource="job",
                resource_name=f"{category}/{run_prefix(prefix)}*",
            )
            for category in (JOB_CATEGORY, EVALUATION_CATEGORY)
        ]
        self._training_jobs, self._evaluation_jobs = self._jobs
        # AWS's public hub: its account is `aws`; a config may name any of its models.
        public_hub = f"arn:{stack.partition}:sagemaker:{stack.region}:aws"
        self._hub = [f"{public_hub}:hub/{HUB_NAME}", f"{public_hub}:hub-content/{HUB_NAME}/Model/*"]
        groups = [model_group_name(prefix), checkpoint_group_name(prefix)]
        self.checkpoints = sagemaker.CfnModelPackageGroup(
            self,
            "Checkpoints",
            model_package_group_name=groups[1],
            model_package_group_description="Serverless runs' intermediate checkpoints",
        )
        self._groups = [
            stack.format_arn(service="sagemaker", resource="model-package-group", resource_name=g)
            for g in groups
        ]
        self._packages = [
            stack.format_arn(service="sagemaker", resource="model-package", resource_name=f"{g}/*")
            for g in groups
        ]
        self._logs = [log_group_arn(stack, group) for group in LOG_GROUPS]
        self._allow = Allow(
            {
                **dict.fromkeys(self._jobs, Wildcard.NAMED_AT_RUN_TIME),
                self._hub[1]: Wildcard.PUBLIC_CATALOG,
                **dict.fromkeys(self._logs, Wildcard.NAMED_AT_RUN_TIME),
                **dict.fromkeys(self._packages, Wildcard.ASSIGNED_BY_AWS),
            }
        )

    def _start(self, role: iam.IRole, jobs: str) -> None:
        """Create `jobs` (and read them back) with the job role and the public hub's models: the
        caller role of AWS's MTRL prerequisites page, narrowed to these jobs; tags on creation
        need sagemaker:AddTags (SageMaker Developer Guide, "Grant permissions to tag SageMaker
        AI resources on creation")."""
        assert self.job_role is not None
        self._allow(
            role, ["sagemaker:CreateJob", "sagemaker:DescribeJob", "sagemaker:AddTags"], jobs
        )
        self._allow(role, ["sagemaker:DescribeHubContent"], *self._hub)
        self._allow(
            role,
            ["iam:PassRole"],
            self.job_role.role_arn,
            conditions={"StringEquals": {"iam:PassedToService": JOB_SERVICE}},
        )

    def grant(self, need: Need, role: iam.IRole) -> None:
        if self.agent is None or self.job_role is None:
            return  # no serverless plane in this deployment
        match need:
            case Need.MANAGED_JOB_START:
                self._start(role, self._training_jobs)
            case Need.MANAGED_EVALUATION_START:
                self._start(role, self._evaluation_jobs)
                # The package the training job registered is the model evaluated after.
                self._allow(role, ["sagemaker:DescribeJob"], self._training_jobs)
            case Need.MANAGED_JOB_WATCH:
                self._allow(role, ["sagemaker:DescribeJob"], self._training_jobs)
            case Need.MANAGED_EVALUATION_WATCH:
                self._allow(role, ["sagemaker:DescribeJob"], self._evaluation_jobs)
            case Need.MANAGED_JOB_STOP:
                self._allow(role, ["sagemaker:DescribeJob", "sagemaker:StopJob"], *self._jobs)
            case Need.JOB_RUNTIME:
                self._allow(
                    role,
                    ["sagemaker:Sample", "sagemaker:CompleteRollout", "sagemaker:UpdateReward"],
                    *self._jobs,
                )
            case Need.AGENT_INVOKE:
                self._allow(role, ["lambda:InvokeFunction"], self.agent.function_arn)
            case Need.MANAGED_JOB_SERVICE:
                self._allow(role, ["sagemaker:DescribeHubContent"], *self._hub)
                # A version in a group is authorized on the group and the version (as
                # Collect's, stacks/components/model_release.py).
                self._allow(role, ["sagemaker:CreateModelPackage"], *self._groups, *self._packages)
                self._allow(role, ["sagemaker:DescribeModelPackageGroup"], *self._groups)
                # An evaluation job reads the trained model's package (AWS's
                # AmazonSageMakerJobFullAccess grants AccessModelPackage beside Describe).
                self._allow(
                    role,
                    ["sagemaker:DescribeModelPackage", "sagemaker:AccessModelPackage"],
                    *self._packages,
                )
                self._allow(
                    role, ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                    *self._logs,
                )  # fmt: skip
