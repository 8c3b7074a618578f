"""Phase 1: the training pipeline's long-lived parts: its state machine and functions, the rollout
router, the training planes' controls (HyperPod, Nova, serverless), model release and tracking."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.base import PlatformStack
from stacks.components.access import NEEDS, OperatorPolicy, StacksAccess, grant_needs
from stacks.components.experiment_tracking import ExperimentTracking
from stacks.components.fleet_control import RewardFleetControl
from stacks.components.functions import ClusterNetwork
from stacks.components.hyperpod import HyperPodCluster
from stacks.components.lambda_code import pipeline_code
from stacks.components.model_release import ModelRelease
from stacks.components.pipeline import TrainingPipeline
from stacks.components.pipeline_steps import STEP
from stacks.components.reward_fleet import RewardFleet, log_group_name
from stacks.components.router import Router
from stacks.components.serverless_plane import ServerlessPlane
from stacks.components.storage import DataBucketAccess, Storage, data_bucket_name
from stacks.components.training_control import TrainingClusterControl
from stacks.config import PlatformConfig

# Steps told the training planes' settings though they call no plane's AWS API: Register checks a
# config against them (presets, instance type); the evaluation steps ask the run's plane whether
# it can evaluate.
KNOW_THE_PLANES = ("register", "start_evaluation", "evaluation_status")


class PipelineStack(PlatformStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: PlatformConfig,
        storage: Storage,
        reward_fleet: RewardFleet,
        hyperpod: HyperPodCluster,
        cluster_network: ClusterNetwork,
    ) -> None:
        """`cluster_network`: where the functions that call the EKS API run (the compute stack's)."""
        super().__init__(
            scope, "pipeline", config=config, description="training pipeline and rollout router"
        )
        code = pipeline_code()
        data_bucket = s3.Bucket.from_bucket_name(self, "DataBucket", data_bucket_name(config))
        self.router = Router(self, "Router", config=config, code=code, data_key=storage.data_key)
        self.model_release = ModelRelease(self, "ModelRelease", config=config)
        self.pipeline = TrainingPipeline(
            self,
            "Pipeline",
            config=config,
            model_package_group=self.model_release.group_name,
            code=code,
            data_bucket=data_bucket,
            data_key=storage.data_key,
            conversations=self.router.table,
            router_url=self.router.proxy_url.url,
            consumer=self.router.consumer,
            rollout_forwarder=self.router.rollout_forwarder,
            cluster_network=cluster_network,
        )
        # The reward fleet per run (ECS) and the training job per run (HyperPod: nodes through
        # SageMaker, the job through EKS): where they live, for the steps that use them.
        fleet = RewardFleetControl(
            self,
            "RewardFleetControl",
            config=config,
            reward_fleet=reward_fleet,
            data_key=storage.data_key,
        )
        training = TrainingClusterControl(
            self,
            "TrainingClusterControl",
            config=config,
            code=code,
            hyperpod_cluster_arn=hyperpod.cluster_arn,
            execution_role_arn=hyperpod.execution_role_arn,
            restricted_execution_role_arn=(
                hyperpod.restricted_execution_role.role_arn
                if hyperpod.restricted_execution_role
                else None
            ),
            cluster_network=cluster_network,
            data_key=storage.data_key,
            trainer_image_uri=hyperpod.trainer_image_uri,
        )
        serverless = ServerlessPlane(
            self, "ServerlessPlane", config=config, code=code, data_key=storage.data_key,
            conversations_table=self.router.table.table_name,
        )  # fmt: skip
        tracking = ExperimentTracking(
            self, "ExperimentTracking", config=config, data_bucket=data_bucket,
            data_key=storage.data_key,
        )  # fmt: skip
        functions = self.pipeline.functions
        if config.keep_warm_minutes:
            self.pipeline.add_scheduled_step(
                STEP["release_idle"], every=Duration.minutes(5), environment=training.environment
            )
        for step, function in functions.items():
            needs = set(NEEDS[step])
            if needs & fleet.provides:
                for key, value in fleet.environment.items():
                    function.add_environment(key, value)
            # The planes' settings include the tracking server: Nova's recipes log there too.
            if needs & (training.provides | serverless.provides) or step in KNOW_THE_PLANES:
                planes = {**training.environment, **serverless.environment, **tracking.environment}
                for key, value in planes.items():
                    function.add_environment(key, value)
            if needs & tracking.provides:
                for key, value in tracking.environment.items():
                    function.add_environment(key, value)
        # What every function and workload may do: declared once (stacks/components/access.py).
        roles: dict[str, iam.IRole] = {step: f.role for step, f in functions.items() if f.role}
        self.operator_policy = OperatorPolicy(
            self,
            "OperatorPolicy",
            managed_policy_name=f"{config.name_prefix}-operator",
            description="What the mtrl CLI needs: submit, runs, status, cost, logs, teardown, doctor",
        )
        roles |= {
            "proxy": self.router.proxy.role,
            "consumer": self.router.consumer.role,
            "rollout_forwarder": self.router.rollout_forwarder.role,
            "reward_worker": fleet.task_role,
            "run_pods": training.job_role,
            "model_serving": self.model_release.serving_role,
            "operator": self.operator_policy,
        }  # type: ignore[dict-item]
        if training.launcher is not None:
            roles["nova_launcher"] = training.launcher.function.role  # type: ignore[assignment]
        if serverless.agent is not None and serverless.job_role is not None:
            roles["agent_forwarder"] = serverless.agent.role  # type: ignore[assignment]
            roles["serverless_job"] = serverless.job_role
        if hyperpod.restricted_execution_role is not None:
            # The compute stack's role, granted here (a policy of this stack: no cycle).
            roles["nova_job"] = iam.Role.from_role_arn(
                self, "NovaJobRole", hyperpod.restricted_execution_role.role_arn, mutable=True
            )
        grant_needs(
            roles,
            [
                self.model_release,
                DataBucketAccess(data_bucket, storage.data_key),
                StacksAccess(self, config.name_prefix),
                self.pipeline,
                self.router,
                fleet,
                training,
                training.leases,
                serverless,
                tracking,
            ],
        )
        if tracking.server_arn:
            cdk.CfnOutput(self, "MlflowTrackingServerArn", value=tracking.server_arn)
        cdk.CfnOutput(
            self,
            "OperatorPolicyArn",
            value=self.operator_policy.managed_policy_arn,
            description="Attach to the role or permission set of whoever runs mtrl",
        )
        cdk.CfnOutput(self, "RouterUrl", value=self.router.proxy_url.url)
        # `mtrl deploy` finds the group; passes Bedrock the import role, SageMaker the serving role.
        cdk.CfnOutput(self, "ModelPackageGroupName", value=self.model_release.group_name)
        cdk.CfnOutput(self, "BedrockImportRoleArn", value=self.model_release.import_role.role_arn)
        cdk.CfnOutput(self, "ServingRoleArn", value=self.model_release.serving_role.role_arn)
        cdk.CfnOutput(self, "ConversationTableName", value=self.router.table.table_name)
        cdk.CfnOutput(self, "StateMachineArn", value=self.pipeline.state_machine.state_machine_arn)
        cdk.CfnOutput(self, "RunsTableName", value=self.pipeline.runs_table.table_name)
        cdk.CfnOutput(self, "AlertTopicArn", value=self.pipeline.alert_topic.topic_arn)
        # `mtrl logs` reads these; the per-run worker groups are named after the prefix.
        cdk.CfnOutput(
            self, "PipelineLogGroups", value=cdk.Fn.join(",", self.pipeline.log_group_names)
        )
        cdk.CfnOutput(self, "RewardWorkerLogGroupPrefix", value=log_group_name(config))
        cdk.CfnOutput(
            self,
            "ReaperFunctionName",
            value=self.pipeline.functions["reap"].function_name,
            description="mtrl teardown invokes it to tear a run down now",
        )
