"""Phase 1: the training pipeline's long-lived parts (so far: the rollout router)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.base import PlatformStack
from stacks.components.fleet_control import RewardFleetControl
from stacks.components.hyperpod import HyperPodCluster
from stacks.components.lambda_code import pipeline_code
from stacks.components.pipeline import TrainingPipeline
from stacks.components.reward_fleet import RewardFleet, log_group_name
from stacks.components.router import Router
from stacks.components.storage import Storage, data_bucket_name
from stacks.components.training_control import TrainingClusterControl
from stacks.config import PlatformConfig


class PipelineStack(PlatformStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: PlatformConfig,
        storage: Storage,
        reward_fleet: RewardFleet,
        hyperpod: HyperPodCluster,
    ) -> None:
        super().__init__(
            scope, "pipeline", config=config, description="training pipeline and rollout router"
        )
        code = pipeline_code()
        data_bucket = s3.Bucket.from_bucket_name(self, "DataBucket", data_bucket_name(config))
        self.router = Router(self, "Router", config=config, code=code, data_key=storage.data_key)
        self.pipeline = TrainingPipeline(
            self,
            "Pipeline",
            config=config,
            code=code,
            data_bucket=data_bucket,
            data_key=storage.data_key,
            conversations=self.router.table,
            router_url=self.router.proxy_url.url,
            consumer=self.router.consumer,
        )
        # The reward fleet per run (ECS): where it lives, and the rights to run it.
        fleet = RewardFleetControl(
            self,
            "RewardFleetControl",
            config=config,
            reward_fleet=reward_fleet,
            data_key=storage.data_key,
            run_queue_arns=self.router.run_queue_arns,
        )
        # The reaper releases compute too, for runs whose execution cannot any more.
        for step in ("start_workers", "workers_healthy", "release_compute", "reap"):
            function = self.pipeline.functions[step]
            for key, value in fleet.environment.items():
                function.add_environment(key, value)
            fleet.grant_control(function)
        # The training job per run (HyperPod): nodes through SageMaker, the job through EKS.
        training = TrainingClusterControl(
            self,
            "TrainingClusterControl",
            config=config,
            code=code,
            hyperpod_cluster_arn=hyperpod.cluster_arn,
            execution_role_arn=hyperpod.execution_role_arn,
            runs_table=self.pipeline.runs_table,
            data_bucket=data_bucket,
            data_key=storage.data_key,
            run_queue_arns=self.router.run_queue_arns,
        )
        for step in (
            "register",
            "scale_up",
            "nodes_ready",
            "submit_job",
            "monitor",
            "release_compute",
            "reap",
        ):
            for key, value in training.environment.items():
                self.pipeline.functions[step].add_environment(key, value)
        for step in ("scale_up", "nodes_ready", "release_compute", "reap"):
            training.grant_capacity(self.pipeline.functions[step])
        for step in ("nodes_ready", "submit_job", "monitor", "release_compute", "reap"):
            training.grant_kubernetes(self.pipeline.functions[step])
        for step in ("submit_job", "release_compute", "reap"):
            training.grant_pod_identity(self.pipeline.functions[step])
        if config.keep_warm_minutes:
            release_idle = self.pipeline.add_scheduled_step(
                "release_idle",
                "Scales GPU nodes kept warm to zero once no run took them",
                every=Duration.minutes(5),
                environment=training.environment,
            )
            training.grant_capacity(release_idle)
        # Reward workers call the proxy; the grant lives here so compute never depends on us.
        workers = iam.Role.from_role_arn(
            self, "RewardWorkerRole", reward_fleet.task_role.role_arn, mutable=True
        )
        self.router.grant_invoke_url(workers)
        cdk.CfnOutput(self, "RouterUrl", value=self.router.proxy_url.url)
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
