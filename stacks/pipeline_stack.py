"""Phase 1: the training pipeline's long-lived parts: its state machine and functions, the rollout
router, the training planes' controls (HyperPod, Nova, serverless), model release and tracking."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from domain.naming import StackOutput
from lambdas.pipeline.steps import STEP
from stacks.base import PlatformStack
from stacks.components.access import NEEDS, OperatorPolicy, StacksAccess, grant_needs
from stacks.components.experiment_tracking import ExperimentTracking
from stacks.components.fleet_control import RewardFleetControl
from stacks.components.functions import ClusterNetwork
from stacks.components.hyperpod import HyperPodCluster
from stacks.components.lambda_code import pipeline_code
from stacks.components.model_release import ModelRelease
from stacks.components.pipeline import TrainingPipeline
from stacks.components.reward_fleet import RewardFleet, log_group_name
from stacks.components.router import Router
from stacks.components.serverless_plane import ServerlessPlane
from stacks.components.storage import DataBucketAccess, Storage, data_bucket_name
from stacks.components.training_control import TrainingClusterControl, training_control_props
from stacks.config import PlatformConfig

# Steps told the training planes' settings though they call no plane's AWS API: Register checks a
# config against them (presets, instance type); the evaluation steps ask the run's plane whether
# it can evaluate.
KNOW_THE_PLANES = ("register", "start_evaluation", "evaluation_status")


class PipelineStack(PlatformStack):
    """The pipeline stack in four readable parts: what it is made of (`_build`), which steps are
    told where the planes are (`_wire`), what every function and workload may do (`_grant`), and
    the outputs `mtrl` finds the deployment by (`_outputs`)."""

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
        self._config = config
        self._build(storage, reward_fleet, hyperpod, cluster_network)
        self._wire()
        self._grant(storage, hyperpod)
        self._outputs()

    def _build(
        self,
        storage: Storage,
        reward_fleet: RewardFleet,
        hyperpod: HyperPodCluster,
        cluster_network: ClusterNetwork,
    ) -> None:
        config, key, code = self._config, storage.data_key, pipeline_code()
        self._data_bucket = s3.Bucket.from_bucket_name(
            self, "DataBucket", data_bucket_name(config.name_prefix)
        )
        self.router = Router(
            self, "Router", name_prefix=config.name_prefix,
            reserved_concurrency=config.router_reserved_concurrency, code=code, data_key=key,
        )  # fmt: skip
        self.model_release = ModelRelease(self, "ModelRelease", name_prefix=config.name_prefix)
        self.pipeline = TrainingPipeline(
            self, "Pipeline", name_prefix=config.name_prefix, alert_email=config.alert_email,
            model_package_group=self.model_release.group_name,
            code=code, data_bucket=self._data_bucket, data_key=key,
            conversations=self.router.table, router_url=self.router.proxy_url.url,
            consumer=self.router.consumer, rollout_forwarder=self.router.rollout_forwarder,
            cluster_network=cluster_network,
        )  # fmt: skip
        # The reward fleet per run (ECS) and the training job per run (HyperPod: nodes through
        # SageMaker, the job through EKS): where they live, for the steps that use them.
        self._fleet = RewardFleetControl(
            self,
            "RewardFleetControl",
            name_prefix=config.name_prefix,
            reward_fleet=reward_fleet,
            data_key=key,
        )
        restricted = hyperpod.restricted_execution_role
        self._training = TrainingClusterControl(
            self, "TrainingClusterControl", props=training_control_props(config), code=code,
            hyperpod_cluster_arn=hyperpod.cluster_arn,
            execution_role_arn=hyperpod.execution_role_arn,
            restricted_execution_role_arn=restricted.role_arn if restricted else None,
            cluster_network=cluster_network, data_key=key,
            trainer_image_uri=hyperpod.trainer_image_uri,
        )  # fmt: skip
        self._serverless = ServerlessPlane(
            self, "ServerlessPlane", name_prefix=config.name_prefix,
            enabled=config.serverless_training,
            reserved_concurrency=config.router_reserved_concurrency, code=code, data_key=key,
            conversations_table=self.router.table.table_name,
        )  # fmt: skip
        self._tracking = ExperimentTracking(
            self, "ExperimentTracking", name_prefix=config.name_prefix,
            server_size=config.mlflow_server_size, data_bucket=self._data_bucket, data_key=key,
        )  # fmt: skip

    def _wire(self) -> None:
        """Each step gets the settings of the planes whose AWS APIs it calls."""
        fleet, training, tracking = self._fleet, self._training, self._tracking
        if self._config.keep_warm_minutes:
            self.pipeline.add_scheduled_step(
                STEP["release_idle"], every=Duration.minutes(5), environment=training.environment
            )
        # The planes' settings include the tracking server: Nova's recipes log there too.
        planes = {**training.environment, **self._serverless.environment, **tracking.environment}
        for step, function in self.pipeline.functions.items():
            needs = set(NEEDS[step])
            settings = {}
            if needs & fleet.provides:
                settings |= fleet.environment
            if needs & (training.provides | self._serverless.provides) or step in KNOW_THE_PLANES:
                settings |= planes
            if needs & tracking.provides:
                settings |= tracking.environment
            for key, value in settings.items():
                function.add_environment(key, value)

    def _grant(self, storage: Storage, hyperpod: HyperPodCluster) -> None:
        """What every function and workload may do: declared once (stacks/components/access.py)."""
        functions, training, serverless = self.pipeline.functions, self._training, self._serverless
        roles: dict[str, iam.IRole] = {step: f.role for step, f in functions.items() if f.role}
        self.operator_policy = OperatorPolicy(
            self,
            "OperatorPolicy",
            managed_policy_name=f"{self._config.name_prefix}-operator",
            description="What the mtrl CLI needs: submit, runs, status, cost, logs, teardown, doctor",
        )
        roles |= {
            "proxy": self.router.proxy.role,
            "consumer": self.router.consumer.role,
            "rollout_forwarder": self.router.rollout_forwarder.role,
            "reward_worker": self._fleet.task_role,
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
                self.model_release, DataBucketAccess(self._data_bucket, storage.data_key),
                StacksAccess(self, self._config.name_prefix), self.pipeline, self.router,
                self._fleet, training, training.leases, serverless, self._tracking,
            ],
        )  # fmt: skip

    def _outputs(self) -> None:
        """What `mtrl` finds the deployment by (mtrl/ops/deployment.py)."""
        pipeline, release = self.pipeline, self.model_release
        if self._tracking.server_arn:
            cdk.CfnOutput(
                self, StackOutput.MLFLOW_TRACKING_SERVER_ARN, value=self._tracking.server_arn
            )
        cdk.CfnOutput(
            self,
            StackOutput.OPERATOR_POLICY_ARN,
            value=self.operator_policy.managed_policy_arn,
            description="Attach to the role or permission set of whoever runs mtrl",
        )
        cdk.CfnOutput(self, StackOutput.ROUTER_URL, value=self.router.proxy_url.url)
        # `mtrl deploy` finds the group; passes Bedrock the import role, SageMaker the serving role.
        cdk.CfnOutput(self, StackOutput.MODEL_PACKAGE_GROUP_NAME, value=release.group_name)
        cdk.CfnOutput(self, StackOutput.BEDROCK_IMPORT_ROLE_ARN, value=release.import_role.role_arn)
        cdk.CfnOutput(self, StackOutput.SERVING_ROLE_ARN, value=release.serving_role.role_arn)
        cdk.CfnOutput(self, StackOutput.CONVERSATION_TABLE_NAME, value=self.router.table.table_name)
        cdk.CfnOutput(
            self, StackOutput.STATE_MACHINE_ARN, value=pipeline.state_machine.state_machine_arn
        )
        cdk.CfnOutput(self, StackOutput.RUNS_TABLE_NAME, value=pipeline.runs_table.table_name)
        cdk.CfnOutput(self, StackOutput.ALERT_TOPIC_ARN, value=pipeline.alert_topic.topic_arn)
        # `mtrl logs` reads these; the per-run worker groups are named after the prefix.
        cdk.CfnOutput(
            self, StackOutput.PIPELINE_LOG_GROUPS, value=cdk.Fn.join(",", pipeline.log_group_names)
        )
        cdk.CfnOutput(
            self,
            StackOutput.REWARD_WORKER_LOG_GROUP_PREFIX,
            value=log_group_name(self._config.name_prefix),
        )
        cdk.CfnOutput(
            self,
            StackOutput.REAPER_FUNCTION_NAME,
            value=pipeline.functions["reap"].function_name,
            description="mtrl teardown invokes it to tear a run down now",
        )
