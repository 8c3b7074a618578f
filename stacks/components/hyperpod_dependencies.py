"""AWS's HyperPod Helm chart on the EKS cluster, installed at deploy time before the HyperPod
cluster (what the chart holds and why: stacks/hyperpod_chart.py).

The chart is rendered on the deploying machine while `cdk deploy` publishes assets (a file asset
whose `executable` is stacks/render_hyperpod_chart.py), so synth stays offline; a function of
ours applies the rendering with our Kubernetes client (lambdas/kubernetes/chart_install.py):
no kubectl layer, nothing at run time.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from domain import rig_addons
from lambdas.environment import environment_for
from lambdas.kubernetes.settings import ChartSettings
from stacks import hyperpod_chart, render_hyperpod_chart
from stacks.components.eks import CLUSTER_ADMIN, HyperPodEks
from stacks.components.functions import CUSTOM_RESOURCE, pipeline_function
from stacks.config import PlatformConfig


def chart_request(config: PlatformConfig) -> hyperpod_chart.ChartRequest:
    return hyperpod_chart.ChartRequest(
        kube_version=config.eks_version,
        region=config.region,
        instance_types=tuple(g.instance_type for g in config.hyperpod_instance_groups),
        # A Nova job's trainer is a Kubeflow PyTorchJob (AWS's chart, templates/training.yaml).
        kubeflow_training_operator=(
            config.training_job_kind == "PyTorchJob" or config.nova_group is not None
        ),
        restricted_instance_types=tuple(
            g.instance_type for g in config.hyperpod_instance_groups if g.restricted
        ),
    )


class HyperPodDependencies(Construct):
    """Attributes: `installed` (the custom resource the HyperPod cluster must wait for),
    `request` (what is rendered), `manifest` (the rendering's asset location)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        request: hyperpod_chart.ChartRequest,
        eks: HyperPodEks,
        code: lambda_.Code,
        log_key: kms.IKey,
    ) -> None:
        """`request`: what the chart is rendered for (`chart_request` of the configuration)."""
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.request = request
        argument = self.request.encode()
        renderer = "".join(
            Path(module.__file__).read_text()  # type: ignore[arg-type]
            for module in (hyperpod_chart, render_hyperpod_chart, rig_addons)
        )
        self.manifest = stack.synthesizer.add_file_asset(
            # A new commit, request or renderer (RIG changes included) is a new rendering, hence
            # an Update.
            source_hash=hashlib.sha256((argument + renderer).encode()).hexdigest(),
            executable=[sys.executable, "-m", render_hyperpod_chart.__name__, argument],
            display_name="HyperPod Helm chart (rendered)",
        )
        eks_arn = stack.format_arn(
            service="eks", resource="cluster", resource_name=eks.cluster_name
        )
        function = pipeline_function(
            self,
            "Installer",
            handler="lambdas.kubernetes.chart_install.on_event",
            description="Installs AWS's HyperPod Helm chart on the EKS cluster (custom resource)",
            code=code,
            timeout=cdk.Duration.minutes(10),
            environment=environment_for(
                ChartSettings, eks_cluster=eks.cluster_name, release=hyperpod_chart.RELEASE
            ),
            network=eks.network,
            log_key=log_key,
            invocation=CUSTOM_RESOURCE,
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[
                    stack.format_arn(
                        service="s3",
                        region="",
                        account="",
                        resource=self.manifest.bucket_name,
                        resource_name=self.manifest.object_key,
                    )
                ],
            )
        )
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["eks:DescribeCluster"], resources=[eks_arn])
        )
        # The chart makes namespaces, cluster roles and DaemonSets: cluster admin. Only
        # CloudFormation invokes this function.
        access = eks.grant_access(
            "ChartInstallerAccess",
            principal_arn=function.role.role_arn,
            policy=CLUSTER_ADMIN,  # type: ignore[union-attr]
        )
        self.installed = cdk.CustomResource(
            self,
            "Chart",
            service_token=function.function_arn,
            resource_type="Custom::HyperPodHelmChart",
            service_timeout=cdk.Duration.minutes(15),
            properties={
                "Manifest": {"Bucket": self.manifest.bucket_name, "Key": self.manifest.object_key},
                "Commit": hyperpod_chart.COMMIT,
            },
        )
        self.installed.node.add_dependency(access)
        # The add-ons on the nodes (vpc-cni, coredns) first: the chart's pods need them, and
        # restricted groups need copies of them made from what the add-ons installed.
        for dependency in eks.ready:
            self.installed.node.add_dependency(dependency)
