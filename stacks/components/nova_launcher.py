"""The launcher function of the Nova plane (lambdas/launcher/): AWS's HyperPod CLI, recipes and
helm in a container image built by `cdk deploy` (stacks/assets/launcher/Dockerfile), in the
cluster's network, invoked by the pipeline to start and stop a run's Nova job."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from lambdas.environment import environment_for
from lambdas.launcher.handler import LauncherSettings
from stacks.components.functions import ClusterNetwork, pipeline_function
from stacks.components.lambda_code import REQUIREMENTS
from stacks.components.project_files import PROJECT_ROOT, only_folders

DOCKERFILE = "stacks/assets/launcher/Dockerfile"
HANDLER = "lambdas.launcher.handler.launch_job"
# The image's build context: what the Dockerfile copies and nothing else.
BUILD_CONTEXT = ("domain", "lambdas", "training_configs", "stacks/assets/launcher")


class NovaLauncher(Construct):
    """Attributes: `function`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        eks_cluster: str,
        hyperpod_cluster: str,
        network: ClusterNetwork,
        log_key: kms.IKey,
    ) -> None:
        super().__init__(scope, construct_id)
        code = lambda_.Code.from_asset_image(
            str(PROJECT_ROOT),
            file=DOCKERFILE,
            exclude=[*only_folders(BUILD_CONTEXT), "**/__pycache__"],
            platform=ecr_assets.Platform.LINUX_AMD64,
            cmd=[HANDLER],
            build_args={"REQUIREMENTS": " ".join(REQUIREMENTS)},
        )
        self.function = pipeline_function(
            self,
            "Function",
            handler=lambda_.Handler.FROM_IMAGE,
            runtime=lambda_.Runtime.FROM_IMAGE,
            description="Starts and stops Nova jobs with AWS's HyperPod CLI and helm",
            code=code,
            # `helm install` returns once the chart's objects exist (no --wait): seconds.
            timeout=Duration.minutes(10),
            memory_size=2048,
            environment=environment_for(
                LauncherSettings, eks_cluster=eks_cluster, hyperpod_cluster=hyperpod_cluster
            ),
            network=network,
            log_key=log_key,
            invocation="The Nova plane invokes it synchronously (RequestResponse) and fails the "
            "step with its error",
        )
