"""Phase 1: the compute planes (EKS + HyperPod for the model, ECS Fargate for rewards)."""

from __future__ import annotations

import aws_cdk as cdk
from constructs import Construct

from domain.naming import StackOutput
from stacks.base import PlatformStack
from stacks.components.eks import HyperPodEks, eks_props
from stacks.components.hyperpod import HyperPodCluster, hyperpod_props
from stacks.components.hyperpod_dependencies import HyperPodDependencies, chart_request
from stacks.components.lambda_code import pipeline_code
from stacks.components.network import Network
from stacks.components.reward_fleet import RewardFleet
from stacks.components.storage import Storage
from stacks.components.trainer_image import TrainerImage
from stacks.config import PlatformConfig
from stacks.network_stack import network_of


class ComputeStack(PlatformStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: PlatformConfig,
        network: Network | None,
        storage: Storage,
    ) -> None:
        """`network` is the network stack's; None imports `config.existing_vpc` here."""
        super().__init__(
            scope, "compute", config=config, description="EKS, HyperPod, ECS reward workers"
        )
        network = network or network_of(self, "ExistingNetwork", config, log_key=storage.data_key)
        self.eks = HyperPodEks(
            self,
            "Eks",
            props=eks_props(config),
            vpc=network.vpc,
            subnets=network.private_subnets,
            secrets_key=storage.data_key,
            log_key=storage.data_key,
        )
        ready = list(self.eks.ready)
        self.chart: HyperPodDependencies | None = None
        if config.install_hyperpod_chart and not config.existing_hyperpod_cluster:
            # AWS requires the chart before the HyperPod cluster: without its device plugins
            # no GPU pod schedules, without its health agent node recovery has nothing to act on.
            self.chart = HyperPodDependencies(
                self, "HyperPodChart", request=chart_request(config), eks=self.eks,
                code=pipeline_code(),
                log_key=storage.data_key,
            )  # fmt: skip
            ready.append(self.chart.installed)
        # The open-weights trainer's image, for the presets that name none of their own.
        self.trainer_image = (
            TrainerImage(self, "TrainerImage")
            if any(preset.trainer_image is None for preset in config.model_presets.values())
            else None
        )
        self.hyperpod = HyperPodCluster(
            self,
            "HyperPod",
            props=hyperpod_props(config),
            trainer_image=self.trainer_image,
            eks_cluster_arn=self.eks.cluster_arn,
            security_group_id=self.eks.security_group_id,
            vpc=network.vpc,
            subnets=network.private_subnets,
            depends_on=ready,
        )
        if self.hyperpod.resource is not None:
            # HyperPod reads its scripts when the first node starts: they must be uploaded.
            self.hyperpod.resource.node.add_dependency(storage.lifecycle_deployment)
            if config.install_training_operator:
                self.eks.add_training_operator(
                    hyperpod_cluster_arn=self.hyperpod.cluster_arn, after=self.hyperpod.resource
                )
        if not config.existing_eks_cluster:
            self.eks.add_container_logs()  # an existing cluster ships its logs its own way
        self.reward_fleet = RewardFleet(
            self, "RewardFleet", name_prefix=config.name_prefix, cpu=config.reward_worker_cpu,
            memory_mib=config.reward_worker_memory_mib, vpc=network.vpc, log_key=storage.data_key,
        )  # fmt: skip

        cdk.CfnOutput(self, StackOutput.EKS_CLUSTER_NAME, value=self.eks.cluster_name)
        cdk.CfnOutput(self, StackOutput.HYPER_POD_CLUSTER_NAME, value=self.hyperpod.cluster_name)
        # `mtrl status` counts this group's nodes: the GPU nodes runs pay for.
        cdk.CfnOutput(
            self, StackOutput.HYPER_POD_TRAINING_GROUP_NAME, value=config.training_group.name
        )
        cdk.CfnOutput(
            self,
            StackOutput.REWARD_WORKER_CLUSTER_NAME,
            value=self.reward_fleet.cluster.cluster_name,
        )
        cdk.CfnOutput(
            self,
            StackOutput.REWARD_WORKER_TASK_FAMILY,
            value=self.reward_fleet.task_definition.family,
        )
        cdk.CfnOutput(
            self,
            StackOutput.KUBECONFIG_COMMAND,
            value=cdk.Fn.join(
                "",
                [
                    "aws eks update-kubeconfig --name ",
                    self.eks.cluster_name,
                    " --region ",
                    self.region,
                ],
            ),
        )
